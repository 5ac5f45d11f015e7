#include "router/router.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <glog/logging.h>

#include "router/router_internal.h"
#include "scheduler/cluster_balancer.h"
#include "wire/schema/control.capnp.h"

namespace hiber::router {
using detail::Clock;
using detail::kLatencyWindow;
using detail::kRateWindow;
using detail::kRecentSwaps;
using detail::media_type;
using detail::retry_later;
using detail::status_for;
using detail::wall_seconds;
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using nlohmann::json;

namespace fs = std::filesystem;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// hiberd's admission (--shed) answers requestStart so when the request cannot meet its deadline
// (node::NodeCore::reject): the node is busy, not broken.
bool overloaded(const Status& status) {
  return status.code() == ErrorCode::kDeviceUnavailable &&
         status.message().rfind("overloaded:", 0) == 0;
}

// A node call that failed in transport (router/node_client.cc's io_status: connect, send,
// receive): the node is gone or restarting. hiberd itself never answers kDeinitialized.
bool lost_node(const Status& status) { return status.code() == ErrorCode::kDeinitialized; }

// A registration hiberd took, or one it already had (registering again is how a node learns
// every function after it comes back).
bool registered(const Result<wire::control::Reply>& reply) {
  return reply.ok() || reply.status().message().find("already registered") != std::string::npos;
}

// hiberd refuses arrivals while `hiberctl drain` drains the node (node::NodeCore::arrive).
bool draining(const Status& status) {
  return status.code() == ErrorCode::kDeviceUnavailable &&
         status.message().find("the node is draining") != std::string::npos;
}

// After `failures` failed starts in a row: 1 s, 2 s, 4 s ... up to 30 s.
std::chrono::milliseconds backoff(int failures) {
  return std::min<std::chrono::milliseconds>(
      std::chrono::milliseconds(500) * (1 << std::min(failures, 6)), std::chrono::seconds(30));
}

}  // namespace

Result<std::unique_ptr<Router>> Router::create(asio::io_context& io, RouterOptions options) {
  if (options.nodes.empty()) return error(ErrorCode::kInvalidValue, "the router has no node");
  if (options.operator_token.empty()) {
    return error(ErrorCode::kInvalidValue, "the router has no operator token");
  }
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "workers", ec);
  if (ec) {
    return error(ErrorCode::kOperatingSystem, "cannot create ", options.state_dir,
                 "/workers: ", ec.message());
  }
  HIBER_ASSIGN_OR_RETURN(Registry registry, Registry::open(options.state_dir));
  std::unique_ptr<Router> router(new Router(io, std::move(options), std::move(registry)));
  for (const NodeConfig& config : router->options_.nodes) {
    HIBER_ASSIGN_OR_RETURN(std::unique_ptr<NodeClient> node, NodeClient::create(io, config));
    router->nodes_.push_back(std::move(node));
  }
  router->node_views_.resize(router->nodes_.size());
  const AttachOptions& attach = router->options_.attach;
  if (!attach.unix_path.empty() || !attach.tcp_listen.empty()) {
    Router* self = router.get();
    HIBER_ASSIGN_OR_RETURN(
        router->attach_,
        AttachListener::create(io, attach, [self](AttachHello hello, AttachListener::Socket& s) {
          return self->on_attach(std::move(hello), s);
        }));
  }
  for (const auto& [name, spec] : router->registry_.functions()) {
    auto function = std::make_unique<Function>();
    function->spec = spec;
    router->functions_.emplace(name, std::move(function));
  }
  return router;
}

Router::Router(asio::io_context& io, RouterOptions options, Registry registry)
    : io_(io),
      options_(std::move(options)),
      registry_(std::move(registry)),
      child_signals_(io, SIGCHLD),
      housekeeping_(io),
      poll_timer_(io) {}

Router::~Router() { *alive_ = false; }

void Router::start() {
  LOG(INFO) << "router: " << functions_.size() << " functions in the registry, " << nodes_.size()
            << " nodes";
  reap();
  poll_nodes();
  scale_down();
}

Router::Function* Router::find(const std::string& name) {
  auto it = functions_.find(name);
  return it == functions_.end() || it->second->unloading ? nullptr : it->second.get();
}

// ---- Invocations ----

Router::Instance* Router::free_instance(Function& function) {
  Instance* best = nullptr;
  bool best_resident = false;
  for (auto& [id, instance] : function.instances) {
    if (!instance.worker->ready() || instance.scaled_down ||
        instance.generation != function.generation || instance.busy >= function.spec.concurrency) {
      continue;
    }
    const bool resident = node_views_[instance.node].resident.count(function.spec.name) > 0;
    if (best == nullptr || (resident && !best_resident) ||
        (resident == best_resident && instance.busy < best->busy)) {
      best = &instance;
      best_resident = resident;
    }
  }
  return best;
}

void Router::pump(Function& function) {
  const Clock::time_point now = Clock::now();
  while (!function.queue.empty()) {
    // One retrying a lost node waits its turn; those behind it wait too (the order holds).
    if (function.queue.front()->retry_at && *function.queue.front()->retry_at > now) break;
    Instance* instance = free_instance(function);
    if (instance == nullptr) break;
    std::shared_ptr<Invocation> invocation = std::move(function.queue.front());
    function.queue.pop_front();
    run(function, *instance, std::move(invocation));
  }
  if (!function.queue.empty()) maybe_start_worker(function);
  metrics_.set_queued(function.spec.name, static_cast<double>(function.queue.size()));
}

size_t Router::choose_node_for(const Function& function) const {
  std::vector<scheduler::NodeCandidate> candidates(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    candidates[i].up = nodes_[i]->up() && node_views_[i].up;
    candidates[i].resident = node_views_[i].resident.count(function.spec.name) > 0;
    // The work already sent there: requests in flight, each worth its function's expected time.
    double load = 0;
    for (const auto& [name, other] : functions_) {
      const double seconds = (other->spec.exec_ms_hint > 0 ? other->spec.exec_ms_hint : 10) / 1e3;
      for (const auto& [id, instance] : other->instances) {
        if (instance.node == i) load += seconds * static_cast<double>(instance.busy + 1);
      }
    }
    candidates[i].expected_load = load;
  }
  return scheduler::choose_node(candidates).value_or(nodes_.size());
}

void Router::maybe_start_worker(Function& function, bool keep_warm) {
  // An external function's workers attach by themselves: its queue waits for them.
  if (function.unloading || shutting_down_ || function.spec.external) return;
  size_t live = 0, starting = 0;
  for (const auto& [id, instance] : function.instances) {
    if (instance.scaled_down) continue;
    ++live;
    if (!instance.worker->ready()) ++starting;
  }
  // Workers that are on their way will take this much of the queue.
  if (starting * function.spec.concurrency >= std::max<size_t>(function.queue.size(), keep_warm)) {
    return;
  }
  if (live >= function.spec.max_instances) {
    // A stale worker (an older registration) gives way once idle: housekeeping stops it.
    return;
  }
  if (Clock::now() < function.next_start) return;  // backing off; housekeeping retries
  size_t node = choose_node_for(function);
  const std::string& name = function.spec.name;
  if (node >= nodes_.size() && !function.spec.shim) node = 0;  // it needs no node
  if (node >= nodes_.size()) {
    // The queue waits --node_wait_ms for a node to answer (a hiberd restarting); housekeeping
    // answers those that waited longer.
    expire_node_waits(function, options_.node_wait.count() == 0);
    return;
  }
  // Backs off, and answers the queue with the reason.
  const auto start_failed = [&](const Status& why) {
    function.last_start_error = why.message();
    ++function.start_failures;
    function.next_start = Clock::now() + backoff(function.start_failures);
    LOG(WARNING) << "function " << name << ": " << function.last_start_error;
    fail_queue(function, retry_later(503, "cannot start a worker: " + function.last_start_error));
  };
  // Checked again at each start: the registry may hold a registration from before the
  // operator's list changed.
  Result<std::string> program = options_.worker_programs.resolve(function.spec.command[0]);
  if (!program.ok()) return start_failed(program.status());
  const uint64_t number = next_instance_++;
  WorkerLaunch launch;
  const fs::path workers = fs::path(options_.state_dir) / "workers";
  launch.program = std::move(*program);
  launch.socket_path = (workers / (std::to_string(number) + ".sock")).string();
  launch.log_path = (workers / (name + ".log")).string();
  launch.node_run_dir = nodes_[node]->config().run_dir;
  launch.preload = options_.shim_preload;
  launch.stop_timeout = options_.worker_stop_timeout;
  // The router's process id makes the key unique across router restarts too.
  launch.instance_key = str_cat(::getpid(), ".", number);
  Result<std::unique_ptr<Worker>> worker = Worker::spawn(
      io_, function.spec, std::move(launch), number,
      [this, name](Worker& worker) {
        if (Function* f = find(name)) on_worker_ready(*f, worker);
      },
      [this, name](Worker& worker) { on_worker_gone(name, worker.instance()); });
  if (!worker.ok()) return start_failed(worker.status());
  Instance instance;
  instance.worker = std::move(*worker);
  instance.node = node;
  instance.generation = function.generation;
  instance.spawned = instance.idle_since = Clock::now();
  function.instances.emplace(number, std::move(instance));
  metrics_.worker_started(name);
  metrics_.set_instances(name, static_cast<double>(function.instances.size()));
}

void Router::on_worker_ready(Function& function, Worker& worker) {
  auto it = function.instances.find(worker.instance());
  if (it != function.instances.end()) it->second.became_ready = true;
  function.start_failures = 0;
  function.last_start_error.clear();
  pump(function);
}

std::optional<std::string> Router::on_attach(AttachHello hello, AttachListener::Socket& socket) {
  const std::string& name = hello.function;
  Function* function = find(name);
  if (function == nullptr) return "unknown function \"" + name + "\"";
  if (!function->spec.external) {
    return "function \"" + name + "\" is not registered with external: true";
  }
  if (shutting_down_) return std::string("the router is stopping");
  // Its node: the one whose run directory it uses (it opened its hiberd session there).
  size_t node = nodes_.size();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!hello.run_dir.empty() && nodes_[i]->config().run_dir == hello.run_dir) node = i;
  }
  if (node == nodes_.size()) {
    if (nodes_.size() > 1 && function->spec.shim) {
      return "its HIBER_RUN_DIR \"" + hello.run_dir +
             "\" is the run_dir of none of the router's nodes";
    }
    node = 0;  // one node, or a function that uses no GPU
  }
  if (function->spec.shim && !function->instances.empty()) {
    // hiberd gives each request's lease to the session its requestArrived names: with several
    // workers of one GPU function, each must say which session is its own.
    const bool all_named =
        !hello.instance.empty() &&
        std::all_of(function->instances.begin(), function->instances.end(),
                    [](const auto& entry) { return !entry.second.worker->instance_key().empty(); });
    if (!all_named) {
      return "function \"" + name +
             "\" uses the GPU and has an attached worker already: each of its workers must set "
             "HIBER_INSTANCE_ID, a key of its own";
    }
  }
  const uint64_t number = next_instance_++;
  Instance instance;
  instance.worker = Worker::attach(io_, name, std::move(socket), hello.peer, number, hello.instance,
                                   options_.worker_stop_timeout,
                                   [this, name](Worker& w) { on_worker_gone(name, w.instance()); });
  instance.node = node;
  instance.generation = function->generation;
  instance.became_ready = true;
  instance.spawned = instance.idle_since = Clock::now();
  Worker& worker = *instance.worker;
  function->instances.emplace(number, std::move(instance));
  metrics_.worker_started(name);
  metrics_.set_instances(name, static_cast<double>(function->instances.size()));
  on_worker_ready(*function, worker);
  return std::nullopt;
}

void Router::expire_unattached(Function& function, Clock::time_point now) {
  for (const auto& [id, instance] : function.instances) {
    if (instance.worker->ready() && !instance.scaled_down) return;  // it will take the queue
  }
  const auto waited_too_long = [&](const std::shared_ptr<Invocation>& invocation) {
    return now - invocation->arrival >= options_.worker_start_timeout;
  };
  std::deque<std::shared_ptr<Invocation>> expired;
  auto& queue = function.queue;
  std::copy_if(queue.begin(), queue.end(), std::back_inserter(expired), waited_too_long);
  if (expired.empty()) return;
  queue.erase(std::remove_if(queue.begin(), queue.end(), waited_too_long), queue.end());
  metrics_.set_queued(function.spec.name, static_cast<double>(queue.size()));
  const ApiResponse response = retry_later(
      503, str_cat("no worker of function \"", function.spec.name, "\" attached within ",
                   options_.worker_start_timeout.count(), " ms"));
  for (auto& invocation : expired) answer(*invocation, response);
}

void Router::on_worker_gone(std::string name, uint64_t number) {
  auto it = functions_.find(name);
  if (it == functions_.end()) return;
  Function& function = *it->second;
  auto gone = function.instances.find(number);
  bool replace = false;
  if (gone != function.instances.end()) {
    const Instance& instance = gone->second;
    const std::string reason = instance.worker->end_reason();
    const bool never_ready = !instance.became_ready && !instance.scaled_down;
    if (!instance.scaled_down) {
      metrics_.worker_lost(name);
      LOG(WARNING) << "function " << name << ": worker #" << number << " lost: " << reason;
    }
    if (never_ready) {
      function.last_start_error = "the worker " + reason +
                                  " before it was ready (its log: " + options_.state_dir +
                                  "/workers/" + name + ".log)";
      ++function.start_failures;
      function.next_start = Clock::now() + backoff(function.start_failures);
    }
    // A worker that died while warm is replaced at once, so that the function stays warm.
    replace = instance.became_ready && !instance.scaled_down && !function.spec.external;
    function.instances.erase(gone);
    metrics_.set_instances(name, static_cast<double>(function.instances.size()));
    // A worker that cannot start fails the queue that waited for it.
    if (never_ready && !function.queue.empty()) {
      bool others = false;
      for (const auto& [id, other] : function.instances) others |= !other.scaled_down;
      if (!others) {
        fail_queue(function,
                   retry_later(503, "function \"" + name + "\": " + function.last_start_error));
      }
    }
  }
  if (function.unloading) {
    if (!function.instances.empty()) return;
    for (auto& node : nodes_) {
      node->call(wire::control::UnregisterFunction{name},
                 [name, node = node->config().name](Result<wire::control::Reply> answer) {
                   if (!answer.ok()) {
                     LOG(WARNING) << "unregistering " << name << " from " << node << ": "
                                  << answer.status();
                   }
                 });
    }
    metrics_.forget(name);
    functions_.erase(it);
    return;
  }
  pump(function);
  if (replace) maybe_start_worker(function, /*keep_warm=*/true);
}

void Router::run(Function& function, Instance& instance, std::shared_ptr<Invocation> invocation) {
  ++instance.busy;
  invocation->instance = instance.worker->instance();
  invocation->node = instance.node;
  invocation->dispatched = Clock::now();
  if (!function.spec.shim) {
    // A function without Hiber's client libraries uses no GPU: hiberd has nothing to schedule.
    invocation->started_at = invocation->dispatched;
    return invoke_worker(invocation);
  }
  request_gpu(std::move(invocation), instance.worker->instance_key(), false);
}

void Router::request_gpu(std::shared_ptr<Invocation> invocation, std::string instance_key,
                         bool registered_again) {
  NodeClient& node = *nodes_[invocation->node];
  auto alive = std::weak_ptr<bool>(alive_);
  if (node_views_[invocation->node].begins_requests) {
    // Answered once the request has its GPU: no timeout but the request's own deadline.
    node.call(
        wire::control::RequestBegin{invocation->function, instance_key},
        [this, invocation, instance_key, registered_again,
         alive](Result<wire::control::Reply> reply) {
          if (alive.expired()) return;
          const auto* started = reply.ok() ? std::get_if<wire::Started>(&*reply) : nullptr;
          if (started == nullptr) {
            return on_gpu_refused(invocation, instance_key, registered_again,
                                  reply.ok() ? error(ErrorCode::kInvalidValue,
                                                     "hiberd answered requestBegin oddly")
                                             : reply.status());
          }
          on_accepted(*invocation, started->request_id);
          on_started(invocation, *started);
        },
        std::chrono::milliseconds(0));
    return;
  }
  node.call(
      wire::control::RequestArrived{invocation->function, instance_key},
      [this, invocation, instance_key, registered_again,
       alive](Result<wire::control::Reply> reply) {
        if (alive.expired()) return;
        const auto* accepted = reply.ok() ? std::get_if<wire::control::Accepted>(&*reply) : nullptr;
        if (accepted == nullptr) {
          return on_gpu_refused(invocation, instance_key, registered_again,
                                reply.ok() ? error(ErrorCode::kInvalidValue,
                                                   "hiberd answered requestArrived oddly")
                                           : reply.status());
        }
        on_accepted(*invocation, accepted->request_id);
        // requestStart is answered once the request has its GPU: no timeout but the
        // request's own deadline.
        nodes_[invocation->node]->call(
            wire::control::RequestStart{accepted->request_id},
            [this, invocation, alive](Result<wire::control::Reply> reply) {
              if (alive.expired()) return;
              if (!reply.ok()) return on_started(invocation, reply.status());
              if (auto* started = std::get_if<wire::Started>(&*reply)) {
                return on_started(invocation, *started);
              }
              on_started(invocation,
                         error(ErrorCode::kInvalidValue, "hiberd answered requestStart oddly"));
            },
            std::chrono::milliseconds(0));
      });
}

void Router::on_accepted(Invocation& invocation, uint64_t request_id) {
  invocation.hiberd_request = request_id;
  if (Function* function = find(invocation.function); function != nullptr && invocation.instance) {
    auto it = function->instances.find(*invocation.instance);
    if (it != function->instances.end()) it->second.session_missing_since.reset();
  }
}

void Router::on_gpu_refused(const std::shared_ptr<Invocation>& invocation,
                            const std::string& instance_key, bool registered_again,
                            const Status& why) {
  Function* function = find(invocation->function);
  if (!registered_again && function != nullptr && why.code() == ErrorCode::kNotFound &&
      why.message().find("is not registered") != std::string::npos) {
    NodeClient& node = *nodes_[invocation->node];
    LOG(WARNING) << "node " << node.config().name << " does not know function "
                 << invocation->function << " (" << why.message() << "): registering it again";
    node_views_[invocation->node].registered = false;  // the next poll: every function
    node.call(function->spec.registration(),
              [this, invocation, instance_key,
               alive = std::weak_ptr<bool>(alive_)](Result<wire::control::Reply> r) {
                if (alive.expired()) return;
                if (!registered(r)) {
                  return finish(invocation,
                                retry_later(status_for(r.status()),
                                            "hiberd: " + r.status().message()),
                                true);
                }
                request_gpu(invocation, instance_key, true);
              });
    return;
  }
  if (why.code() == ErrorCode::kDeviceUnavailable &&
      why.message().find("has no connected instance") != std::string::npos) {
    // After a hiberd restart its shim resumes the worker's session by itself: the request
    // waits for that (--worker_resume_ms) before the worker is replaced.
    Instance* instance = nullptr;
    if (function != nullptr && invocation->instance) {
      auto it = function->instances.find(*invocation->instance);
      if (it != function->instances.end()) instance = &it->second;
    }
    const Clock::time_point now = Clock::now();
    if (instance != nullptr && !instance->session_missing_since) {
      instance->session_missing_since = now;
    }
    const bool refused =
        instance != nullptr &&
        node_views_[invocation->node].refused_resumes.count(instance->worker->instance_key()) != 0;
    const bool waited_enough = instance == nullptr || refused ||
                               now - *instance->session_missing_since >= options_.worker_resume;
    return requeue(invocation, "hiberd: " + why.message(), waited_enough);
  }
  // A node lost, or draining for a restart (an upgrade): the request waits for it.
  if (draining(why)) return requeue(invocation, "hiberd: " + why.message(), false);
  // Lost nodes, shed requests and the rest, as when the start fails.
  on_started(invocation, why);
}

void Router::on_started(const std::shared_ptr<Invocation>& invocation,
                        Result<wire::Started> started) {
  if (!started.ok()) {
    const Status& why = started.status();
    // hiberd died with the request waiting for its GPU: nothing ran; it waits for the next one.
    if (lost_node(why)) return requeue(invocation, "hiberd: " + why.message(), false);
    if (overloaded(why)) {
      invocation->shed = true;
      return finish(
          invocation,
          retry_later(503, str_cat("function \"", invocation->function, "\" is overloaded: node ",
                                   nodes_[invocation->node]->config().name, " shed the request (",
                                   why.message(), "); retry later")),
          true);
    }
    return finish(invocation, retry_later(status_for(why), "hiberd: " + why.message()), true);
  }
  invocation->started = *started;
  invocation->started_at = Clock::now();
  if (started->source != "resident") {
    swaps_.push_front(Swap{wall_seconds(), invocation->function,
                           nodes_[invocation->node]->config().name, *started});
    if (swaps_.size() > kRecentSwaps) swaps_.pop_back();
  }
  if (invocation->answered) {
    // Its deadline passed while hiberd queued it: the GPU is released without running it.
    return finish(invocation, ApiResponse{}, true);
  }
  invoke_worker(invocation);
}

void Router::invoke_worker(const std::shared_ptr<Invocation>& invocation) {
  Function* function = find(invocation->function);
  Instance* instance = nullptr;
  if (function != nullptr) {
    auto it = function->instances.find(*invocation->instance);
    if (it != function->instances.end()) instance = &it->second;
  }
  if (instance == nullptr || !instance->worker->ready()) {
    return finish(invocation,
                  error_response(500, "the function's worker was lost before the request ran"),
                  true);
  }
  std::optional<std::chrono::milliseconds> left;
  if (invocation->deadline) {
    left = std::chrono::ceil<std::chrono::milliseconds>(*invocation->deadline - Clock::now());
  }
  instance->worker->invoke(
      WorkerRequest{invocation->id, invocation->request_id, invocation->content_type,
                    std::move(invocation->body), left, invocation->inference_header_bytes},
      [this, invocation, alive = std::weak_ptr<bool>(alive_)](WorkerOutcome outcome) {
        if (alive.expired()) return;
        on_outcome(invocation, std::move(outcome));
      });
}

void Router::on_outcome(const std::shared_ptr<Invocation>& invocation, WorkerOutcome outcome) {
  if (!outcome.ok && outcome.client_error) {
    // The function's handler found the request wrong: the client's mistake, not a failure.
    invocation->client_error = true;
    return finish(invocation, error_response(*outcome.client_error, outcome.error), false);
  }
  if (!outcome.ok) {
    return finish(invocation, error_response(500, outcome.error), true);
  }
  ApiResponse response;
  response.status = 200;
  response.content_type = std::move(outcome.content_type);
  response.body = std::move(outcome.body);
  if (outcome.inference_header_bytes) {
    // The answer's JSON comes first; the header tells the client where its tensors start.
    uint64_t header_bytes = *outcome.inference_header_bytes;
    if (invocation->client_id) {
      json answer = json::parse(std::string_view(response.body).substr(0, header_bytes), nullptr,
                                /*allow_exceptions=*/false);
      if (answer.is_object()) {
        answer["id"] = *invocation->client_id;
        std::string text = answer.dump(-1, ' ', false, json::error_handler_t::replace);
        response.body.replace(0, header_bytes, text);
        header_bytes = text.size();
      }
    }
    response.headers.emplace_back("Inference-Header-Content-Length", std::to_string(header_bytes));
  } else if (invocation->client_id && media_type(response.content_type) == "application/json") {
    json answer = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
    if (answer.is_object()) {
      answer["id"] = *invocation->client_id;
      response.body = answer.dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }
  finish(invocation, std::move(response), false);
}

void Router::release_gpu(Invocation& invocation, bool failed) {
  if (!invocation.hiberd_request) return;
  nodes_[invocation.node]->call(
      wire::RequestDone{*invocation.hiberd_request, failed},
      [node = nodes_[invocation.node]->config().name](Result<wire::control::Reply> reply) {
        if (!reply.ok()) LOG(WARNING) << "requestDone on " << node << ": " << reply.status();
      });
  invocation.hiberd_request.reset();
}

void Router::fail_queue(Function& function, const ApiResponse& response) {
  std::deque<std::shared_ptr<Invocation>> queued;
  queued.swap(function.queue);
  for (auto& invocation : queued) answer(*invocation, response);
}

void Router::finish(const std::shared_ptr<Invocation>& invocation, ApiResponse response,
                    bool failed) {
  release_gpu(*invocation, failed);
  Function* function = find(invocation->function);
  if (function != nullptr && invocation->instance) {
    auto it = function->instances.find(*invocation->instance);
    if (it != function->instances.end() && it->second.busy > 0) {
      --it->second.busy;
      it->second.idle_since = Clock::now();
    }
  }
  answer(*invocation, std::move(response));
  if (function != nullptr) pump(*function);
}

void Router::answer(Invocation& invocation, ApiResponse response) {
  if (invocation.answered) return;
  invocation.answered = true;
  if (invocation.deadline_timer) invocation.deadline_timer->cancel();
  const Clock::time_point now = Clock::now();
  response.headers.emplace_back("X-Request-Id", invocation.request_id);
  std::optional<double> queue_wait, execution;
  if (invocation.started) {
    const wire::Started& started = *invocation.started;
    response.headers.emplace_back("X-Hiber-Node", nodes_[invocation.node]->config().name);
    response.headers.emplace_back("X-Hiber-Gpu", std::to_string(started.gpu));
    response.headers.emplace_back("X-Hiber-Source", started.source);
    if (!started.link.empty()) response.headers.emplace_back("X-Hiber-Link", started.link);
    char queued[32];
    std::snprintf(queued, sizeof queued, "%.3f", started.queued_ms);
    response.headers.emplace_back("X-Hiber-Queued-Ms", queued);
  }
  if (invocation.instance) {
    response.headers.emplace_back("X-Hiber-Instance", std::to_string(*invocation.instance));
  }
  if (invocation.instance && invocation.started_at != Clock::time_point()) {
    queue_wait = seconds_between(invocation.arrival, invocation.started_at);
    execution = seconds_between(invocation.started_at, now);
  }
  const double total = seconds_between(invocation.arrival, now);
  auto it = functions_.find(invocation.function);
  bool violated = true;
  if (it != functions_.end()) {
    Function& function = *it->second;
    if (invocation.client_error) {
      // A request its function found wrong is the client's, like one the router refused: not
      // one of the function's requests, and no SLO violation.
      violated = false;
      ++function.rejected;
    } else {
      violated = response.status != 200 || total * 1e3 > function.spec.slo_ms;
      ++function.requests;
      function.answered_at.push_back(now);
      while (now - function.answered_at.front() > kRateWindow) function.answered_at.pop_front();
      if (response.status == 200) {
        ++function.ok;
        function.latencies_ms.push_back(total * 1e3);
        if (function.latencies_ms.size() > kLatencyWindow) function.latencies_ms.pop_front();
      } else if (invocation.shed) {
        ++function.shed;
      } else {
        ++function.failed;
      }
      if (!violated) ++function.on_time;
    }
  }
  metrics_.invocation(invocation.function, response.status, total, queue_wait, execution, violated);
  if (invocation.shed) metrics_.shed(invocation.function);
  if (invocation.respond) {
    Respond respond = std::move(invocation.respond);
    respond(std::move(response));
  } else if (auto result = async_results_.find(invocation.id); result != async_results_.end()) {
    result->second.done = true;
    result->second.response = std::move(response);
    result->second.expires = now + options_.async_result_ttl;
  }
}

void Router::expire(const std::shared_ptr<Invocation>& invocation) {
  if (invocation->answered) return;
  auto it = functions_.find(invocation->function);
  if (it != functions_.end() && !invocation->instance) {
    auto& queue = it->second->queue;
    queue.erase(std::remove(queue.begin(), queue.end(), invocation), queue.end());
    metrics_.set_queued(invocation->function, static_cast<double>(queue.size()));
    return answer(*invocation,
                  error_response(504, "the deadline passed while the request waited for a worker"));
  }
  // The client gets its answer now. A request hiberd started gives its GPU back now too (the
  // worker may still be running it: its later calls are the function's background work, and its
  // slot stays taken until it answers); one hiberd still queues is ended once it starts.
  if (invocation->started) release_gpu(*invocation, /*failed=*/true);
  // Only a request that went to hiberd and was not started yet waited for hiberd: one of a
  // function without the shim never reaches it.
  const bool at_hiberd = !invocation->started && it != functions_.end() && it->second->spec.shim;
  answer(*invocation,
         error_response(504, at_hiberd ? "the deadline passed while hiberd queued the request"
                                       : "the deadline passed while the function ran"));
}

// ---- Workers and nodes ----

void Router::reap() {
  child_signals_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](error_code ec, int) {
    if (ec || alive.expired()) return;
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      bool found = false;
      for (auto& [name, function] : functions_) {
        for (auto& [id, instance] : function->instances) {
          if (instance.worker->pid() == pid) {
            instance.worker->on_exit(status);
            found = true;
            break;
          }
        }
        if (found) break;
      }
    }
    reap();
  });
}

void Router::scale_down() {
  const Clock::time_point now = Clock::now();
  // Requests waiting for a node: served once one answers, answered 503 once they waited too long.
  const bool node_up =
      std::any_of(nodes_.begin(), nodes_.end(), [](const auto& node) { return node->up(); });
  for (auto& [name, function] : functions_) {
    const bool waiting = std::any_of(function->queue.begin(), function->queue.end(),
                                     [](const auto& i) { return i->node_wait_until.has_value(); });
    if (!waiting) continue;
    if (node_up) {
      pump(*function);
    } else {
      expire_node_waits(*function, false);
    }
  }
  for (auto& [name, function] : functions_) {
    for (auto& [id, instance] : function->instances) {
      if (instance.scaled_down) continue;
      Worker& worker = *instance.worker;
      if (!worker.ready() && !instance.became_ready &&
          now - instance.spawned > options_.worker_start_timeout) {
        worker.stop("did not connect within " +
                    std::to_string(options_.worker_start_timeout.count()) + " ms");
        continue;
      }
      if (!worker.ready() || instance.busy > 0) continue;
      const bool stale = instance.generation != function->generation;
      // An attached worker is not scaled to zero: nobody would start it again. A stale one
      // is closed, and attaches again under the new registration.
      if (stale ||
          (!worker.attached() && now - instance.idle_since >= function->spec.idle_timeout)) {
        instance.scaled_down = true;
        worker.stop(stale ? "replaced by a newer registration" : "idle: scaled to zero");
        LOG(INFO) << "function " << name << ": worker #" << id
                  << (stale ? " replaced (new registration)" : " scaled down after idling");
      }
    }
    // Backed-off starts and queues behind stale workers.
    if (!function->queue.empty()) pump(*function);
    if (function->spec.external && !function->queue.empty()) expire_unattached(*function, now);
  }
  for (auto it = async_results_.begin(); it != async_results_.end();) {
    it = it->second.done && it->second.expires < now ? async_results_.erase(it) : std::next(it);
  }
  housekeeping_.expires_after(std::chrono::milliseconds(200));
  housekeeping_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
    if (!ec && !alive.expired()) scale_down();
  });
}

void Router::requeue(const std::shared_ptr<Invocation>& invocation, const std::string& why,
                     bool stop_worker) {
  // Bounds: a worker without a session is replaced a few times; a lost node is waited for until
  // --node_wait_ms after it was first lost, retried every 200 ms.
  constexpr int kMaxWorkerRequeues = 3;
  constexpr std::chrono::milliseconds kLostNodeRetry{200};
  const Clock::time_point now = Clock::now();
  // The lost node's request, if it had one, went with it: nothing to give back.
  invocation->hiberd_request.reset();
  Function* function = find(invocation->function);
  if (!invocation->node_wait_until) invocation->node_wait_until = now + options_.node_wait;
  if (function == nullptr || invocation->answered ||
      (stop_worker && invocation->requeued >= kMaxWorkerRequeues) ||
      (!stop_worker && *invocation->node_wait_until <= now)) {
    return finish(invocation, retry_later(503, why), true);
  }
  if (invocation->instance) {
    auto it = function->instances.find(*invocation->instance);
    if (it != function->instances.end()) {
      Instance& instance = it->second;
      if (instance.busy > 0) --instance.busy;
      instance.idle_since = Clock::now();
      if (stop_worker && !instance.scaled_down && !instance.worker->attached()) {
        LOG(WARNING) << "function " << function->spec.name << ": stopping worker "
                     << instance.worker->instance() << ", whose hiberd session is gone (" << why
                     << ")";
        instance.scaled_down = true;
        instance.worker->stop("its hiberd session is gone");
      }
    }
  }
  invocation->instance.reset();
  invocation->started.reset();
  if (stop_worker) {
    ++invocation->requeued;
  } else {
    invocation->retry_at = now + kLostNodeRetry;
  }
  function->queue.push_front(invocation);
  pump(*function);
}

void Router::expire_node_waits(Function& function, bool all) {
  const Clock::time_point now = Clock::now();
  std::deque<std::shared_ptr<Invocation>> waiting;
  for (auto& invocation : function.queue) {
    if (!invocation->node_wait_until) invocation->node_wait_until = now + options_.node_wait;
    if (all || *invocation->node_wait_until <= now) {
      answer(*invocation, retry_later(503, "no hiberd node answers"));
    } else {
      waiting.push_back(std::move(invocation));
    }
  }
  function.queue.swap(waiting);
}

void Router::replace_unresumed_workers(size_t node) {
  NodeView& view = node_views_[node];
  const bool late = view.resume_by && Clock::now() >= *view.resume_by;
  bool waiting = false;
  for (auto& [fn, function] : functions_) {
    for (auto& [id, instance] : function->instances) {
      if (instance.node != node || instance.scaled_down || instance.worker->attached() ||
          !function->spec.shim) {
        continue;
      }
      if (view.refused_resumes.count(instance.worker->instance_key()) != 0) {
        // hiberd could not resume its session: it cannot use the GPU any more.
        instance.scaled_down = true;
        instance.worker->stop("its node " + nodes_[node]->config().name +
                              " restarted and could not resume its session");
        continue;
      }
      if (!view.lost_at || instance.spawned >= *view.lost_at ||
          view.session_instances.count(instance.worker->instance_key()) != 0) {
        continue;
      }
      if (!late) {
        waiting = true;
        continue;
      }
      instance.scaled_down = true;
      instance.worker->stop("its session did not come back within --worker_resume_ms after " +
                            nodes_[node]->config().name + " restarted or went down");
    }
  }
  if (late || !waiting) {
    view.lost_at.reset();
    view.resume_by.reset();
  }
}

void Router::register_everywhere(const FunctionSpec& spec) {
  for (auto& node : nodes_) {
    node->call(spec.registration(), [name = spec.name,
                                     node = node->config().name](Result<wire::control::Reply> r) {
      if (!registered(r)) {
        LOG(WARNING) << "registering " << name << " with " << node << ": " << r.status();
      }
    });
  }
}

void Router::poll_nodes() {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i]->status([this, i, alive = std::weak_ptr<bool>(alive_)](Result<wire::Message> reply) {
      if (alive.expired()) return;
      NodeView& view = node_views_[i];
      const std::string& name = nodes_[i]->config().name;
      if (!reply.ok()) {
        if (view.up) {
          LOG(WARNING) << "node " << name << " is down: " << reply.status();
          // Its workers wait for it to come back (a hiberd restarting); past
          // --worker_resume_ms they are replaced, so that requests start workers elsewhere.
          // A node that stays down: its workers move while the requests waiting for it
          // (--node_wait_ms each) still wait, so those are answered elsewhere.
          view.lost_at = Clock::now();
          view.resume_by = *view.lost_at + std::min<Clock::duration>(options_.worker_resume,
                                                                     options_.node_wait * 4 / 5);
        }
        view.up = false;
        view.registered = false;
        view.session_instances.clear();
        metrics_.set_node_up(name, false);
        replace_unresumed_workers(i);
        return;
      }
      NodeView fresh;
      fresh.up = true;
      Status read = wire::read_message<wire::proto::ControlReply>(
          *reply, "status reply", [&](wire::proto::ControlReply::Reader r) -> Status {
            if (!r.isStatus()) {
              return error(ErrorCode::kInvalidValue, r.isError()
                                                         ? std::string(r.getError().getMessage())
                                                         : "not a status reply");
            }
            const auto status = r.getStatus();
            fresh.backend = status.getBackend();
            fresh.incarnation = status.getIncarnation();
            fresh.begins_requests = status.getServerVersion().getMajor() == 1 &&
                                    status.getServerVersion().getMinor() >= 13;
            fresh.uptime_seconds = status.getUptimeSeconds();
            fresh.queued = status.getScheduler().getQueued();
            fresh.shed = status.getScheduler().getShed();
            fresh.preemptions = status.getScheduler().getPreemptions();
            for (const auto key : status.getRefusedResumes()) fresh.refused_resumes.insert(key);
            for (const auto session : status.getSessions()) {
              if (session.getInstance().size() > 0) {
                fresh.session_instances.insert(session.getInstance());
              }
            }
            std::map<uint32_t, std::vector<std::string>> resident;
            for (const auto f : status.getFunctions()) {
              for (const uint32_t gpu : f.getResidentGpus()) {
                resident[gpu].push_back(f.getFunctionId());
                fresh.resident.insert(f.getFunctionId());
              }
            }
            for (const auto d : status.getDevices()) {
              fresh.gpus.push_back({{"ordinal", d.getOrdinal()},
                                    {"name", std::string(d.getName())},
                                    {"running", std::string(d.getRunningFunction())},
                                    {"resident", resident[d.getOrdinal()]},
                                    {"pool_bytes", d.getPoolBytes()},
                                    {"pool_used_bytes", d.getPoolAllocatedBytes()},
                                    {"fragmentation", d.getPoolFragmentation()},
                                    {"healthy", d.getHealthy()},
                                    {"drained", d.getDrained()}});
            }
            return Status();
          });
      if (!read.ok()) {
        LOG(WARNING) << "node " << name << ": " << read;
        return;
      }
      if (!view.up) LOG(INFO) << "node " << name << " is up (" << fresh.backend << ")";
      fresh.registered = view.registered;
      // A hiberd killed and restarted between two polls answers them both: only its
      // incarnation tells that it forgot every registration.
      if (view.up && fresh.incarnation != view.incarnation && view.incarnation != 0) {
        LOG(WARNING) << "node " << name << " restarted (incarnation " << view.incarnation << " -> "
                     << fresh.incarnation << "): registering every function with it again";
        fresh.registered = false;
        // Sessions opened before the new hiberd started ended with the old one; their shims
        // resume them with the new one (ones spawned since may hold a new session already).
        const Clock::time_point restarted =
            Clock::now() - std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(fresh.uptime_seconds));
        if (!view.lost_at || *view.lost_at > restarted) view.lost_at = restarted;
        view.resume_by = Clock::now() + options_.worker_resume;
      }
      fresh.lost_at = view.lost_at;
      fresh.resume_by = view.resume_by;
      view = std::move(fresh);
      replace_unresumed_workers(i);
      metrics_.set_node_up(name, true);
      if (!view.registered) {
        // A node that came (back) up learns every function; one that restarted forgot them.
        view.registered = true;
        for (const auto& [fn, function] : functions_) {
          if (!function->unloading) register_everywhere(function->spec);
        }
      }
    });
  }
  poll_timer_.expires_after(options_.status_interval);
  poll_timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
    if (!ec && !alive.expired()) poll_nodes();
  });
}

void Router::shutdown(std::function<void()> done) {
  shutting_down_ = true;
  attach_.reset();  // no more workers attach
  size_t live = 0;
  for (auto& [name, function] : functions_) {
    for (auto& [id, instance] : function->instances) {
      instance.scaled_down = true;
      instance.worker->stop("the router is stopping");
      ++live;
    }
  }
  LOG(INFO) << "router stopping: " << live << " workers to stop";
  // Polls until every worker is gone, or the stop timeout (plus a margin) passed.
  auto deadline = Clock::now() + options_.worker_stop_timeout + std::chrono::seconds(1);
  auto check = std::make_shared<std::function<void()>>();
  auto timer = std::make_shared<asio::steady_timer>(io_);
  *check = [this, deadline, timer, check, done = std::move(done)]() mutable {
    bool any = false;
    for (auto& [name, function] : functions_) any |= !function->instances.empty();
    if (!any || Clock::now() > deadline) {
      housekeeping_.cancel();
      poll_timer_.cancel();
      error_code ignored;
      child_signals_.cancel(ignored);
      auto finish = std::move(done);
      *check = nullptr;  // breaks the cycle
      finish();
      return;
    }
    timer->expires_after(std::chrono::milliseconds(20));
    timer->async_wait([check](error_code) {
      if (*check) (*check)();
    });
  };
  (*check)();
}

}  // namespace hiber::router
