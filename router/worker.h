// One function worker: a process the router started, and the connection it opened back to the
// router (the worker protocol of docs/router.md); or an attached worker, a process started by
// someone else (a container runtime) of which the router knows only the connection. The router
// sends it invokes, up to the function's concurrency at once, and gets each result by its
// request id.
//
// A worker's life: spawned -> ready (its hello arrived) -> stopping (the router closed the
// connection to scale it down) -> gone (process reaped and connection closed). An attached
// worker starts ready (its hello was checked before, router/worker_attach.h) and is gone once
// its connection is. A worker whose connection breaks or whose process exits while requests
// are in flight fails those requests (500), and only those.
//
// Thread safety: every call and every handler runs on the io_context's one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/status.h"
#include "router/registry.h"
#include "router/worker_protocol.h"

namespace hiber::router {

// One request as a worker receives it (docs/router.md, "Worker protocol").
struct WorkerRequest {
  std::string id;          // names the invoke on the connection
  std::string request_id;  // the client's X-Request-Id
  std::string content_type;
  std::string body;
  std::optional<std::chrono::milliseconds> deadline;
  // A request in the binary tensor data extension: the body's first bytes are its JSON.
  std::optional<uint64_t> inference_header_bytes;
};

struct WorkerOutcome {
  bool ok = false;
  std::string content_type;
  std::string body;  // the answer when ok
  // An answer in the binary tensor data extension: the body's first bytes are its JSON.
  std::optional<uint64_t> inference_header_bytes;
  std::string error;  // why not, when !ok
  // When !ok: 400..499 when the handler said the request was the client's mistake (the router
  // answers it so), none for the function's own failure (500).
  std::optional<unsigned> client_error;
  bool worker_lost = false;  // the worker died or broke the protocol mid-request
};

// Where and how a worker starts.
struct WorkerLaunch {
  // The file executed: spec.command[0] resolved by WorkerPrograms (absolute; argv[0] stays as
  // the registration gives it).
  std::string program;
  std::string socket_path;   // the router listens here; the worker connects
  std::string log_path;      // the worker's stdout and stderr
  std::string node_run_dir;  // HIBER_RUN_DIR
  std::string preload;       // LD_PRELOAD for `shim: true` (space-separated), may be empty
  // HIBER_INSTANCE_ID: the key the worker's hiberd session presents, so that requestArrived
  // names the process that gets the request. An attached worker's is what its hello said ("":
  // none).
  std::string instance_key;
  std::chrono::milliseconds stop_timeout{5000};
};

class Worker {
 public:
  using Callback = std::function<void(Worker&)>;
  using ResultHandler = std::function<void(WorkerOutcome)>;

  // Listens on launch.socket_path and spawns the worker process. on_ready runs when its hello
  // arrives; on_gone once the process is reaped and the connection closed (the router then
  // forgets it). on_gone may run from inside stop() or a reap, never from inside spawn().
  static Result<std::unique_ptr<Worker>> spawn(boost::asio::io_context& io,
                                               const FunctionSpec& spec, WorkerLaunch launch,
                                               uint64_t instance, Callback on_ready,
                                               Callback on_gone);
  // An attached worker on its connection, whose hello the caller has read and accepted; ready
  // at once. on_gone as for spawn(). `peer` names the other end in log lines.
  static std::unique_ptr<Worker> attach(boost::asio::io_context& io, std::string function,
                                        boost::asio::generic::stream_protocol::socket socket,
                                        std::string peer, uint64_t instance,
                                        std::string instance_key,
                                        std::chrono::milliseconds stop_timeout, Callback on_gone);
  ~Worker();

  uint64_t instance() const { return instance_; }
  const std::string& instance_key() const { return launch_.instance_key; }
  bool attached() const { return attached_; }
  pid_t pid() const { return pid_; }
  bool ready() const { return ready_ && !stopping_ && connection_open_; }
  bool stopping() const { return stopping_; }
  size_t in_flight() const { return pending_.size(); }
  std::chrono::steady_clock::time_point idle_since() const { return idle_since_; }
  // Why it ended, once gone: "exited 0", "killed by signal 9", "protocol error: ...".
  const std::string& end_reason() const { return end_reason_; }

  // REQUIRES: ready(). `done` runs once, with the answer or the failure.
  void invoke(WorkerRequest request, ResultHandler done);

  // Scales it down: closes the connection (the SDK's worker then returns), then SIGTERM, then
  // SIGKILL after the stop timeout. An attached worker's connection is closed for good after
  // the stop timeout if its worker has not closed it by then.
  void stop(std::string why);

  // The router's SIGCHLD reaper found this worker's process gone with this wait status.
  void on_exit(int wait_status);

 private:
  Worker(boost::asio::io_context& io, std::string function, WorkerLaunch launch, uint64_t instance,
         Callback on_ready, Callback on_gone);

  void accept();
  void read();
  void on_frame(WorkerFrame frame);
  void write(std::string frame);
  void write_next();
  // Closes the connection and fails whatever is in flight.
  void lose_connection(const std::string& why);
  void maybe_gone();

  boost::asio::io_context& io_;
  const std::string function_;
  const WorkerLaunch launch_;
  const uint64_t instance_;
  Callback on_ready_;
  Callback on_gone_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::generic::stream_protocol::socket socket_;
  boost::asio::steady_timer kill_timer_;
  pid_t pid_ = -1;
  bool attached_ = false;
  std::string peer_;  // an attached worker's other end, for log lines
  bool ready_ = false;
  bool stopping_ = false;
  bool connection_open_ = false;
  bool process_gone_ = false;
  bool gone_reported_ = false;
  std::string end_reason_;
  std::map<std::string, ResultHandler> pending_;
  std::deque<std::string> writes_;
  bool writing_ = false;
  WorkerFrameReader reader_;
  std::array<char, 64 * 1024> read_buffer_{};
  std::chrono::steady_clock::time_point idle_since_ = std::chrono::steady_clock::now();
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace hiber::router
