#include "router/listen_address.h"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/socket_base.hpp>

namespace hiber::router {

Status listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& listen) {
  namespace asio = boost::asio;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return error(ErrorCode::kInvalidValue, "--listen \"", listen, "\": expected host:port");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  boost::system::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  if (ec) return error(ErrorCode::kInvalidValue, "--listen host \"", host, "\": ", ec.message());
  const std::string port_text = listen.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port_text) > 65535) {
    return error(ErrorCode::kInvalidValue, "--listen \"", listen, "\": bad port");
  }
  const asio::ip::tcp::endpoint endpoint(address, static_cast<uint16_t>(std::stoul(port_text)));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return error(ErrorCode::kOperatingSystem, "cannot listen on ", listen, ": ", ec.message());
  return Status();
}

}  // namespace hiber::router
