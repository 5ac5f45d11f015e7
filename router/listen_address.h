// Opening a TCP listener from a "--listen host:port" flag: the router's HTTP server and the
// admission webhook (containers/webhook) take the same form and give the same errors.
#pragma once

#include <string>

#include <boost/asio/ip/tcp.hpp>

#include "common/status.h"

namespace hiber::router {

// Opens, binds and listens `acceptor` on `listen`: "host:port" or "[v6 address]:port"; an empty
// host is every IPv4 address, port 0 any free port. Errors quote the flag's value.
Status listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& listen);

}  // namespace hiber::router
