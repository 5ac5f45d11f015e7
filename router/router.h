// hiber-router's core (docs/router.md): the invocation API, the registry, the workers and the
// nodes. An invocation waits in its function's queue at the router until one of the function's
// workers has a free slot (starting a worker if none is warm), then the router tells the
// worker's node that the request arrived and waits for hiberd to start it (its GPU chosen and
// its model on the way), sends it to the worker, answers the client, and tells hiberd the
// request is done.
//
// Thread safety: everything runs on the io_context's one thread: handle() is called there by
// the HTTP server, and every callback of the nodes and workers arrives there.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/status.h"
#include "router/http_types.h"
#include "router/node_client.h"
#include "router/registry.h"
#include "router/router_metrics.h"
#include "router/worker.h"
#include "router/worker_attach.h"
#include "router/worker_programs.h"

namespace hiber::router {

struct RouterOptions {
  std::string state_dir;  // the registry, worker sockets and worker logs
  // The operator's credential: the repository API (load, unload, index) and everything that
  // shows a worker's command need `Authorization: Bearer <operator_token>`. Never empty.
  std::string operator_token;
  // The programs registrations may name as their command's program.
  WorkerPrograms worker_programs;
  std::vector<NodeConfig> nodes;  // at least one
  std::string shim_preload;       // LD_PRELOAD for functions registered with shim: true
  size_t max_queue = 1024;        // per function, at the router; more get 429
  std::chrono::milliseconds worker_start_timeout{60000};
  std::chrono::milliseconds worker_stop_timeout{5000};
  std::chrono::milliseconds status_interval{1000};
  // How long a request waits at the router for a node to answer (a hiberd restarting) before it
  // is answered 503; 0: at once.
  std::chrono::milliseconds node_wait{5000};
  // After a node restarts (or stays down), how long its GPU workers have to resume their
  // sessions with it (their shims do so by themselves) before they are replaced.
  std::chrono::milliseconds worker_resume{15000};
  std::chrono::seconds async_result_ttl{600};
  size_t max_async_results = 100000;
  // Where workers of functions registered with external: true attach; no socket and no
  // listener: none can.
  AttachOptions attach;
};

class Router {
 public:
  // Opens the registry; nothing starts until start().
  static Result<std::unique_ptr<Router>> create(boost::asio::io_context& io, RouterOptions options);
  ~Router();

  // Registers every function with every node, and starts polling the nodes, reaping workers
  // and scaling idle workers down.
  void start();
  // Answers one HTTP request (all of docs/router.md's API but the status page and /metrics,
  // which the HTTP server's owner adds).
  void handle(ApiRequest request, Respond respond);
  // Stops every worker; `done` once they are all gone (or the stop timeout passed).
  void shutdown(std::function<void()> done);

  RouterMetrics& metrics() { return metrics_; }
  // The TCP port attached workers connect to (0 without --worker_attach_listen).
  uint16_t attach_port() const { return attach_ ? attach_->tcp_port() : 0; }
  // GET /v2/status's document.
  std::string status_json() const;

 private:
  struct Invocation;
  struct Instance;
  struct Function;
  struct NodeView;
  struct AsyncResult;

  Router(boost::asio::io_context& io, RouterOptions options, Registry registry);

  // API.
  void infer(const std::string& name, ApiRequest request, Respond respond);
  void load(const std::string& name, const ApiRequest& request, Respond respond);
  void unload(const std::string& name, Respond respond);
  // With the operator's credential, the worker's command too.
  ApiResponse metadata(const Function& function, bool operator_call) const;
  // Why the function cannot serve now (its workers fail to start: the last reason), or none.
  std::optional<std::string> not_ready(const Function& function) const;
  // Whether the request carries the operator's token (compared in constant time).
  bool from_operator(const ApiRequest& request) const;
  ApiResponse repository_index() const;
  // The function's answered requests over the last 10 s, per second.
  double requests_per_second(const Function& function) const;
  // The answer for a name with no loaded function: 400 when it is unloaded (still in the
  // repository), 404 when it was never registered.
  ApiResponse unknown_function(const std::string& name) const;
  static std::string unloaded_message(const std::string& name);
  void async_result(const std::string& id, Respond respond);

  // Invocations.
  void pump(Function& function);
  Instance* free_instance(Function& function);
  // Starts a worker if the queue needs one (or, keep_warm, if none is on its way).
  void maybe_start_worker(Function& function, bool keep_warm = false);
  void run(Function& function, Instance& instance, std::shared_ptr<Invocation> invocation);
  // Asks the invocation's node for a GPU: requestBegin, one round trip (or, from a hiberd
  // before 1.13, requestArrived, then requestStart). A node that answers that it does not know
  // the function (a hiberd restarted since it was registered) gets the function registered
  // again and the request once more, unless `registered_again`.
  void request_gpu(std::shared_ptr<Invocation> invocation, std::string instance_key,
                   bool registered_again);
  // The node refused the request before it had a GPU: `why`.
  void on_gpu_refused(const std::shared_ptr<Invocation>& invocation, const std::string& instance_key,
                      bool registered_again, const Status& why);
  // The node accepted the request as `request_id`.
  void on_accepted(Invocation& invocation, uint64_t request_id);
  void on_started(const std::shared_ptr<Invocation>& invocation, Result<wire::Started> started);
  // Sends the invocation to the worker it was given to.
  void invoke_worker(const std::shared_ptr<Invocation>& invocation);
  void on_outcome(const std::shared_ptr<Invocation>& invocation, WorkerOutcome outcome);
  void finish(const std::shared_ptr<Invocation>& invocation, ApiResponse response, bool failed);
  void answer(Invocation& invocation, ApiResponse response);
  // Sends hiberd requestDone for the invocation, once: its GPU is free again.
  void release_gpu(Invocation& invocation, bool failed);
  // Answers every request waiting in the function's queue with `response`.
  void fail_queue(Function& function, const ApiResponse& response);
  void expire(const std::shared_ptr<Invocation>& invocation);

  // Workers and nodes.
  void on_worker_ready(Function& function, Worker& worker);
  // A worker attached with a good hello: takes its connection, or says why not.
  std::optional<std::string> on_attach(AttachHello hello, AttachListener::Socket& socket);
  // Answers 503 to the requests of an external function that waited longer than the worker
  // start timeout with no worker attached.
  void expire_unattached(Function& function, std::chrono::steady_clock::time_point now);
  // By value: the caller's string may belong to the worker this erases.
  void on_worker_gone(std::string function, uint64_t instance);
  void reap();
  void scale_down();
  void poll_nodes();
  void register_everywhere(const FunctionSpec& spec);
  // The invocation did not get to run: its node was lost before it started (hiberd died), or its
  // worker has no hiberd session (it ended with a restarted hiberd; `stop_worker` stops that
  // worker). It goes back to the front of the queue, for the next worker the node gives a GPU
  // (at most 3 times; then it is answered 503 with `why`).
  void requeue(const std::shared_ptr<Invocation>& invocation, const std::string& why,
               bool stop_worker);
  // Answers 503 the queued invocations that have waited for a node to answer longer than
  // --node_wait_ms (or all, with `all`).
  void expire_node_waits(Function& function, bool all);
  // The GPU workers of `node` started before it restarted (or went down) whose sessions have
  // not come back to it by --worker_resume_ms are replaced.
  void replace_unresumed_workers(size_t node);
  size_t choose_node_for(const Function& function) const;

  Function* find(const std::string& name);

  boost::asio::io_context& io_;
  const RouterOptions options_;
  Registry registry_;
  RouterMetrics metrics_;
  std::vector<std::unique_ptr<NodeClient>> nodes_;
  std::unique_ptr<AttachListener> attach_;
  std::vector<NodeView> node_views_;
  std::map<std::string, std::unique_ptr<Function>> functions_;
  std::unordered_map<std::string, AsyncResult> async_results_;
  struct Swap;
  std::deque<Swap> swaps_;  // newest first
  boost::asio::signal_set child_signals_;
  boost::asio::steady_timer housekeeping_;
  boost::asio::steady_timer poll_timer_;
  uint64_t next_instance_ = 1;
  bool shutting_down_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace hiber::router
