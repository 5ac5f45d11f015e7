// hiberd's top level: listens on the function socket and the control socket (and, when asked,
// on a TCP port that speaks the control protocol to a router on another machine), performs
// handshakes, runs sessions, answers control requests, and shuts down cleanly on SIGTERM/SIGINT.
//
// All socket I/O runs on one io_uring loop thread; each session executes calls on its own
// thread. A client connection lives as long as its session: when the client's socket closes
// (the process exited or was killed), the session is closed, waits for its device work, releases
// everything, and only then is the connection forgotten.
//
// Thread safety: create() and run() on one thread; stop() from anywhere.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/ids.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "server/auth.h"
#include "server/context_pool.h"
#include "server/control_service.h"
#include "server/controller.h"
#include "server/device/device.h"
#include "server/io_loop.h"
#include "server/metrics_exporter.h"
#include "server/module_cache.h"
#include "server/session.h"
#include "server/session_store.h"
#include "wire/channel_layout.h"
#include "wire/handshake.h"
#include "wire/socket_frame.h"

namespace hiber::server {

struct DaemonOptions {
  std::string socket_path;          // functions connect here
  std::string control_socket_path;  // the router and operators connect here
  std::string auth_token;           // functions must present it
  std::vector<uid_t> allowed_uids;  // peers of other users are refused
  // "host:port" of a TCP listener for control requests (port 0: any free port); empty: none.
  // Peers there have no uid to check: the control token is all they prove.
  std::string control_tcp_listen;
  // Every control request must carry it, on the Unix socket and over TCP: the operator's
  // secret, apart from the functions' auth_token (it must differ).
  std::string control_token;
  // A control connection that sends no request for this long is closed (clients reconnect).
  std::chrono::milliseconds control_idle_timeout{60000};
  // Connections that are not sessions yet (handshakes, control clients): at most this many in
  // all, and at most max_pending_per_peer from one peer (a uid on the Unix sockets, an address
  // over TCP), so that no peer takes every slot.
  size_t max_pending_connections = 256;
  size_t max_pending_per_peer = 128;
  // The io_uring queue; completion_entries 0: twice io_queue_depth (tests overflow a small one).
  unsigned io_queue_depth = 1024;
  unsigned io_completion_entries = 0;
  // Late binding: pools, policies, swaps, quotas (controller.h).
  ControllerOptions controller;
  // An implicit lease ends after this long without a call that needs the GPU.
  std::chrono::microseconds implicit_lease_idle{5000};
  // A session's address range as a multiple of its quota (at least 1.25): room for its
  // allocations to fragment and for client virtual memory reservations (hiberd's
  // --session_va_factor: 2.5 on CUDA, 1.25 on the simulated device).
  double session_va_factor = 2.5;
  // What each session may make hiberd hold (queued GPU work, code images).
  SessionLimits session_limits;
  // A device context per instance, or one shared per GPU (server/context_pool.h); how many
  // contexts are made ahead per GPU.
  Isolation isolation = Isolation::kContext;
  int contexts_ready_per_gpu = 1;
  // The most bytes of distinct code images loaded at once, for all sessions (0: no bound).
  uint64_t max_module_bytes = uint64_t{16} << 30;
  wire::ChannelConfig channel;
  size_t max_sessions = 1024;
  std::chrono::milliseconds handshake_timeout{5000};
  // After SIGTERM, how long sessions may take to finish their device work before hiberd exits
  // without waiting for them. A second signal exits at once.
  std::chrono::milliseconds shutdown_timeout{30000};
  // Where sessions survive hiberd (server/session_store.h): the model repository's files and
  // the sessions' records. "": nothing survives; a restart ends every session.
  std::string state_dir;
  // How long a kept session waits for its client after a restart before it is dropped.
  std::chrono::milliseconds resume_window{std::chrono::minutes(10)};
  // Prometheus /metrics on this "host:port" (port 0: a free one); "" = none.
  std::string metrics_listen;
  // Once /metrics listens, its port number is written here (for --metrics_listen=...:0); "" =
  // nowhere.
  std::string metrics_port_file;
};

class Daemon {
 public:
  // Binds both sockets (refusing to replace a socket another hiberd still serves) and sets up
  // the event loop and signal handling. SIGTERM and SIGINT must already be blocked in every
  // thread (hiberd's main does this before any thread starts).
  static Result<std::unique_ptr<Daemon>> create(device::Device& device, DaemonOptions options);
  ~Daemon();

  // Serves until SIGTERM/SIGINT or stop(); then refuses new clients, closes every session,
  // waits for them to release everything, removes the socket files and returns.
  Status run();
  void stop();

  // The port the TCP control listener is bound to (the one picked when asked for port 0); 0
  // when there is none.
  uint16_t control_tcp_port() const { return control_tcp_port_; }

 private:
  struct Connection;  // a function's connection (then its session) or a control connection

  // Where a connection came from: each listener has its own admission.
  enum class Listener {
    kFunction,    // functions: uid, then the Hello's auth token
    kControl,     // the Unix control socket: uid, and the control token in every request
    kControlTcp,  // control over TCP: the control token in every request
  };

  Daemon(device::Device& device, DaemonOptions options, std::unique_ptr<Controller> controller,
         std::unique_ptr<IoLoop> loop, UniqueFd function_listener, UniqueFd control_listener,
         UniqueFd control_tcp_listener, uint16_t control_tcp_port, UniqueFd signal_fd);

  // Accepts on one listener until shutdown; errors (EMFILE and the like) pause it briefly.
  void arm_accept(Listener listener);
  void on_accept(int fd, Listener listener);
  void arm_signals();
  // Wraps a handler of an operation on `connection`: counts it as outstanding, finds the
  // connection again when it completes (it may be gone) and forgets the connection once it is
  // closing and idle.
  IoLoop::Handler track(Connection& connection,
                        std::function<void(Connection&, int result)> handler);
  void receive_frame(Connection& connection);
  void send_frame(Connection& connection, std::vector<std::byte> frame, int attach_fd,
                  std::function<void(Connection&)> then);
  void send_rest(Connection& connection, std::function<void(Connection&)> then);

  void on_hello(Connection& connection);
  Status admit(const wire::Hello& hello) const;
  void on_welcome_sent(Connection& connection);
  void on_session_exit(uint64_t connection_id);

  // Hands a control request to the control service, which answers through reply_later().
  void on_control_request(Connection& connection);
  // The daemon's part of a status report (loop thread).
  ControlService::DaemonReport daemon_report() const;
  // Sends a control reply to connection `id` if it is still there (from any thread).
  void reply_later(uint64_t connection_id, Result<std::vector<std::byte>> frame);
  // A status reply for /metrics (an exporter thread): waits for the report a status request on
  // the control socket would get, its pages merged.
  Result<wire::Message> status_for_metrics();
  // One page of it (an exporter thread).
  Result<wire::Message> status_page_for_metrics(uint64_t offset);
  Status start_metrics();

  // Admits a connection as one of its peer's pending connections; counted until it becomes a
  // session, proves the control token, or is forgotten. At the per-peer cap the peer's oldest unproven connection is
  // dropped to make room (drop_oldest_unproven); it is refused only when the peer has none.
  bool count_pending(Connection& connection, std::string peer);
  void uncount_pending(Connection& connection);
  // Unproven: still reading and without a credential (a function connection before its Hello, a
  // control connection before a request with the control token). Drops the oldest such
  // connection other than `newcomer`, of `peer_key` ("" : of any peer), refusing it with `why`,
  // so that silent connections cannot keep a newer one out; false if there is none.
  bool drop_oldest_unproven(const Connection& newcomer, std::string_view peer_key,
                            const std::string& why);

  // A Hello with a resume token: the session it resumes, claimed from the store.
  Result<std::shared_ptr<const RecoveredSession>> claim_resumed(const wire::Hello& hello);
  // Brings a resumed session's blocks back and saves its new record; `token` is its new one.
  Status restore(Session& session, const RecoveredSession& recovered, const std::string& token,
                 wire::SessionInfo* welcome);
  void reject(Connection& connection, const Status& why);
  void close_connection(Connection& connection, std::string_view why);
  void maybe_forget(Connection& connection);

  // Refuses connections late for their Hello or their first control request, and closes
  // control connections left idle.
  void sweep_handshakes();
  void begin_shutdown(std::string_view why);
  void maybe_finish_shutdown();

  device::Device& device_;
  const DaemonOptions options_;
  // The node's GPUs, requests and policies. Declared before connections_, so it outlives the
  // sessions (which lease its GPUs and place their blocks in its pools).
  std::unique_ptr<Controller> controller_;
  // Code images, shared by every session. Declared before connections_, so it outlives the
  // sessions (which give their references back as they end).
  ModuleCache module_cache_;
  // The instances' contexts. Declared before connections_, so it outlives the sessions (which
  // give their contexts back as they end).
  ContextPool contexts_;
  // Sessions kept across restarts; nullptr without a state directory. Declared after the
  // controller: its writer may hold a session's memory, whose host copies are the
  // controller's repository's.
  std::unique_ptr<SessionStore> store_;
  // Answers the control socket's requests, with the controller and the module cache.
  std::unique_ptr<ControlService> control_;
  std::unique_ptr<IoLoop> loop_;
  UniqueFd function_listener_;
  UniqueFd control_listener_;
  UniqueFd control_tcp_listener_;  // invalid when there is none
  const uint16_t control_tcp_port_;
  UniqueFd signal_fd_;
  alignas(8) std::array<std::byte, 128> signal_buffer_{};  // one signalfd_siginfo
  const std::chrono::steady_clock::time_point started_;
  // Drawn at start (never 0): tells a restarted hiberd from this one (NodeStatus.incarnation).
  const uint64_t incarnation_;

  // Loop thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t next_connection_id_ = 1;
  SessionId next_session_id_{1};
  size_t live_sessions_ = 0;
  // Connections still sending their refusal, and control connections that proved the control
  // token: not counted as pending.
  size_t refusing_ = 0;
  size_t proven_control_ = 0;
  std::unordered_map<std::string, size_t> pending_by_peer_;
  bool shutting_down_ = false;
  std::deque<std::string> refused_resumes_;  // instance keys (NodeStatus.refusedResumes)
  IoLoop::OpId accept_op_ = 0;
  IoLoop::OpId control_accept_op_ = 0;
  IoLoop::OpId control_tcp_accept_op_ = 0;

  struct Counters {
    uint64_t sessions_opened = 0;
    uint64_t sessions_closed = 0;
    uint64_t handshakes_rejected = 0;
    uint64_t malformed_messages = 0;  // handshakes and control requests
    uint64_t control_requests = 0;
    uint64_t control_tokens_refused = 0;  // control requests without the right control token
  } counters_;
  // Set once the loop has stopped: nothing posted to it runs any more.
  std::atomic<bool> loop_done_{false};
  // Declared last: destroyed first, its scrapes use everything above.
  std::unique_ptr<MetricsExporter> metrics_;

  uint64_t closed_sessions_malformed_ = 0;  // malformed batches counted by sessions now gone
  // What sessions now gone counted (the status report sums every session's).
  uint64_t closed_sessions_calls_ = 0;
  uint64_t closed_sessions_batches_ = 0;
  Histogram closed_sessions_batch_sizes_{batch_size_bounds()};
};

}  // namespace hiber::server
