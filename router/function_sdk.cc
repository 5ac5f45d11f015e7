#include "router/function_sdk.h"

#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "router/worker_protocol.h"

namespace hiber::function {
namespace {

using nlohmann::json;
using router::encode_worker_frame;

constexpr int kExitEnvironment = 2;
constexpr int kExitProtocol = 3;
constexpr long kMaxConcurrency = 4096;
// Error messages are cut to this, so a result header always stays far below the 64 KiB limit.
constexpr size_t kMaxErrorBytes = 16 << 10;
// An attaching worker retries after 0.1 s, 0.2 s, ... up to this.
constexpr std::chrono::milliseconds kMaxAttachBackoff{5000};
// A connection that lasted this long was accepted: the next retry starts from the shortest wait.
constexpr std::chrono::seconds kAcceptedConnection{1};

void complain(const std::string& message) {
  std::fprintf(stderr, "hiber function worker: %s\n", message.c_str());
  std::fflush(stderr);
}

// The connection to the router. Results are written from several threads; the reading side
// is the serve() loop's alone.
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() { ::close(fd_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }

  // Writes one whole frame. On failure, remembers why and shuts the socket down so that the
  // reading loop wakes up and ends.
  void send(const std::string& frame) {
    std::lock_guard<std::mutex> lock(write_mutex_);
    if (write_errno_ != 0) return;
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        write_errno_ = n < 0 ? errno : EPIPE;
        ::shutdown(fd_, SHUT_RDWR);
        return;
      }
      sent += static_cast<size_t>(n);
    }
  }

  // 0 while every write succeeded.
  int write_errno() {
    std::lock_guard<std::mutex> lock(write_mutex_);
    return write_errno_;
  }

 private:
  const int fd_;
  std::mutex write_mutex_;
  int write_errno_ = 0;
};

// A handler's answer: its Response, its own failure's message, or a client error.
struct Answer {
  std::variant<Response, std::string> result;
  std::optional<unsigned> client_error;  // 400..499 with result holding the message
};

Answer run_handler(const Handler& handler, const Request& request) {
  try {
    return {handler(request), std::nullopt};
  } catch (const ClientError& e) {
    return {std::string(e.what()), e.status()};
  } catch (const std::exception& e) {
    return {std::string("the handler threw: ") + e.what(), std::nullopt};
  } catch (...) {
    return {std::string("the handler threw an exception that is not a std::exception"),
            std::nullopt};
  }
}

std::string result_frame(const std::string& id, Answer answer) {
  if (auto* response = std::get_if<Response>(&answer.result)) {
    if (response->body.size() <= router::kMaxWorkerBodyBytes &&
        (!response->inference_header_bytes ||
         *response->inference_header_bytes <= response->body.size())) {
      json header = {
          {"type", "result"}, {"id", id}, {"ok", true}, {"content_type", response->content_type}};
      if (response->inference_header_bytes) {
        header["inference_header_bytes"] = *response->inference_header_bytes;
      }
      return encode_worker_frame(header, response->body);
    }
    answer.result = response->body.size() > router::kMaxWorkerBodyBytes
                        ? "the answer of " + std::to_string(response->body.size()) +
                              " bytes is larger than the protocol's limit of " +
                              std::to_string(router::kMaxWorkerBodyBytes)
                        : std::string("the answer's inference_header_bytes is past its body");
  }
  std::string message = std::move(std::get<std::string>(answer.result));
  if (message.size() > kMaxErrorBytes) message.resize(kMaxErrorBytes);
  json header = {{"type", "result"}, {"id", id}, {"ok", false}, {"error", message}};
  if (answer.client_error) header["status"] = *answer.client_error;
  return encode_worker_frame(header, {});
}

void answer(Connection& connection, const Handler& handler, const Request& request) {
  connection.send(result_frame(request.id, run_handler(handler, request)));
}

// An invoke frame as a Request, or why it is not one.
std::variant<Request, std::string> parse_invoke(router::WorkerFrame frame) {
  const json& header = frame.header;
  const auto type = header.find("type");
  if (type == header.end() || !type->is_string() || *type != "invoke") {
    return "expected an invoke frame, got the header " +
           header.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  Request request;
  const auto id = header.find("id");
  if (id == header.end() || !id->is_string()) return std::string("an invoke without a string id");
  request.id = id->get<std::string>();
  const auto content_type = header.find("content_type");
  if (content_type != header.end() && !content_type->is_null()) {
    if (!content_type->is_string())
      return "invoke " + request.id + ": content_type is not a string";
    request.content_type = content_type->get<std::string>();
  } else {
    request.content_type = "application/octet-stream";
  }
  const auto deadline = header.find("deadline_ms");
  if (deadline != header.end() && !deadline->is_null()) {
    if (!deadline->is_number()) return "invoke " + request.id + ": deadline_ms is not a number";
    const double ms = deadline->get<double>();
    request.deadline = std::chrono::milliseconds(ms <= 0      ? 0
                                                 : ms >= 1e15 ? static_cast<int64_t>(1e15)
                                                              : static_cast<int64_t>(ms));
  }
  const auto header_bytes = header.find("inference_header_bytes");
  if (header_bytes != header.end() && !header_bytes->is_null()) {
    if (!header_bytes->is_number_unsigned() || header_bytes->get<uint64_t>() > frame.body.size()) {
      return "invoke " + request.id +
             ": inference_header_bytes is not a byte count within the body";
    }
    request.inference_header_bytes = header_bytes->get<uint64_t>();
  }
  request.body = std::move(frame.body);
  return request;
}

// The threads that run requests when $HIBER_CONCURRENCY > 1.
class Pool {
 public:
  Pool(size_t threads, Connection& connection, const Handler& handler) {
    for (size_t i = 0; i < threads; ++i) {
      threads_.emplace_back([this, &connection, &handler] {
        for (;;) {
          Request request;
          {
            std::unique_lock<std::mutex> lock(mutex_);
            ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (stopping_) return;  // queued requests are dropped: nobody can take the answers
            request = std::move(queue_.front());
            queue_.pop_front();
          }
          answer(connection, handler, request);
        }
      });
    }
  }
  ~Pool() { stop(); }

  void push(Request request) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(request));
    }
    ready_.notify_one();
  }

  // Lets running handlers finish, then joins every thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Request> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// $HIBER_CONCURRENCY, or 0 (after complaining) when it is not a positive integer.
long concurrency_from_environment() {
  const char* text = std::getenv("HIBER_CONCURRENCY");
  if (text == nullptr || *text == '\0') return 1;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < 1 || value > kMaxConcurrency) {
    complain(std::string("HIBER_CONCURRENCY=\"") + text + "\" is not an integer in [1, " +
             std::to_string(kMaxConcurrency) + "]");
    return 0;
  }
  return value;
}

// A connected socket to `path` (a Unix socket's path), or -1 with `why` set.
int connect_unix(const std::string& path, std::string& why) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    why = "HIBER_WORKER_SOCKET=\"" + path + "\" is too long for a Unix socket address";
    return -1;
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    why = "connect to " + path + ": " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

// A connected socket to "HOST:PORT", or -1 with `why` set.
int connect_tcp(const std::string& host_port, std::string& why) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    why = "HIBER_WORKER_SOCKET=\"tcp:" + host_port + "\" is not tcp:HOST:PORT";
    return -1;
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), host_port.c_str() + colon + 1, &hints, &found);
      rc != 0) {
    why = "resolve " + host_port + ": " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc;
    do {
      rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      why = "connect to " + host_port + ": " + std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;  // frames are small and answered at once
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// HIBER_WORKER_SOCKET: a Unix socket's path, or tcp:HOST:PORT.
int connect_to(const std::string& address, std::string& why) {
  if (address.rfind("tcp:", 0) == 0) return connect_tcp(address.substr(4), why);
  return connect_unix(address, why);
}

// The first line of the token file, without trailing blanks; empty with `why` set when it
// cannot be read or is empty.
std::string read_token(const std::string& path, std::string& why) {
  std::ifstream in(path);
  std::string token;
  if (!in) {
    why = "cannot read HIBER_WORKER_TOKEN_FILE=" + path + ": " + std::strerror(errno);
    return "";
  }
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) why = "HIBER_WORKER_TOKEN_FILE=" + path + " is empty";
  return token;
}

// With Hiber's client libraries preloaded, initialises CUDA through them, which opens the
// function's session in hiberd: hiberd places a function's requests only once it has an
// instance, and the router sends requests as soon as the worker says hello. A worker without the
// shim (a function that uses no GPU) has no cuInit to call. Returns false when cuInit or the
// synchronization after it failed.
bool open_hiber_session() {
  using CuInit = int (*)(unsigned int);
  auto cu_init = reinterpret_cast<CuInit>(::dlsym(RTLD_DEFAULT, "cuInit"));
  if (cu_init == nullptr || std::getenv("HIBER_RUN_DIR") == nullptr) return true;
  const int result = cu_init(0);
  if (result != 0) {
    complain("cuInit failed (CUresult " + std::to_string(result) + ")");
    return false;
  }
  // hiberd fixes a function's model at its first request (docs/design.md, "Functions and
  // instances"): what the program allocated and wrote before serving, its weights, must have
  // reached hiberd before the router sends a request, or it would count as that request's
  // scratch. The shim batches calls, so wait for every one made so far.
  using CuCtxSynchronize = int (*)();
  auto synchronize = reinterpret_cast<CuCtxSynchronize>(::dlsym(RTLD_DEFAULT, "cuCtxSynchronize"));
  const int synced = synchronize != nullptr ? synchronize() : 0;
  if (synced != 0) complain("cuCtxSynchronize failed (CUresult " + std::to_string(synced) + ")");
  return synced == 0;
}

// Serves invokes on one connection until the router closes it. Returns why the protocol broke,
// or empty.
std::string serve_connection(Connection& connection, const Handler& handler, long concurrency) {
  Pool pool(concurrency > 1 ? static_cast<size_t>(concurrency) : 0, connection, handler);
  router::WorkerFrameReader reader;
  std::string protocol_error;
  std::vector<char> buffer(64 << 10);
  while (protocol_error.empty()) {
    const ssize_t n = ::read(connection.fd(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // A reset connection is the router going away as much as a clean close is.
      if (errno != ECONNRESET) protocol_error = std::string("read: ") + std::strerror(errno);
      break;
    }
    if (n == 0) break;  // the router closed the connection (or a failed write shut it down)
    std::string_view bytes(buffer.data(), static_cast<size_t>(n));
    while (!bytes.empty()) {
      bytes.remove_prefix(reader.feed(bytes));
      if (!reader.error().ok()) {
        protocol_error = "malformed frame from the router: " + reader.error().message();
        break;
      }
      if (!reader.complete()) continue;
      std::variant<Request, std::string> invoke = parse_invoke(reader.take());
      if (auto* message = std::get_if<std::string>(&invoke)) {
        protocol_error = "malformed frame from the router: " + *message;
        break;
      }
      Request& request = std::get<Request>(invoke);
      if (concurrency > 1) {
        pool.push(std::move(request));
      } else {
        answer(connection, handler, request);
      }
    }
  }
  ::shutdown(connection.fd(), SHUT_RDWR);
  pool.stop();
  const int write_errno = connection.write_errno();
  if (protocol_error.empty() && write_errno != 0 && write_errno != EPIPE &&
      write_errno != ECONNRESET) {
    protocol_error = std::string("write: ") + std::strerror(write_errno);
  }
  return protocol_error;
}

json hello(const char* function) {
  return {{"type", "hello"},
          {"protocol", 1},
          {"function", function != nullptr ? function : ""},
          {"pid", static_cast<int64_t>(::getpid())}};
}

// A worker the router started: one connection to its own socket.
int serve_started(const std::string& address, const Handler& handler, long concurrency) {
  std::string why;
  const int fd = connect_to(address, why);
  if (fd < 0) {
    complain(why);
    return kExitProtocol;
  }
  Connection connection(fd);
  if (!open_hiber_session()) return kExitEnvironment;
  connection.send(encode_worker_frame(hello(std::getenv("HIBER_FUNCTION_ID")), {}));
  const std::string problem = serve_connection(connection, handler, concurrency);
  if (!problem.empty()) {
    complain(problem);
    return kExitProtocol;
  }
  return 0;
}

// A worker started by someone else (docs/router.md, "Attached workers"): it attaches with the
// worker token, waits for the router to be up, and attaches again whenever the connection ends.
int serve_attached(const std::string& address, const std::string& token_file,
                   const Handler& handler, long concurrency) {
  const char* function = std::getenv("HIBER_FUNCTION_ID");
  if (function == nullptr || *function == '\0') {
    complain("HIBER_FUNCTION_ID is not set: an attaching worker must name its function");
    return kExitEnvironment;
  }
  json greeting = hello(function);
  if (const char* run_dir = std::getenv("HIBER_RUN_DIR"); run_dir != nullptr) {
    greeting["run_dir"] = run_dir;
  }
  if (const char* instance = std::getenv("HIBER_INSTANCE_ID"); instance != nullptr && *instance) {
    greeting["instance"] = instance;
  }
  bool session_opened = false;
  std::chrono::milliseconds backoff{100};
  std::string last_problem;
  for (;;) {
    std::string why;
    const std::string token = read_token(token_file, why);
    const int fd = token.empty() ? -1 : connect_to(address, why);
    if (fd < 0) {
      if (why != last_problem) complain(why + "; retrying");  // once, not every retry
      last_problem = why;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, kMaxAttachBackoff);
      continue;
    }
    last_problem.clear();
    Connection connection(fd);
    if (!session_opened) {
      if (!open_hiber_session()) return kExitEnvironment;
      session_opened = true;
    }
    greeting["token"] = token;
    connection.send(encode_worker_frame(greeting, {}));
    complain("connected to the router at " + address + " as function " + function);
    const auto since = std::chrono::steady_clock::now();
    const std::string problem = serve_connection(connection, handler, concurrency);
    if (!problem.empty()) {
      complain(problem);
      return kExitProtocol;
    }
    complain("the router at " + address + " closed the connection; attaching again");
    if (std::chrono::steady_clock::now() - since >= kAcceptedConnection) {
      backoff = std::chrono::milliseconds(100);
    } else {
      // Refused at once (see the router's log): do not hammer it.
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, kMaxAttachBackoff);
    }
  }
}

}  // namespace

int serve(const Handler& handler) {
  const char* socket_path = std::getenv("HIBER_WORKER_SOCKET");
  if (socket_path == nullptr || *socket_path == '\0') {
    complain(
        "HIBER_WORKER_SOCKET is not set: this program is a function worker that "
        "hiber-router starts, or that attaches to it (docs/router.md)");
    return kExitEnvironment;
  }
  const long concurrency = concurrency_from_environment();
  if (concurrency == 0) return kExitEnvironment;
  const char* token_file = std::getenv("HIBER_WORKER_TOKEN_FILE");
  if (token_file != nullptr && *token_file != '\0') {
    return serve_attached(socket_path, token_file, handler, concurrency);
  }
  return serve_started(socket_path, handler, concurrency);
}

}  // namespace hiber::function
