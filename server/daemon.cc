#include "server/daemon.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include <capnp/message.h>
#include <glog/logging.h>

#include "common/node_config_capnp.h"
#include "common/paths.h"
#include "server/control_service.h"
#include "server/session.h"
#include "wire/handshake.h"
#include "wire/status_pages.h"

namespace hiber::server {
namespace proto = wire::proto;

namespace {

constexpr auto kSweepInterval = std::chrono::milliseconds(250);
// How long accepting pauses after an error such as running out of file descriptors.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

Result<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return error(ErrorCode::kInvalidValue, "socket path too long (", path.size(),
                 " bytes): ", path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// A live socket at `path` means another hiberd serves it, which is an error rather than
// something to steal. A hiberd killed a moment ago still looks live for a while: the kernel tears
// its io_uring down after the process, and until then the ring's pending accept holds the
// listening socket open. So a socket that accepts is probed again until kServedProbeWindow has
// passed before it counts as served.
constexpr std::chrono::milliseconds kServedProbeWindow{3000};

Status check_not_served(const std::string& path) {
  HIBER_ASSIGN_OR_RETURN(sockaddr_un addr, unix_address(path));
  const auto deadline = std::chrono::steady_clock::now() + kServedProbeWindow;
  while (true) {
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!probe || ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return Status();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return error(ErrorCode::kIllegalState, "another hiberd is already serving ", path);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Binds a listening Unix socket at `path`. A stale socket file (nobody accepting) is replaced;
// a live one is refused (check_not_served).
Result<UniqueFd> listen_unix(const std::string& path, mode_t mode) {
  HIBER_RETURN_IF_ERROR(check_not_served(path));
  HIBER_ASSIGN_OR_RETURN(sockaddr_un addr, unix_address(path));
  ::unlink(path.c_str());

  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return os_error("socket", errno);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return os_error("bind " + path, errno);
  }
  if (::chmod(path.c_str(), mode) != 0) return os_error("chmod " + path, errno);
  if (::listen(fd.get(), 512) != 0) return os_error("listen " + path, errno);
  return fd;
}

struct TcpListener {
  UniqueFd fd;
  uint16_t port = 0;
};

// Binds a listening TCP socket at "host:port" (an empty host: every address; port 0: any free
// port), to the first of the host's addresses that takes it.
Result<TcpListener> listen_tcp(const std::string& address) {
  HIBER_ASSIGN_OR_RETURN(wire::HostPort where, wire::split_host_port(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(),
                               std::to_string(where.port).c_str(), &hints, &found);
  if (rc != 0) {
    return error(ErrorCode::kInvalidValue, "cannot resolve ", address, ": ", ::gai_strerror(rc));
  }
  Status last(ErrorCode::kInvalidValue, "no address for " + address);
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last = os_error("socket", errno);
      continue;
    }
    // A restarted hiberd can bind its port while the last one's connections are in TIME_WAIT.
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = os_error("bind " + address, errno);
      continue;
    }
    if (::listen(fd.get(), 512) != 0) {
      last = os_error("listen " + address, errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      last = os_error("getsockname", errno);
      continue;
    }
    ::freeaddrinfo(found);
    const uint16_t port = bound.ss_family == AF_INET6
                              ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port;
    return TcpListener{std::move(fd), ntohs(port)};
  }
  ::freeaddrinfo(found);
  return last;
}

// "address:port" of a TCP peer, for the log.
std::string tcp_peer(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof peer;
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0) {
    ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), length, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV);
  }
  return std::string(host) + ":" + port;
}

bool uid_allowed(const std::vector<uid_t>& allowed, uid_t uid) {
  return std::find(allowed.begin(), allowed.end(), uid) != allowed.end();
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// A nonzero random number: two runs of hiberd never share one in practice.
uint64_t draw_incarnation() {
  std::random_device random;
  uint64_t drawn = 0;
  while (drawn == 0) drawn = (uint64_t{random()} << 32) ^ random();
  return drawn;
}

}  // namespace

struct Daemon::Connection {
  // kAnswering: a control request is with the control service (never idle, whatever it waits
  // for: requestStart waits for a GPU).
  enum class State { kReading, kAnswering, kSending, kLive, kClosing };

  uint64_t id = 0;
  bool control = false;
  bool tcp = false;            // the TCP control listener's: no peer credentials
  bool authenticated = false;  // control: has sent a request with the right control token
  std::string remote;          // tcp: the peer's address, for the log
  std::string peer_key;        // counted in pending_by_peer_ under this key; "" when not
  State state = State::kReading;
  UniqueFd fd;
  PeerCredentials peer;
  std::chrono::steady_clock::time_point accepted;
  std::chrono::steady_clock::time_point idle_since;  // control: since its last reply
  bool late = false;    // still without a Hello, past the deadline, at the last sweep
  bool refusing = false;  // its refusal is being sent (counted in refusing_)
  int outstanding = 0;  // io_uring operations in flight

  wire::FrameReader reader;
  std::array<std::byte, 4096> buffer{};
  std::vector<std::byte> out;
  size_t sent = 0;  // bytes of `out` the socket has taken
  iovec iov{};
  msghdr msg{};
  alignas(cmsghdr) char cmsg[CMSG_SPACE(sizeof(int))] = {};

  std::unique_ptr<Session> session;
  bool session_running = false;
  std::string resume_token;  // the session's, when the store keeps it
};

Result<std::unique_ptr<Daemon>> Daemon::create(device::Device& device, DaemonOptions options) {
  if (options.auth_token.empty()) {
    return Status(ErrorCode::kInvalidValue, "an auth token is required");
  }
  if (!options.control_tcp_listen.empty() && options.control_token.empty()) {
    return Status(ErrorCode::kInvalidValue,
                  "a TCP control listener needs a control token (--control_token_file)");
  }
  if (device.gpu_count() == 0) return Status(ErrorCode::kNoDevice, "the device has no GPUs");
  if (options.control_token.empty()) {
    return Status(ErrorCode::kInvalidValue, "a control token is required");
  }
  if (tokens_equal(options.control_token, options.auth_token)) {
    return Status(ErrorCode::kInvalidValue,
                  "the control token must differ from the functions' auth token: a function "
                  "must not be able to act as the operator");
  }
  if (options.max_pending_per_peer == 0 || options.max_pending_connections == 0) {
    return Status(ErrorCode::kInvalidValue, "the pending-connection caps must be positive");
  }
  auto loop = IoLoop::create(options.io_queue_depth, options.io_completion_entries);
  if (!loop.ok()) return loop.status();
  // The GPUs first (the elbow measurement, the pools): the sockets appear once hiberd can serve.
  // A hiberd already serving the node holds its GPUs, so say that rather than "out of memory".
  HIBER_RETURN_IF_ERROR(check_not_served(options.socket_path));
  HIBER_RETURN_IF_ERROR(check_not_served(options.control_socket_path));
  // What an earlier hiberd kept, before anything takes the address ranges it gave its sessions.
  std::unique_ptr<SessionStore> store;
  if (!options.state_dir.empty()) {
    auto opened = SessionStore::open(
        device, SessionStoreOptions{options.state_dir, options.resume_window});
    if (!opened.ok()) return opened.status().with_context("the state directory (--state_dir)");
    store = std::move(opened).value();
    options.controller.repository.directory = store->repository_directory();
    options.controller.repository.file_prefix = store->file_prefix();
    SessionStore* kept = store.get();
    options.controller.registered = [kept](const Registration& r) { kept->save_registration(r); };
    options.controller.unregistered = [kept](const std::string& function_id) {
      kept->forget_registration(function_id);
    };
  }
  auto controller = Controller::create(device, options.controller);
  if (!controller.ok()) return controller.status();
  if (store) {
    // The functions the hiberd before knew, before their sessions come back.
    for (const Registration& r : store->registrations()) {
      std::promise<Status> done;
      (*controller)->register_function(r, [&](Result<Controller::Ok> ok) {
        done.set_value(ok.status());
      });
      Status registered = done.get_future().get();
      LOG_IF(WARNING, !registered.ok())
          << "registering '" << r.function_id << "' again: " << registered;
    }
    if (!store->registrations().empty()) {
      LOG(INFO) << "registered again the " << store->registrations().size()
                << " functions the hiberd before knew";
    }
  }
  TcpListener tcp;
  if (!options.control_tcp_listen.empty()) {
    auto listener = listen_tcp(options.control_tcp_listen);
    if (!listener.ok()) return listener.status().with_context("the TCP control listener");
    tcp = std::move(listener).value();
  }
  auto functions = listen_unix(options.socket_path, 0666);
  if (!functions.ok()) return functions.status();
  auto control = listen_unix(options.control_socket_path, 0600);
  if (!control.ok()) return control.status();

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  UniqueFd signal_fd(::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd) return os_error("signalfd", errno);

  std::unique_ptr<Daemon> daemon(
      new Daemon(device, std::move(options), std::move(controller).value(), std::move(loop).value(),
                 std::move(functions).value(), std::move(control).value(), std::move(tcp.fd),
                 tcp.port, std::move(signal_fd)));
  daemon->store_ = std::move(store);
  if (Status metrics = daemon->start_metrics(); !metrics.ok()) {
    // Nobody will serve the sockets: leave no stale files behind.
    ::unlink(daemon->options_.socket_path.c_str());
    ::unlink(daemon->options_.control_socket_path.c_str());
    return metrics;
  }
  return daemon;
}

Status Daemon::start_metrics() {
  if (options_.metrics_listen.empty()) return Status();
  HIBER_ASSIGN_OR_RETURN(metrics_, MetricsExporter::create(options_.metrics_listen, [this] {
                           return status_for_metrics();
                         }));
  LOG(INFO) << "hiberd serves /metrics on port " << metrics_->port()
            << " (--metrics_listen=" << options_.metrics_listen << ")";
  if (!options_.metrics_port_file.empty()) {
    HIBER_RETURN_IF_ERROR(write_port_file(options_.metrics_port_file, metrics_->port()));
  }
  return Status();
}

Daemon::Daemon(device::Device& device, DaemonOptions options,
               std::unique_ptr<Controller> controller, std::unique_ptr<IoLoop> loop,
               UniqueFd function_listener, UniqueFd control_listener, UniqueFd control_tcp_listener,
               uint16_t control_tcp_port, UniqueFd signal_fd)
    : device_(device),
      options_(std::move(options)),
      controller_(std::move(controller)),
      module_cache_(device, options_.max_module_bytes),
      contexts_(device, options_.isolation, options_.contexts_ready_per_gpu),
      control_(std::make_unique<ControlService>(device, *controller_, module_cache_,
                                                [this] { return daemon_report(); })),
      loop_(std::move(loop)),
      function_listener_(std::move(function_listener)),
      control_listener_(std::move(control_listener)),
      control_tcp_listener_(std::move(control_tcp_listener)),
      control_tcp_port_(control_tcp_port),
      signal_fd_(std::move(signal_fd)),
      started_(std::chrono::steady_clock::now()),
      incarnation_(draw_incarnation()) {}

Daemon::~Daemon() {
  // Scrapes first: they post to the loop and read the controller.
  metrics_.reset();
  // run() normally leaves nothing behind; this covers a Daemon destroyed without running.
  for (auto& [id, connection] : connections_) {
    if (connection->session) {
      connection->session->close("hiberd is exiting");
      connection->session->join();
      if (connection->session_running) controller_->detach(connection->session->id());
    }
  }
  // The controller before the loop: its last replies are posted to the loop. (The sessions gave
  // their memory back when they ended.)
  controller_.reset();
  // The loop first: it cancels and drains its operations while the buffers they point into
  // (connections, the signal buffer) still exist.
  loop_.reset();
}

void Daemon::stop() {
  loop_->post([this] { begin_shutdown("stop requested"); });
}

Status Daemon::run() {
  arm_accept(Listener::kFunction);
  arm_accept(Listener::kControl);
  if (control_tcp_listener_) arm_accept(Listener::kControlTcp);
  arm_signals();
  loop_->timeout(kSweepInterval, [this](int, bool) { sweep_handshakes(); });
  LOG(INFO) << "hiberd serving functions on " << options_.socket_path << " and control on "
            << options_.control_socket_path
            << (control_tcp_listener_
                    ? " and TCP port " + std::to_string(control_tcp_port_) + " (with the token)"
                    : std::string())
            << " (" << device_.backend_name() << " device, " << device_.gpu_count() << " GPUs)";
  Status status = loop_->run();
  loop_done_ = true;
  // Nothing answers scrapes any more: stop listening (waits for a scrape in progress, which
  // sees loop_done_ and gives up).
  metrics_.reset();
  LOG(INFO) << "hiberd stopped: " << counters_.sessions_opened << " sessions served";
  return status;
}

void Daemon::arm_accept(Listener listener) {
  int fd = function_listener_.get();
  IoLoop::OpId* op = &accept_op_;
  const char* socket = "function";
  if (listener == Listener::kControl) {
    fd = control_listener_.get();
    op = &control_accept_op_;
    socket = "control";
  } else if (listener == Listener::kControlTcp) {
    fd = control_tcp_listener_.get();
    op = &control_tcp_accept_op_;
    socket = "TCP control";
  }
  *op = loop_->accept_multishot(fd, [this, listener, socket](int result, bool more) {
    if (result >= 0) {
      on_accept(result, listener);
    } else {
      if (result == -ECANCELED || shutting_down_) return;
      if (result == -EBADF || result == -EINVAL || result == -ENOTSOCK) {
        LOG(ERROR) << "the " << socket << " socket is unusable: " << std::strerror(-result);
        begin_shutdown("a listening socket failed");
        return;
      }
      // Out of descriptors or memory: clients wait in the listen backlog until some come back.
      LOG(WARNING) << "accepting on the " << socket << " socket: " << std::strerror(-result)
                   << "; retrying in " << kAcceptRetry.count() << " ms";
    }
    // Without IORING_CQE_F_MORE the kernel has ended the multishot accept (after an error, or
    // on its own, e.g. when its internal state overflowed): arm it again or nobody is accepted.
    if (more || shutting_down_) return;
    if (result >= 0) {
      LOG(WARNING) << "the " << socket
                   << " socket's multishot accept ended (completion queue overflow); accepting "
                      "again";
      arm_accept(listener);
    } else {
      loop_->timeout(kAcceptRetry, [this, listener](int, bool) {
        if (!shutting_down_) arm_accept(listener);
      });
    }
  });
}

void Daemon::arm_signals() {
  loop_->read(signal_fd_.get(), signal_buffer_, [this](int result, bool) {
    if (result <= 0) return;
    auto* info = reinterpret_cast<signalfd_siginfo*>(signal_buffer_.data());
    const char* name = info->ssi_signo == SIGINT ? "SIGINT" : "SIGTERM";
    if (shutting_down_) {
      LOG(ERROR) << name << " again: exiting without waiting for " << live_sessions_ << " sessions";
      std::_Exit(2);
    }
    begin_shutdown(name);
    arm_signals();
  });
}

// ---- Connections ----

void Daemon::on_accept(int fd, Listener listener) {
  auto connection = std::make_unique<Connection>();
  connection->id = next_connection_id_++;
  connection->control = listener != Listener::kFunction;
  connection->tcp = listener == Listener::kControlTcp;
  connection->fd.reset(fd);
  if (connection->tcp) connection->remote = tcp_peer(fd);
  connection->accepted = std::chrono::steady_clock::now();
  connection->idle_since = connection->accepted;
  Connection& c = *connection;
  connections_.emplace(c.id, std::move(connection));

  if (shutting_down_) {
    reject(c, Status(ErrorCode::kDeviceUnavailable, "hiberd is shutting down"));
    return;
  }
  if (connections_.size() - live_sessions_ - refusing_ - proven_control_ >
          options_.max_pending_connections &&
      !drop_oldest_unproven(c, "",
                            str_cat("dropped for a newer connection: more than ",
                                    options_.max_pending_connections,
                                    " connections were waiting to be served and this one had "
                                    "proven nothing yet"))) {
    reject(c, error(ErrorCode::kDeviceUnavailable, "more than ", options_.max_pending_connections,
                    " connections are waiting to be served"));
    return;
  }
  if (c.tcp) {
    if (!count_pending(c, "address " + c.remote.substr(0, c.remote.rfind(':')))) return;
    // No uid to check over TCP: each request proves itself with the control token. Requests
    // and replies are small and each waits for the other, so Nagle's delay would only add
    // latency.
    const int one = 1;
    if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
      PLOG(WARNING) << "TCP_NODELAY on a control connection from " << c.remote;
    }
    receive_frame(c);
    return;
  }
  auto peer = peer_credentials(fd);
  if (!peer.ok()) {
    reject(c, peer.status());
    return;
  }
  c.peer = *peer;
  if (!uid_allowed(options_.allowed_uids, c.peer.uid)) {
    reject(c, error(ErrorCode::kNotPermitted, "uid ", c.peer.uid, " may not use this hiberd"));
    return;
  }
  if (!count_pending(c, "uid " + std::to_string(c.peer.uid))) return;
  receive_frame(c);
}

bool Daemon::count_pending(Connection& connection, std::string peer) {
  if (pending_by_peer_[peer] >= options_.max_pending_per_peer &&
      !drop_oldest_unproven(connection, peer,
                            str_cat("dropped for a newer connection: ", peer, " holds ",
                                    options_.max_pending_per_peer,
                                    " connections waiting to be served (the most one peer may "
                                    "hold) and this one had proven nothing yet"))) {
    reject(connection,
           error(ErrorCode::kDeviceUnavailable, peer, " already holds ", pending_by_peer_[peer],
                 " connections waiting to be served (the most one peer may hold)"));
    return false;
  }
  ++pending_by_peer_[peer];
  connection.peer_key = std::move(peer);
  return true;
}

bool Daemon::drop_oldest_unproven(const Connection& newcomer, std::string_view peer_key,
                                  const std::string& why) {
  // (A crowd of functions starting at once loses as many connections this way as by refusing
  // the newest: one for each past the cap. A squatter loses its own.)
  Connection* oldest = nullptr;
  for (auto& [id, c] : connections_) {
    if (c.get() == &newcomer || c->refusing || c->state != Connection::State::kReading) continue;
    if (c->session != nullptr || (c->control && c->authenticated)) continue;
    if (c->peer_key.empty() || (!peer_key.empty() && c->peer_key != peer_key)) continue;
    if (oldest == nullptr || c->id < oldest->id) oldest = c.get();
  }
  if (oldest == nullptr) return false;
  reject(*oldest, Status(ErrorCode::kDeviceUnavailable, why));
  return true;
}

void Daemon::uncount_pending(Connection& connection) {
  if (connection.peer_key.empty()) return;
  auto it = pending_by_peer_.find(connection.peer_key);
  if (--it->second == 0) pending_by_peer_.erase(it);
  connection.peer_key.clear();
}

IoLoop::Handler Daemon::track(Connection& connection,
                              std::function<void(Connection&, int)> handler) {
  ++connection.outstanding;
  return [this, id = connection.id, handler = std::move(handler)](int result, bool more) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = *it->second;
    if (!more) --c.outstanding;
    if (c.state != Connection::State::kClosing) handler(c, result);
    // The handler may have closed and forgotten the connection: look it up again.
    it = connections_.find(id);
    if (it != connections_.end()) maybe_forget(*it->second);
  };
}

void Daemon::receive_frame(Connection& connection) {
  connection.state = Connection::State::kReading;
  loop_->recv(
      connection.fd.get(), connection.buffer, track(connection, [this](Connection& c, int n) {
        // The connection may have been refused meanwhile (a time-out, shutdown); then this read is
        // only the socket shutting down.
        if (c.state != Connection::State::kReading) return;
        if (n <= 0) {
          close_connection(c, n == 0 ? "peer closed the connection" : std::strerror(-n));
          return;
        }
        std::span<const std::byte> bytes(c.buffer.data(), static_cast<size_t>(n));
        size_t used = c.reader.feed(bytes);
        if (!c.reader.error().ok()) {
          ++counters_.malformed_messages;
          reject(c, c.reader.error());
          return;
        }
        if (!c.reader.complete()) {
          receive_frame(c);
          return;
        }
        if (used != bytes.size()) {
          ++counters_.malformed_messages;
          reject(c, Status(ErrorCode::kInvalidValue,
                           "bytes after the request: send one message and wait for the answer"));
          return;
        }
        if (c.control) {
          on_control_request(c);
        } else {
          on_hello(c);
        }
      }));
}

void Daemon::send_frame(Connection& connection, std::vector<std::byte> frame, int attach_fd,
                        std::function<void(Connection&)> then) {
  connection.state = Connection::State::kSending;
  connection.out = std::move(frame);
  connection.sent = 0;
  connection.msg = {};
  if (attach_fd >= 0) {
    connection.msg.msg_control = connection.cmsg;
    connection.msg.msg_controllen = sizeof connection.cmsg;
    cmsghdr* cm = CMSG_FIRSTHDR(&connection.msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &attach_fd, sizeof(int));
  }
  send_rest(connection, std::move(then));
}

// A socket, Unix or TCP, may take a frame (a large status reply) in parts: each completion sends
// what is left, so a short sendmsg never cuts a reply.
void Daemon::send_rest(Connection& connection, std::function<void(Connection&)> then) {
  connection.iov = {connection.out.data() + connection.sent,
                    connection.out.size() - connection.sent};
  connection.msg.msg_iov = &connection.iov;
  connection.msg.msg_iovlen = 1;
  loop_->sendmsg(connection.fd.get(), &connection.msg,
                 track(connection, [this, then = std::move(then)](Connection& c, int n) {
                   if (n <= 0) {
                     close_connection(c, n < 0 ? std::strerror(-n) : "the socket took nothing");
                     return;
                   }
                   c.sent += static_cast<size_t>(n);
                   if (c.sent < c.out.size()) {
                     // An attached descriptor went with the first byte.
                     c.msg.msg_control = nullptr;
                     c.msg.msg_controllen = 0;
                     send_rest(c, then);
                     return;
                   }
                   then(c);
                 }));
}

void Daemon::reject(Connection& connection, const Status& why) {
  ++counters_.handshakes_rejected;
  // No longer pending: a crowd being refused takes no slot from the next connection.
  uncount_pending(connection);
  if (!connection.refusing) {
    connection.refusing = true;
    ++refusing_;
  }
  if (connection.tcp) {
    LOG(WARNING) << "TCP control connection from " << connection.remote << " refused: " << why;
  } else {
    LOG(WARNING) << (connection.control ? "control" : "function") << " connection from pid "
                 << connection.peer.pid << " uid " << connection.peer.uid << " refused: " << why;
  }
  // Each socket refuses in its own protocol, so the client reads the reason as it reads answers.
  auto frame =
      connection.control ? ControlService::error_frame(why) : wire::encode_rejection_frame(why);
  if (!frame.ok() || !connection.fd) {
    close_connection(connection, why.message());
    return;
  }
  send_frame(connection, std::move(frame).value(), -1,
             [this, why](Connection& c) { close_connection(c, why.message()); });
}

void Daemon::close_connection(Connection& connection, std::string_view why) {
  if (connection.state != Connection::State::kClosing) {
    VLOG(1) << "connection " << connection.id << " closing: " << why;
    connection.state = Connection::State::kClosing;
    // Completes every operation still pending on the socket.
    ::shutdown(connection.fd.get(), SHUT_RDWR);
  }
  if (connection.session && connection.session_running) connection.session->close(why);
  maybe_forget(connection);
}

void Daemon::maybe_forget(Connection& connection) {
  if (connection.state != Connection::State::kClosing || connection.outstanding > 0 ||
      connection.session_running) {
    return;
  }
  if (connection.session) {
    // A session created but never started (its Welcome could not be sent): it never opened,
    // so it is not counted as closed either.
    controller_->withdraw(connection.session->identity().function_id, connection.session->id());
    connection.session.reset();
    --live_sessions_;
  }
  uncount_pending(connection);
  if (connection.refusing) --refusing_;
  if (connection.control && connection.authenticated) --proven_control_;
  connections_.erase(connection.id);
  maybe_finish_shutdown();
}

// ---- Handshake and sessions ----

Status Daemon::admit(const wire::Hello& hello) const {
  const wire::ProtocolVersion ours = wire::current_protocol_version();
  if (hello.version.major != ours.major) {
    return error(ErrorCode::kNotSupported, "protocol ", hello.version.major, ".",
                 hello.version.minor, " is not supported; this hiberd speaks ", ours.major, ".",
                 ours.minor);
  }
  if (!tokens_equal(hello.auth_token, options_.auth_token)) {
    return Status(ErrorCode::kNotPermitted, "wrong auth token");
  }
  if (shutting_down_) return Status(ErrorCode::kDeviceUnavailable, "hiberd is shutting down");
  if (live_sessions_ >= options_.max_sessions) {
    return error(ErrorCode::kDeviceUnavailable, "hiberd already serves ", live_sessions_,
                 " sessions (the maximum)");
  }
  return Status();
}

void Daemon::on_hello(Connection& connection) {
  auto hello = wire::decode_hello(connection.reader.message());
  if (!hello.ok()) {
    ++counters_.malformed_messages;
    reject(connection, hello.status());
    return;
  }
  Status admitted = admit(*hello);
  if (!admitted.ok()) {
    reject(connection, admitted);
    return;
  }
  std::shared_ptr<const RecoveredSession> recovered;
  if (!hello->resume_token.empty()) {
    auto claimed = claim_resumed(*hello);
    if (!claimed.ok()) {
      if (!hello->instance.empty()) {
        // Its process is lost to the GPU for good: a router replaces it.
        constexpr size_t kKeptRefusals = 1024;
        if (refused_resumes_.size() == kKeptRefusals) refused_resumes_.pop_front();
        refused_resumes_.push_back(hello->instance);
      }
      reject(connection, claimed.status());
      return;
    }
    recovered = std::move(claimed).value();
  }
  // A claimed session's address range is this daemon's until its FunctionMemory adopts it.
  auto give_up_claim = [&] {
    if (!recovered) return;
    Status freed = device_.free_address_range(recovered->who.va_base, recovered->who.va_bytes);
    LOG_IF(ERROR, !freed.ok()) << "resuming '" << hello->function_id << "': " << freed;
    store_->finish_claim(hello->resume_token);
  };
  auto plan = controller_->admit(
      hello->function_id, hello->instance,
      recovered ? recovered->who.quota_bytes : hello->requested_quota_bytes, next_session_id_);
  if (!plan.ok()) {
    give_up_claim();
    reject(connection, plan.status());
    return;
  }
  SessionConfig config;
  config.instance = plan->instance;
  config.quota_bytes = plan->quota_bytes;
  // Room around the quota for the client's placement to fragment, and for reservations of
  // client virtual memory (--session_va_factor).
  config.va_bytes =
      std::max<uint64_t>(round_up(static_cast<uint64_t>(static_cast<double>(config.quota_bytes) *
                                                        options_.session_va_factor),
                                  1 << 21),
                         64 << 20);
  config.channel = options_.channel;
  config.implicit_lease_idle = options_.implicit_lease_idle;
  config.limits = options_.session_limits;
  config.memory = plan->memory;
  config.kernel_deadline = plan->kernel_deadline;
  std::string token;
  if (store_) {
    auto made = SessionStore::new_token();
    if (!made.ok()) {
      give_up_claim();
      controller_->withdraw(hello->function_id, next_session_id_);
      reject(connection, made.status().with_context("cannot open a session"));
      return;
    }
    token = std::move(made).value();
    if (recovered) {
      config.reserved_va = recovered->who.va_base;
      config.va_bytes = recovered->who.va_bytes;
    }
    // Once its first request fixes the model, the session is kept.
    StoredSession who{hello->function_id, hello->instance,  0, config.va_bytes,
                      config.quota_bytes,  config.memory.stateful};
    config.model_fixed = [store = store_.get(), token, who](
                             const std::shared_ptr<FunctionMemory>& memory) mutable {
      who.va_base = memory->va_base();
      store->save_later(token, who, memory);
    };
  }
  SessionIdentity identity{next_session_id_, hello->function_id, connection.peer, hello->instance};
  auto session = Session::create(device_, module_cache_, contexts_, controller_->pools(),
                                 controller_->repository(), *controller_, identity, config);
  if (!session.ok()) {
    // A session that failed to be made has freed an adopted range with its memory.
    if (recovered) store_->finish_claim(hello->resume_token);
    controller_->withdraw(hello->function_id, identity.id);
    reject(connection, session.status().with_context("cannot open a session"));
    return;
  }
  wire::SessionInfo welcome = (*session)->welcome();
  welcome.resume_token = token;
  if (recovered) {
    Status restored = restore(**session, *recovered, token, &welcome);
    store_->finish_claim(hello->resume_token);
    if (!restored.ok()) {
      session->reset();
      controller_->withdraw(hello->function_id, identity.id);
      reject(connection, restored.with_context("cannot resume the session"));
      return;
    }
  }
  next_session_id_ = SessionId{next_session_id_.value() + 1};
  ++live_sessions_;
  uncount_pending(connection);
  connection.session = std::move(session).value();
  connection.resume_token = std::move(token);
  auto frame = wire::encode_welcome_frame(welcome);
  if (!frame.ok()) {
    reject(connection, frame.status());
    return;
  }
  send_frame(connection, std::move(frame).value(), connection.session->memfd(),
             [this](Connection& c) { on_welcome_sent(c); });
}

Result<std::shared_ptr<const RecoveredSession>> Daemon::claim_resumed(const wire::Hello& hello) {
  if (!store_) {
    return Status(ErrorCode::kNotFound,
                  "this hiberd keeps no sessions across restarts (--state_dir is empty), so none "
                  "can be resumed");
  }
  return store_->claim(hello.resume_token, hello.function_id, hello.instance);
}

Status Daemon::restore(Session& session, const RecoveredSession& recovered,
                       const std::string& token, wire::SessionInfo* welcome) {
  const std::shared_ptr<FunctionMemory>& memory = session.memory();
  if (memory->va_base() != recovered.who.va_base || memory->va_bytes() != recovered.who.va_bytes) {
    return error(ErrorCode::kIllegalState, "the session's address range is not its old one");
  }
  std::map<uint64_t, Sha256> digests;
  for (const RecoveredSession::Block& block : recovered.blocks) {
    HIBER_RETURN_IF_ERROR(memory->restore_block(block.va, block.contents)
                              .with_context(str_cat("restoring the block at ", hex(block.va))));
    digests.emplace(block.va, block.digest);
    welcome->restored.push_back(wire::DeviceRange{block.va, block.contents.size()});
  }
  memory->mark_model_fixed();
  welcome->resumed = true;
  // Its own record at once (the copies are this hiberd's now; their digests are known), so a
  // second restart finds it too.
  HIBER_ASSIGN_OR_RETURN(std::vector<FunctionMemory::KeptBlock> kept, memory->kept_model(&digests));
  HIBER_RETURN_IF_ERROR(store_->save(token, recovered.who, kept));
  LOG(INFO) << "session " << session.id() << " resumes a session of function '"
            << recovered.who.function_id << "' from before hiberd restarted, with "
            << recovered.blocks.size() << " model blocks";
  return Status();
}

void Daemon::on_welcome_sent(Connection& connection) {
  connection.state = Connection::State::kLive;
  connection.session_running = true;
  ++counters_.sessions_opened;
  const uint64_t id = connection.id;
  // Before it starts: from its first call on, the session may ask for a GPU.
  controller_->attach(connection.session.get());
  LOG(INFO) << "session " << connection.session->id() << " opened for function '"
            << connection.session->snapshot().identity.function_id << "' (pid "
            << connection.peer.pid << ", uid " << connection.peer.uid << ")";
  connection.session->start([this, id] { loop_->post([this, id] { on_session_exit(id); }); });
  // The client never writes after its Hello: readable or hung up both mean it is gone (or broke
  // the protocol), and the session ends.
  loop_->poll(connection.fd.get(), POLLIN | POLLRDHUP,
              track(connection, [this](Connection& c, int result) {
                // Nobody is left to read what the session's queued work would produce.
                if (c.session && c.session_running) c.session->abandon("client disconnected");
                close_connection(c, result < 0 ? std::strerror(-result) : "client disconnected");
              }));
}

void Daemon::on_session_exit(uint64_t connection_id) {
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) return;
  Connection& c = *it->second;
  c.session->join();
  controller_->detach(c.session->id());
  SessionSnapshot last = c.session->snapshot();
  closed_sessions_malformed_ += last.malformed_messages;
  closed_sessions_calls_ += last.calls;
  closed_sessions_batches_ += last.batches;
  closed_sessions_batch_sizes_.add(last.batch_sizes);
  LOG(INFO) << "session " << last.identity.id << " of '" << last.identity.function_id
            << "' ended after " << last.calls << " calls (" << last.failed_calls << " failed)";
  c.session.reset();
  c.session_running = false;
  // Its client went away (or broke the session): nothing will resume it. When hiberd itself
  // stops, its record stays for the next hiberd.
  if (store_ && !c.resume_token.empty() && !shutting_down_) store_->forget(c.resume_token);
  --live_sessions_;
  ++counters_.sessions_closed;
  // If the session ended on its own (a broken ring), the client learns it from the socket.
  close_connection(c, "session ended");
}

// ---- Control ----

void Daemon::on_control_request(Connection& connection) {
  ++counters_.control_requests;
  {
    Status allowed =
        ControlService::check_token(connection.reader.message(), options_.control_token);
    if (!allowed.ok()) {
      if (allowed.code() == ErrorCode::kNotPermitted) {
        ++counters_.control_tokens_refused;
      } else {
        ++counters_.malformed_messages;
      }
      // Answered, then disconnected: a client with the wrong token is misconfigured (or
      // guessing), and must not keep a connection open.
      reject(connection, allowed);
      return;
    }
    if (!connection.authenticated) {
      // Proven: no longer one of its peer's pending connections. A router keeps one per
      // request in flight (a requestStart waits for a GPU), more than any cap on unproven ones
      // should allow, and its idle ones are closed by --control_idle_timeout_ms.
      connection.authenticated = true;
      uncount_pending(connection);
      ++proven_control_;
    }
  }
  connection.state = Connection::State::kAnswering;
  const uint64_t id = connection.id;
  Status read = control_->answer(
      connection.reader.message(),
      [this, id](Result<std::vector<std::byte>> frame) { reply_later(id, std::move(frame)); });
  if (!read.ok()) {
    ++counters_.malformed_messages;
    reject(connection, read);
  }
}

void Daemon::reply_later(uint64_t connection_id, Result<std::vector<std::byte>> frame) {
  loop_->post([this, connection_id, frame = std::move(frame)]() mutable {
    auto it = connections_.find(connection_id);
    if (it == connections_.end()) return;
    Connection& c = *it->second;
    if (c.state == Connection::State::kClosing) return;
    if (!frame.ok()) {
      reject(c, frame.status());
      return;
    }
    send_frame(c, std::move(frame).value(), -1, [this](Connection& c) {
      c.reader.reset();
      c.idle_since = std::chrono::steady_clock::now();
      receive_frame(c);
    });
  });
}

// The collector asks the control service for a status reply exactly as a control request does,
// in process: the request is posted to the loop thread (where daemon_report() may read the
// connections), and the reply frame comes back from the controller's thread. Rather than a
// request over hiberd's own control socket: no connection to itself, no control-request counted
// per scrape, no credentials, and the reply is the very bytes a status request gets.
Result<wire::Message> Daemon::status_for_metrics() {
  std::vector<wire::Message> pages;
  std::optional<uint64_t> offset = 0;
  while (offset) {
    HIBER_ASSIGN_OR_RETURN(wire::Message page, status_page_for_metrics(*offset));
    HIBER_ASSIGN_OR_RETURN(offset, wire::next_status_page(page));
    pages.push_back(std::move(page));
  }
  return wire::merge_status_pages(pages);
}

Result<wire::Message> Daemon::status_page_for_metrics(uint64_t offset) {
  using Frame = Result<std::vector<std::byte>>;
  auto promise = std::make_shared<std::promise<Frame>>();
  std::future<Frame> reply = promise->get_future();
  loop_->post([this, promise, offset] {
    if (shutting_down_) {
      promise->set_value(Status(ErrorCode::kDeviceUnavailable, "hiberd is shutting down"));
      return;
    }
    control_->answer_status([promise](Frame frame) { promise->set_value(std::move(frame)); },
                            wire::control::StatusQuery{offset, wire::kStatusPageFunctions});
  });
  // The loop may stop before it runs the request; a controller that stopped drops the reply
  // (a broken promise).
  while (reply.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (loop_done_) return Status(ErrorCode::kDeviceUnavailable, "hiberd has stopped");
  }
  Frame frame = Status(ErrorCode::kDeviceUnavailable, "hiberd is stopping");
  try {
    frame = reply.get();
  } catch (const std::future_error&) {
    return frame.status();
  }
  if (!frame.ok()) return frame.status();
  // hiberd's own frame, whole: its length prefix, then the message. (Not a FrameReader: that
  // bounds what clients send, far below a status reply.)
  constexpr size_t kPrefix = 4;
  if (frame->size() <= kPrefix) {
    return Status(ErrorCode::kInvalidValue, "the status reply is not one whole frame");
  }
  wire::Message message;
  std::span<std::byte> bytes = message.resize(frame->size() - kPrefix);
  std::memcpy(bytes.data(), frame->data() + kPrefix, bytes.size());
  return message;
}

ControlService::DaemonReport Daemon::daemon_report() const {
  ControlService::DaemonReport report;
  for (const auto& [id, c] : connections_) {
    if (c->session && c->session_running) report.sessions.push_back(c->session->snapshot());
  }
  report.sessions_opened = counters_.sessions_opened;
  report.sessions_closed = counters_.sessions_closed;
  report.handshakes_rejected = counters_.handshakes_rejected;
  report.malformed_messages = counters_.malformed_messages + closed_sessions_malformed_;
  report.remoted_calls = closed_sessions_calls_;
  report.remoted_batches = closed_sessions_batches_;
  report.batch_sizes = closed_sessions_batch_sizes_;
  for (const SessionSnapshot& s : report.sessions) {
    report.malformed_messages += s.malformed_messages;
    report.remoted_calls += s.calls;
    report.remoted_batches += s.batches;
    report.batch_sizes.add(s.batch_sizes);
  }
  report.control_requests = counters_.control_requests;
  report.incarnation = incarnation_;
  report.refused_resumes.assign(refused_resumes_.begin(), refused_resumes_.end());
  report.uptime_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return report;
}

// ---- Time-outs and shutdown ----

// A connection is refused when it is late at two sweeps in a row: when hiberd itself was busy
// (opening many sessions at once), a Hello that did arrive may wait in the completion queue
// behind this sweep, and is handled before the next one. That is the client's slowness, not
// hiberd's, that the time-out punishes.
void Daemon::sweep_handshakes() {
  if (store_) store_->expire();
  const auto now = std::chrono::steady_clock::now();
  std::vector<Connection*> late;
  std::vector<Connection*> idle;
  for (auto& [id, c] : connections_) {
    if (c->state != Connection::State::kReading) continue;
    // Function connections must say Hello in time; TCP control connections must prove they
    // hold the token in time (or anyone who can reach the port could hold connections open).
    // Other control connections (their uid allowed) may wait before each request for no
    // longer than the idle time-out.
    if (!c->control || (c->tcp && !c->authenticated)) {
      if (now - c->accepted > options_.handshake_timeout) {
        if (c->late) late.push_back(c.get());
        c->late = true;
      }
    } else if (now - c->idle_since > options_.control_idle_timeout) {
      idle.push_back(c.get());
    }
  }
  for (Connection* c : late) {
    reject(*c, error(ErrorCode::kTimeout,
                     c->control ? "no control request within " : "no Hello within ",
                     options_.handshake_timeout.count(), " ms"));
  }
  // Closed without a word: an answer nobody asked for would be read as the next reply.
  for (Connection* c : idle) {
    close_connection(*c, "idle for longer than " +
                             std::to_string(options_.control_idle_timeout.count()) + " ms");
  }
  if (!shutting_down_) loop_->timeout(kSweepInterval, [this](int, bool) { sweep_handshakes(); });
}

void Daemon::begin_shutdown(std::string_view why) {
  if (shutting_down_) return;
  shutting_down_ = true;
  LOG(INFO) << "hiberd shutting down (" << why << "): closing " << live_sessions_ << " sessions";
  // The sessions end, but their records and host copies stay for the next hiberd: records
  // still being written are finished first, while their sessions still hold their memory.
  if (store_) {
    controller_->repository().keep_files();
    store_->flush();
  }
  loop_->timeout(options_.shutdown_timeout, [this](int, bool) {
    LOG(ERROR) << live_sessions_ << " sessions did not finish their device work within "
               << options_.shutdown_timeout.count() << " ms; exiting without waiting";
    std::_Exit(2);
  });
  loop_->cancel(accept_op_);
  loop_->cancel(control_accept_op_);
  if (control_tcp_listener_) loop_->cancel(control_tcp_accept_op_);
  ::unlink(options_.socket_path.c_str());
  ::unlink(options_.control_socket_path.c_str());
  std::vector<Connection*> all;
  for (auto& [id, c] : connections_) all.push_back(c.get());
  for (Connection* c : all) {
    if (c->state == Connection::State::kReading && !c->control) {
      reject(*c, Status(ErrorCode::kDeviceUnavailable, "hiberd is shutting down"));
    } else {
      close_connection(*c, "hiberd is shutting down");
    }
  }
  maybe_finish_shutdown();
}

void Daemon::maybe_finish_shutdown() {
  if (shutting_down_ && connections_.empty()) loop_->stop();
}

}  // namespace hiber::server
