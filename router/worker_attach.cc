#include "router/worker_attach.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>

#include <glog/logging.h>

#include "common/token.h"
#include "router/worker_protocol.h"
#include "wire/handshake.h"

namespace hiber::router {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using nlohmann::json;

std::string unix_peer(int fd) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) return "unix (pid ?)";
  return str_cat("unix (pid ", cred.pid, ", uid ", cred.uid, ")");
}

// Why a hello is not acceptable, or empty.
std::string check_hello(const json& header, const std::string& token) {
  const std::string type = header.value("type", "");
  if (type != "hello") return "expected a hello, got a frame of type \"" + type + "\"";
  if (auto protocol = header.find("protocol");
      protocol != header.end() && (!protocol->is_number_integer() || *protocol != 1)) {
    return "protocol " + protocol->dump() + " is not 1";
  }
  auto presented = header.find("token");
  if (presented == header.end() || !presented->is_string()) {
    return "no worker token in its hello (HIBER_WORKER_TOKEN_FILE)";
  }
  if (!tokens_equal(presented->get<std::string>(), token)) return "a wrong worker token";
  auto function = header.find("function");
  if (function == header.end() || !function->is_string() || function->empty()) {
    return "its hello names no function (HIBER_FUNCTION_ID)";
  }
  if (auto run_dir = header.find("run_dir"); run_dir != header.end() && !run_dir->is_string()) {
    return "its hello's run_dir is not a string";
  }
  if (auto instance = header.find("instance"); instance != header.end()) {
    if (!instance->is_string()) return "its hello's instance is not a string";
    if (Status valid = wire::check_instance_key(instance->get<std::string>(), "its hello");
        !valid.ok()) {
      return valid.message();
    }
  }
  return "";
}

}  // namespace

struct AttachListener::Pending {
  explicit Pending(asio::io_context& io, Socket s, std::string p)
      : socket(std::move(s)), peer(std::move(p)), timer(io) {}
  Socket socket;
  std::string peer;
  asio::steady_timer timer;
  WorkerFrameReader reader;
  std::array<char, 4096> buffer{};
};

AttachListener::AttachListener(asio::io_context& io, AttachOptions options, OnHello on_hello)
    : io_(io),
      options_(std::move(options)),
      on_hello_(std::move(on_hello)),
      unix_acceptor_(io),
      tcp_acceptor_(io) {}

AttachListener::~AttachListener() {
  *alive_ = false;
  error_code ignored;
  if (unix_acceptor_.is_open()) {
    unix_acceptor_.close(ignored);
    ::unlink(options_.unix_path.c_str());
  }
  tcp_acceptor_.close(ignored);
}

Result<std::unique_ptr<AttachListener>> AttachListener::create(asio::io_context& io,
                                                               AttachOptions options,
                                                               OnHello on_hello) {
  std::unique_ptr<AttachListener> listener(
      new AttachListener(io, std::move(options), std::move(on_hello)));
  const AttachOptions& o = listener->options_;
  const int backlog = static_cast<int>(std::min<size_t>(o.max_pending, SOMAXCONN));
  error_code ec;
  if (!o.unix_path.empty()) {
    ::unlink(o.unix_path.c_str());
    asio::local::stream_protocol::endpoint endpoint(o.unix_path);
    listener->unix_acceptor_.open(endpoint.protocol(), ec);
    if (!ec) listener->unix_acceptor_.bind(endpoint, ec);
    // Workers in other containers may run as other users: the token is what they prove.
    if (!ec && ::chmod(o.unix_path.c_str(), 0666) != 0) {
      ec = error_code(errno, boost::system::system_category());
    }
    if (!ec) listener->unix_acceptor_.listen(backlog, ec);
    if (ec) {
      return error(ErrorCode::kOperatingSystem, "worker attach socket ", o.unix_path, ": ",
                   ec.message());
    }
    listener->accept_unix();
  }
  if (!o.tcp_listen.empty()) {
    const size_t colon = o.tcp_listen.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return error(ErrorCode::kInvalidValue, "worker attach address \"", o.tcp_listen,
                   "\" is not HOST:PORT");
    }
    std::string host = o.tcp_listen.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    asio::ip::tcp::resolver resolver(io);
    auto endpoints = resolver.resolve(host, o.tcp_listen.substr(colon + 1),
                                      asio::ip::tcp::resolver::passive, ec);
    if (ec || endpoints.empty()) {
      return error(ErrorCode::kInvalidValue, "worker attach address \"", o.tcp_listen,
                   "\": ", ec ? ec.message() : "no address");
    }
    const asio::ip::tcp::endpoint endpoint = endpoints.begin()->endpoint();
    auto& acceptor = listener->tcp_acceptor_;
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(backlog, ec);
    if (ec) {
      return error(ErrorCode::kOperatingSystem, "worker attach address ", o.tcp_listen, ": ",
                   ec.message());
    }
    listener->accept_tcp();
  }
  return listener;
}

uint16_t AttachListener::tcp_port() const {
  error_code ec;
  return tcp_acceptor_.is_open() ? tcp_acceptor_.local_endpoint(ec).port() : 0;
}

void AttachListener::accept_unix() {
  unix_acceptor_.async_accept([this, alive = std::weak_ptr<bool>(alive_)](
                                  error_code ec, asio::local::stream_protocol::socket peer) {
    if (alive.expired() || ec == asio::error::operation_aborted) return;
    if (ec) {
      LOG(WARNING) << "worker attach socket: accept: " << ec.message();
      return retry_later([this] { accept_unix(); });
    }
    std::string who = unix_peer(peer.native_handle());
    admit(Socket(std::move(peer)), std::move(who));
    accept_unix();
  });
}

void AttachListener::accept_tcp() {
  tcp_acceptor_.async_accept(
      [this, alive = std::weak_ptr<bool>(alive_)](error_code ec, asio::ip::tcp::socket peer) {
        if (alive.expired() || ec == asio::error::operation_aborted) return;
        if (ec) {
          LOG(WARNING) << "worker attach listener: accept: " << ec.message();
          return retry_later([this] { accept_tcp(); });
        }
        error_code ignored;
        const auto remote = peer.remote_endpoint(ignored);
        peer.set_option(asio::ip::tcp::no_delay(true), ignored);
        admit(Socket(std::move(peer)),
              str_cat("tcp ", remote.address().to_string(), ":", remote.port()));
        accept_tcp();
      });
}

void AttachListener::retry_later(std::function<void()> accept) {
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
  timer->async_wait(
      [timer, accept = std::move(accept), alive = std::weak_ptr<bool>(alive_)](error_code ec) {
        if (!ec && !alive.expired()) accept();
      });
}

void AttachListener::admit(Socket socket, std::string peer) {
  if (pending_.size() >= options_.max_pending) {
    LOG(WARNING) << "worker attach from " << peer << " refused: " << pending_.size()
                 << " connections already wait for their hello (--worker_attach_max_pending)";
    error_code ignored;
    socket.close(ignored);
    return;
  }
  const uint64_t id = next_id_++;
  auto pending = std::make_unique<Pending>(io_, std::move(socket), std::move(peer));
  pending->timer.expires_after(options_.hello_timeout);
  pending->timer.async_wait([this, id, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
    if (ec || alive.expired()) return;
    refuse(id, str_cat("no hello within ", options_.hello_timeout.count(),
                       " ms (--worker_hello_timeout_ms)"));
  });
  pending_.emplace(id, std::move(pending));
  read_hello(id);
}

void AttachListener::read_hello(uint64_t id) {
  Pending& pending = *pending_.at(id);
  pending.socket.async_read_some(
      asio::buffer(pending.buffer),
      [this, id, alive = std::weak_ptr<bool>(alive_)](error_code ec, size_t n) {
        if (alive.expired()) return;
        auto it = pending_.find(id);
        if (it == pending_.end()) return;  // refused (timed out) meanwhile
        Pending& pending = *it->second;
        if (ec) {
          return refuse(id, ec == asio::error::eof ? "it closed the connection before its hello"
                                                   : "read: " + ec.message());
        }
        std::string_view bytes(pending.buffer.data(), n);
        bytes.remove_prefix(pending.reader.feed(bytes));
        if (!pending.reader.error().ok()) {
          return refuse(id, "a bad hello: " + pending.reader.error().message());
        }
        if (!pending.reader.complete()) return read_hello(id);
        on_hello_frame(id, bytes);
      });
}

void AttachListener::on_hello_frame(uint64_t id, std::string_view extra) {
  auto it = pending_.find(id);
  Pending& pending = *it->second;
  const WorkerFrame frame = pending.reader.take();
  if (std::string why = check_hello(frame.header, options_.token); !why.empty()) {
    return refuse(id, why);
  }
  // A worker sends nothing after its hello until it gets an invoke.
  if (!extra.empty() || !frame.body.empty()) return refuse(id, "bytes after its hello");
  AttachHello hello;
  hello.function = frame.header.at("function").get<std::string>();
  hello.run_dir = frame.header.value("run_dir", "");
  hello.instance = frame.header.value("instance", "");
  hello.peer = pending.peer;
  std::unique_ptr<Pending> taken = std::move(it->second);
  pending_.erase(it);
  taken->timer.cancel();
  const std::string peer = hello.peer;
  if (std::optional<std::string> why = on_hello_(std::move(hello), taken->socket)) {
    LOG(WARNING) << "worker attach from " << peer << " refused: " << *why;
    error_code ignored;
    taken->socket.close(ignored);
  }
}

void AttachListener::refuse(uint64_t id, const std::string& why) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  LOG(WARNING) << "worker attach from " << it->second->peer << " refused: " << why;
  error_code ignored;
  it->second->timer.cancel();
  it->second->socket.close(ignored);
  pending_.erase(it);
}

}  // namespace hiber::router
