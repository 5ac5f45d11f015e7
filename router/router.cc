#include "router/router.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "common/build_info.h"
#include "common/token.h"
#include "scheduler/cluster_balancer.h"
#include "wire/schema/control.capnp.h"

namespace hiber::router {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;
using nlohmann::json;

constexpr size_t kLatencyWindow = 2048;  // recent answers per function, for p50 and p99
// The window of a function's request rate (`rps` in /v2/status): answers in the last 10 s.
constexpr std::chrono::seconds kRateWindow{10};
constexpr size_t kRecentSwaps = 50;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Splits "/a/b/c" into {"a", "b", "c"}.
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < path.size()) {
    if (path[start] == '/') {
      ++start;
      continue;
    }
    const size_t end = path.find('/', start);
    parts.push_back(path.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end;
  }
  return parts;
}

// The media type of a Content-Type value, lower case, without parameters.
std::string media_type(const std::string& content_type) {
  std::string type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return type;
}

// Transport failures make a node unreachable (503, retry); anything else hiberd said is the
// request's own failure.
unsigned status_for(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kDeinitialized:
    case ErrorCode::kTimeout:
    case ErrorCode::kNoDevice:
    case ErrorCode::kDeviceUnavailable: return 503;
    default: return 500;
  }
}

// hiberd's admission (--shed) answers requestStart so when the request cannot meet its deadline
// (node::NodeCore::reject): the node is busy, not broken.
bool overloaded(const Status& status) {
  return status.code() == ErrorCode::kDeviceUnavailable &&
         status.message().rfind("overloaded:", 0) == 0;
}

ApiResponse retry_later(unsigned status, std::string_view message) {
  ApiResponse response = error_response(status, message);
  response.headers.emplace_back("Retry-After", "1");
  return response;
}

// After `failures` failed starts in a row: 1 s, 2 s, 4 s ... up to 30 s.
std::chrono::milliseconds backoff(int failures) {
  return std::min<std::chrono::milliseconds>(
      std::chrono::milliseconds(500) * (1 << std::min(failures, 6)), std::chrono::seconds(30));
}

// 401 for a management call without the operator's token (RFC 6750's answer to a missing or
// wrong bearer token).
ApiResponse unauthorized(bool presented) {
  ApiResponse response = error_response(
      401, presented ? "the operator token presented is not this router's"
                     : "this call needs the operator's credential: Authorization: Bearer <the "
                       "token in hiber-router's --operator_token_file>");
  response.headers.emplace_back("WWW-Authenticate",
                                presented ? R"(Bearer realm="hiber-router", error="invalid_token")"
                                          : R"(Bearer realm="hiber-router")");
  return response;
}

// The token of an "Authorization: Bearer <token>" header, or none.
std::optional<std::string_view> bearer_token(const ApiRequest& request) {
  const std::string& value = request.header("authorization");
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return std::nullopt;
  }
  std::string_view token = std::string_view(value).substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank.
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

}  // namespace

struct Router::Invocation {
  std::string id;          // the router's: worker protocol and asynchronous result id
  std::string request_id;  // X-Request-Id
  // The JSON request's "id": its answer's "id" (the protocol's), whatever the worker wrote.
  std::optional<std::string> client_id;
  std::string function;
  std::string content_type;
  std::string body;
  // A request in the binary tensor data extension: its JSON's length at the body's start.
  std::optional<uint64_t> inference_header_bytes;
  Clock::time_point arrival;
  std::optional<Clock::time_point> deadline;
  Respond respond;  // empty for an asynchronous invocation
  bool answered = false;
  std::unique_ptr<asio::steady_timer> deadline_timer;
  // Once it has left the router's queue.
  std::optional<uint64_t> instance;
  size_t node = 0;
  std::optional<uint64_t> hiberd_request;
  std::optional<wire::Started> started;
  bool shed = false;  // hiberd answered its start "overloaded"
  // The worker answered that the request was the client's mistake (a 4xx of its choosing).
  bool client_error = false;
  Clock::time_point dispatched;
  Clock::time_point started_at;
};

struct Router::Instance {
  std::unique_ptr<Worker> worker;
  size_t node = 0;
  uint64_t generation = 0;   // the registration it was started with
  size_t busy = 0;           // requests given to it, from hiberd's arrival to done
  bool scaled_down = false;  // stopped by the router, not lost
  bool became_ready = false;
  Clock::time_point spawned;
  Clock::time_point idle_since;
};

struct Router::Function {
  FunctionSpec spec;
  uint64_t generation = 0;
  bool unloading = false;
  std::deque<std::shared_ptr<Invocation>> queue;
  std::map<uint64_t, Instance> instances;
  // Start failures in a row, and when the next start may be tried.
  int start_failures = 0;
  Clock::time_point next_start;
  std::string last_start_error;
  // Answers.
  // rejected: by the router (its queue full, no node up); shed: by hiberd, as overloaded.
  uint64_t requests = 0, ok = 0, failed = 0, on_time = 0, rejected = 0, shed = 0;
  std::deque<double> latencies_ms;
  std::deque<Clock::time_point> answered_at;  // of `requests`, the last kRateWindow's
};

struct Router::NodeView {
  bool up = false;
  bool registered = false;  // every function was registered since it last came up
  std::string backend;
  uint64_t queued = 0;
  uint64_t shed = 0;         // hiberd's requests answered "overloaded"
  uint64_t preemptions = 0;  // and background leases ended at their slice
  json gpus = json::array();
  std::set<std::string> resident;  // functions with a model resident on one of its GPUs
};

struct Router::AsyncResult {
  bool done = false;
  ApiResponse response;
  Clock::time_point expires;
};

struct Router::Swap {
  double time;
  std::string function;
  std::string node;
  wire::Started started;
};

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

// ---- The API ----

bool Router::from_operator(const ApiRequest& request) const {
  const std::optional<std::string_view> token = bearer_token(request);
  return token && tokens_equal(*token, options_.operator_token);
}

void Router::handle(ApiRequest request, Respond respond) {
  const std::vector<std::string> parts = split_path(request.path);
  const std::string& method = request.method;
  const bool operator_call = from_operator(request);
  // The repository API changes what the node runs: the operator's alone.
  if (parts.size() >= 2 && parts[0] == "v2" && parts[1] == "repository" && !operator_call) {
    return respond(unauthorized(bearer_token(request).has_value()));
  }
  auto is = [&](std::initializer_list<const char*> want) {
    if (parts.size() != want.size()) return false;
    size_t i = 0;
    for (const char* w : want) {
      if (*w != '*' && parts[i] != w) return false;
      ++i;
    }
    return true;
  };
  auto only = [&](const char* allowed) {
    if (method == allowed) return true;
    ApiResponse response = error_response(405, "method not allowed");
    response.headers.emplace_back("Allow", allowed);
    respond(std::move(response));
    return false;
  };
  // HEAD answers as GET without the body (the HTTP server drops it): for health probes.
  auto get_or_head = [&]() {
    if (method == "GET" || method == "HEAD") return true;
    ApiResponse response = error_response(405, "method not allowed");
    response.headers.emplace_back("Allow", "GET, HEAD");
    respond(std::move(response));
    return false;
  };
  if (is({"v2", "health", "live"})) {
    if (get_or_head()) respond(ApiResponse{200, "application/json", {}, R"({"live":true})"});
    return;
  }
  if (is({"v2", "health", "ready"})) {
    if (!get_or_head()) return;
    const bool ready =
        std::any_of(nodes_.begin(), nodes_.end(), [](const auto& node) { return node->up(); }) &&
        std::any_of(node_views_.begin(), node_views_.end(),
                    [](const NodeView& view) { return view.up; });
    respond(ready ? ApiResponse{200, "application/json", {}, R"({"ready":true})"}
                  : retry_later(503, "no hiberd node answers"));
    return;
  }
  if (is({"v2"})) {
    if (only("GET")) {
      respond(ApiResponse{
          200,
          "application/json",
          {},
          json{{"name", "hiber-router"},
               {"version", build_version()},
               {"extensions", {"model_repository", "binary_tensor_data", "async", "status"}}}
              .dump()});
    }
    return;
  }
  if (is({"v2", "status"})) {
    if (only("GET")) respond(ApiResponse{200, "application/json", {}, status_json()});
    return;
  }
  if (is({"v2", "repository", "index"})) {
    if (method == "GET" || method == "POST") {
      respond(repository_index());
    } else {
      only("POST");
    }
    return;
  }
  if (is({"v2", "repository", "models", "*", "load"})) {
    if (only("POST")) load(parts[3], request, std::move(respond));
    return;
  }
  if (is({"v2", "repository", "models", "*", "unload"})) {
    if (only("POST")) unload(parts[3], std::move(respond));
    return;
  }
  if (is({"v2", "invocations", "*"})) {
    if (only("GET")) async_result(parts[2], std::move(respond));
    return;
  }
  if (parts.size() >= 3 && parts[0] == "v2" && parts[1] == "models") {
    // KServe also has /v2/models/{fn}/versions/{v}/...: a function has one version.
    std::vector<std::string> rest(parts.begin() + 3, parts.end());
    if (rest.size() >= 2 && rest[0] == "versions") rest.erase(rest.begin(), rest.begin() + 2);
    const std::string& name = parts[2];
    Function* function = find(name);
    if (rest.empty()) {
      if (!only("GET")) return;
      respond(function != nullptr ? metadata(*function, operator_call) : unknown_function(name));
      return;
    }
    if (rest.size() == 1 && rest[0] == "ready") {
      if (!get_or_head()) return;
      if (function == nullptr && registry_.find_unloaded(name) != nullptr) {
        return respond(ApiResponse{
            400,
            "application/json",
            {},
            json{{"name", name}, {"ready", false}, {"error", unloaded_message(name)}}.dump()});
      }
      if (function == nullptr) return respond(unknown_function(name));
      // The protocol's answer: 200 ready, a 4xx not.
      const std::optional<std::string> why_not = not_ready(*function);
      json body = {{"name", name}, {"ready", !why_not}};
      if (why_not) body["error"] = *why_not;
      respond(ApiResponse{why_not ? 400u : 200u, "application/json", {}, body.dump()});
      return;
    }
    if (rest.size() == 1 && rest[0] == "infer") {
      if (only("POST")) infer(name, std::move(request), std::move(respond));
      return;
    }
  }
  respond(error_response(404, "no such endpoint: " + method + " " + request.path));
}

ApiResponse Router::metadata(const Function& function, bool operator_call) const {
  json parameters = function.spec.to_json();
  parameters.erase("env");  // may hold secrets
  // The command says what runs as the router's user, and where: the operator's to read.
  if (!operator_call) parameters.erase("command");
  parameters.erase("inputs");  // served as the metadata's own
  parameters.erase("outputs");
  const std::optional<std::string> why_not = not_ready(function);
  parameters["ready"] = !why_not;
  if (why_not) parameters["last_start_error"] = *why_not;
  json inputs = json::array(), outputs = json::array();
  for (const TensorSpec& t : function.spec.inputs) inputs.push_back(t.to_json());
  for (const TensorSpec& t : function.spec.outputs) outputs.push_back(t.to_json());
  const json body = {{"name", function.spec.name}, {"versions", json::array({"1"})},
                     {"platform", "hiber"},        {"inputs", inputs},
                     {"outputs", outputs},         {"parameters", parameters}};
  return ApiResponse{200, "application/json", {}, body.dump()};
}

std::optional<std::string> Router::not_ready(const Function& function) const {
  if (function.start_failures == 0) return std::nullopt;
  for (const auto& [id, instance] : function.instances) {
    if (instance.worker->ready()) return std::nullopt;
  }
  return function.last_start_error;
}

ApiResponse Router::repository_index() const {
  std::map<std::string, json> entries;
  for (const auto& [name, function] : functions_) {
    bool warm = false;
    for (const auto& [id, instance] : function->instances) warm |= instance.worker->ready();
    const char* state = function->unloading ? "UNLOADING" : warm ? "READY" : "IDLE";
    const char* reason = function->unloading ? "its workers are stopping"
                         : warm              ? ""
                                             : "scaled to zero: a worker starts on demand";
    entries[name] = {{"name", name}, {"version", "1"}, {"state", state}, {"reason", reason}};
  }
  for (const auto& [name, spec] : registry_.unloaded()) {
    if (entries.count(name) > 0) continue;  // unloading: listed above
    entries[name] = {
        {"name", name}, {"version", "1"}, {"state", "UNAVAILABLE"}, {"reason", "unloaded"}};
  }
  json index = json::array();
  for (auto& [name, entry] : entries) index.push_back(std::move(entry));
  return ApiResponse{200, "application/json", {}, index.dump()};
}

std::string Router::unloaded_message(const std::string& name) {
  return "function \"" + name + "\" is unloaded: POST /v2/repository/models/" + name +
         "/load loads it again";
}

ApiResponse Router::unknown_function(const std::string& name) const {
  // An unloaded function is still in the repository: asking for it is a request it cannot
  // serve now, not one for a name that does not exist.
  if (registry_.find_unloaded(name) != nullptr) return error_response(400, unloaded_message(name));
  return error_response(404, "function \"" + name + "\" is not registered");
}

void Router::infer(const std::string& name, ApiRequest request, Respond respond) {
  Function* function = find(name);
  if (function == nullptr) return respond(unknown_function(name));
  // A client's mistake: answered 400 here, counted as rejected, never reaching the worker nor
  // counting against the function.
  const auto reject = [&](std::string_view why) {
    ++function->rejected;
    metrics_.rejected(name, 400);
    respond(error_response(400, why));
  };
  std::string content_type = request.header("content-type");
  if (content_type.empty()) content_type = "application/octet-stream";
  std::optional<std::string> client_id;
  std::optional<uint64_t> inference_header_bytes;
  if (const std::string header_bytes = request.header("inference-header-content-length");
      !header_bytes.empty()) {
    // The binary tensor data extension: the body's first header_bytes are the JSON request,
    // the tensors' bytes follow.
    Result<BinaryExtensionHeader> header = binary_extension_header(request.body, header_bytes);
    if (!header.ok()) return reject(header.status().message());
    Result<CheckedInference> checked =
        check_inference_request(header->json, function->spec.inputs, function->spec.outputs,
                                std::string_view(request.body).substr(header->bytes));
    if (!checked.ok()) return reject(checked.status().message());
    client_id = std::move(checked->id);
    inference_header_bytes = header->bytes;
  } else if (media_type(content_type) == "application/json") {
    const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return reject("the body is not JSON (an inference request)");
    Result<CheckedInference> checked =
        check_inference_request(body, function->spec.inputs, function->spec.outputs);
    if (!checked.ok()) return reject(checked.status().message());
    client_id = std::move(checked->id);
  } else if (!function->spec.inputs.empty() &&
             media_type(content_type) != "application/octet-stream") {
    // A function that declares its tensors takes inference requests; raw bodies of the
    // caller's own type go only to functions that declare none.
    return reject("this function declares its inputs: send an inference request " +
                  std::string("(Content-Type: application/json, or the binary tensor data ") +
                  "extension with Inference-Header-Content-Length), not " +
                  media_type(content_type));
  }
  std::optional<Clock::time_point> deadline;
  if (const std::string& ms = request.header("x-hiber-deadline-ms"); !ms.empty()) {
    char* end = nullptr;
    const double value = std::strtod(ms.c_str(), &end);
    if (end == ms.c_str() || *end != '\0' || !std::isfinite(value) || value <= 0 || value > 1e9) {
      return reject("X-Hiber-Deadline-Ms must be a positive number of ms");
    }
    deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(value * 1000));
  }
  if (function->queue.size() >= options_.max_queue) {
    ++function->rejected;
    metrics_.rejected(name, 429);
    return respond(retry_later(429, "function \"" + name + "\" has " +
                                        std::to_string(function->queue.size()) +
                                        " requests waiting at the router"));
  }
  // A function without the shim uses no GPU: it runs whether or not a node answers.
  if (function->spec.shim &&
      std::none_of(nodes_.begin(), nodes_.end(), [](const auto& node) { return node->up(); })) {
    ++function->rejected;
    metrics_.rejected(name, 503);
    return respond(retry_later(503, "no hiberd node answers"));
  }
  const bool async = request.header("prefer").find("respond-async") != std::string::npos;
  if (async && async_results_.size() >= options_.max_async_results) {
    return respond(retry_later(503, "too many asynchronous results are waiting to be collected"));
  }

  // 128 random bits: nobody can guess another caller's asynchronous result, and no id repeats
  // after a restart.
  Result<std::string> id = random_hex(16);
  if (!id.ok()) return respond(error_response(500, id.status().message()));
  auto invocation = std::make_shared<Invocation>();
  invocation->id = std::move(*id);
  invocation->request_id = request.header("x-request-id");
  if (invocation->request_id.empty()) invocation->request_id = "hiber-" + invocation->id;
  invocation->function = name;
  invocation->client_id = std::move(client_id);
  invocation->content_type = std::move(content_type);
  invocation->body = std::move(request.body);
  invocation->inference_header_bytes = inference_header_bytes;
  invocation->arrival = Clock::now();
  invocation->deadline = deadline;
  if (async) {
    async_results_[invocation->id] = AsyncResult{false, {}, {}};
    ApiResponse accepted{202, "application/json", {}, json{{"id", invocation->id}}.dump()};
    accepted.headers.emplace_back("Location", "/v2/invocations/" + invocation->id);
    accepted.headers.emplace_back("X-Request-Id", invocation->request_id);
    respond(std::move(accepted));
  } else {
    invocation->respond = std::move(respond);
  }
  if (deadline) {
    invocation->deadline_timer = std::make_unique<asio::steady_timer>(io_, *deadline);
    invocation->deadline_timer->async_wait([this, weak = std::weak_ptr<Invocation>(invocation),
                                            alive = std::weak_ptr<bool>(alive_)](error_code ec) {
      if (ec || alive.expired()) return;
      if (auto invocation = weak.lock()) expire(invocation);
    });
  }
  function->queue.push_back(std::move(invocation));
  pump(*function);
}

void Router::async_result(const std::string& id, Respond respond) {
  auto it = async_results_.find(id);
  if (it == async_results_.end()) {
    return respond(error_response(
        404, "no asynchronous invocation " + id + " (unknown, expired or already collected)"));
  }
  if (!it->second.done) {
    ApiResponse pending{202, "application/json", {}, json{{"id", id}, {"done", false}}.dump()};
    pending.headers.emplace_back("Retry-After", "1");
    return respond(std::move(pending));
  }
  ApiResponse response = std::move(it->second.response);
  async_results_.erase(it);
  respond(std::move(response));
}

// ---- Registration ----

void Router::load(const std::string& name, const ApiRequest& request, Respond respond) {
  FunctionSpec spec;
  if (std::all_of(request.body.begin(), request.body.end(),
                  [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; })) {
    // No body: the repository's registration, loaded again (the protocol's load of a model
    // the repository holds).
    const FunctionSpec* known = registry_.find(name);
    if (known == nullptr) known = registry_.find_unloaded(name);
    if (known == nullptr) {
      return respond(error_response(
          404, "function \"" + name + "\" is not in the repository: send its registration"));
    }
    spec = *known;
  } else {
    Result<FunctionSpec> parsed = parse_function_spec(name, request.body);
    if (!parsed.ok()) return respond(error_response(400, parsed.status().message()));
    spec = std::move(*parsed);
  }
  if (!spec.external) {
    // Only a program the operator listed runs; one that does not exist is refused now, not at
    // the first request.
    Result<std::string> program = options_.worker_programs.resolve(spec.command[0]);
    if (!program.ok()) {
      const bool forbidden = program.status().code() == ErrorCode::kNotPermitted;
      return respond(error_response(forbidden ? 403 : 400, program.status().message()));
    }
  }
  auto existing = functions_.find(name);
  if (existing != functions_.end() && existing->second->unloading) {
    return respond(retry_later(409, "function \"" + name + "\" is being unloaded"));
  }
  if (existing != functions_.end()) {
    const FunctionSpec& old = existing->second->spec;
    const auto fixed = [](const FunctionSpec& s) {
      return std::tuple(s.slo_ms, s.percentile, s.quota_mib, s.stateful, s.exec_ms_hint, s.heavy);
    };
    if (fixed(old) != fixed(spec)) {
      return respond(error_response(409, "function \"" + name +
                                             "\" is loaded with another SLO, percentile, quota, "
                                             "statefulness or hint; unload it first"));
    }
  }
  if (Status saved = registry_.put(spec); !saved.ok()) {
    return respond(error_response(500, "cannot save the registration: " + saved.message()));
  }
  Function* function;
  if (existing != functions_.end()) {
    function = existing->second.get();
    function->spec = spec;
    ++function->generation;  // its workers are replaced as they become idle
    function->start_failures = 0;
    function->next_start = {};
  } else {
    auto created = std::make_unique<Function>();
    created->spec = spec;
    function = created.get();
    functions_.emplace(name, std::move(created));
  }
  LOG(INFO) << "loaded function " << name << ": " << spec.to_json().dump();
  // hiberd must know the function before its first request: answer once every reachable node
  // has it. A node that is down gets it when it comes back.
  auto remaining = std::make_shared<size_t>(nodes_.size());
  auto refusals = std::make_shared<std::vector<std::string>>();
  auto reply = std::make_shared<Respond>(std::move(respond));
  for (auto& node : nodes_) {
    node->call(spec.registration(), [remaining, refusals, reply, name,
                                     node = node.get()](Result<wire::control::Reply> answer) {
      if (!answer.ok() && status_for(answer.status()) != 503 &&
          answer.status().message().find("already registered") == std::string::npos) {
        refusals->push_back(node->config().name + ": " + answer.status().message());
      }
      if (--*remaining > 0) return;
      if (!refusals->empty()) {
        std::string message = "hiberd refused the registration:";
        for (const std::string& r : *refusals) message += " " + r + ";";
        (*reply)(error_response(400, message));
        return;
      }
      (*reply)(ApiResponse{200, "application/json", {}, json{{"name", name}}.dump()});
    });
  }
}

void Router::unload(const std::string& name, Respond respond) {
  Function* function = find(name);
  if (function == nullptr && registry_.find_unloaded(name) != nullptr) {
    // Already unloaded (or on its way): nothing changes.
    return respond(ApiResponse{200, "application/json", {}, json{{"name", name}}.dump()});
  }
  if (function == nullptr) {
    return respond(error_response(404, "function \"" + name + "\" is not registered"));
  }
  if (Status moved = registry_.unload(name); !moved.ok()) {
    return respond(error_response(500, "cannot unload the registration: " + moved.message()));
  }
  function->unloading = true;
  fail_queue(*function, error_response(503, "function \"" + name + "\" was unloaded"));
  for (auto& [id, instance] : function->instances) {
    instance.scaled_down = true;
    instance.worker->stop("unloaded");
  }
  LOG(INFO) << "unloading function " << name;
  respond(ApiResponse{200, "application/json", {}, json{{"name", name}}.dump()});
  // hiberd forgets it once its sessions are gone: on_worker_gone finishes the unload.
  if (function->instances.empty()) on_worker_gone(name, 0);
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
  while (!function.queue.empty()) {
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
    fail_queue(function, retry_later(503, "no hiberd node answers"));
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
  NodeClient& node = *nodes_[instance.node];
  node.call(
      wire::control::RequestArrived{function.spec.name, instance.worker->instance_key()},
      [this, invocation, alive = std::weak_ptr<bool>(alive_)](Result<wire::control::Reply> reply) {
        if (alive.expired()) return;
        const auto* accepted = reply.ok() ? std::get_if<wire::control::Accepted>(&*reply) : nullptr;
        if (accepted == nullptr) {
          const Status why =
              reply.ok() ? error(ErrorCode::kInvalidValue, "hiberd answered requestArrived oddly")
                         : reply.status();
          return finish(invocation, retry_later(status_for(why), "hiberd: " + why.message()), true);
        }
        invocation->hiberd_request = accepted->request_id;
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

void Router::on_started(const std::shared_ptr<Invocation>& invocation,
                        Result<wire::Started> started) {
  if (!started.ok()) {
    const Status& why = started.status();
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

void Router::register_everywhere(const FunctionSpec& spec) {
  for (auto& node : nodes_) {
    node->call(spec.registration(), [name = spec.name,
                                     node = node->config().name](Result<wire::control::Reply> r) {
      if (!r.ok() && r.status().message().find("already registered") == std::string::npos) {
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
          // Its workers cannot reach a GPU: stop them, so that requests start workers elsewhere.
          for (auto& [fn, function] : functions_) {
            for (auto& [id, instance] : function->instances) {
              // An attached worker cannot move: it stays, and its requests fail until the node
              // is back.
              // One without the shim never reaches a GPU: it goes on.
              if (instance.node != i || instance.scaled_down || instance.worker->attached() ||
                  !function->spec.shim) {
                continue;
              }
              instance.scaled_down = true;
              instance.worker->stop("its node " + name + " is down");
            }
          }
        }
        view.up = false;
        view.registered = false;
        metrics_.set_node_up(name, false);
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
            fresh.queued = status.getScheduler().getQueued();
            fresh.shed = status.getScheduler().getShed();
            fresh.preemptions = status.getScheduler().getPreemptions();
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
      view = std::move(fresh);
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

double Router::requests_per_second(const Function& function) const {
  const Clock::time_point since = Clock::now() - kRateWindow;
  const auto recent = std::count_if(function.answered_at.begin(), function.answered_at.end(),
                                    [&](Clock::time_point t) { return t >= since; });
  return static_cast<double>(recent) / std::chrono::duration<double>(kRateWindow).count();
}

std::string Router::status_json() const {
  json functions = json::array();
  for (const auto& [name, function] : functions_) {
    if (function->unloading) continue;
    std::vector<double> latencies(function->latencies_ms.begin(), function->latencies_ms.end());
    size_t busy = 0;
    for (const auto& [id, instance] : function->instances) busy += instance.busy;
    functions.push_back({{"name", name},
                         {"slo_ms", function->spec.slo_ms},
                         {"external", function->spec.external},
                         {"requests", function->requests},
                         {"rps", requests_per_second(*function)},
                         {"ok", function->ok},
                         {"failed", function->failed},
                         {"on_time", function->on_time},
                         {"rejected", function->rejected},
                         {"shed", function->shed},
                         {"queued", function->queue.size()},
                         {"instances", function->instances.size()},
                         {"busy", busy},
                         // null, not 0, before a first successful answer: "-" to readers.
                         {"p50_ms", latencies.empty() ? json() : json(percentile(latencies, 0.50))},
                         {"p99_ms", latencies.empty() ? json() : json(percentile(latencies, 0.99))},
                         {"last_start_error", function->last_start_error}});
  }
  json nodes = json::array();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const NodeView& view = node_views_[i];
    nodes.push_back({{"name", nodes_[i]->config().name},
                     {"control", nodes_[i]->config().control},
                     {"up", view.up && nodes_[i]->up()},
                     {"backend", view.backend},
                     {"queued", view.queued},
                     {"shed", view.shed},
                     {"preemptions", view.preemptions},
                     {"gpus", view.gpus}});
  }
  json swaps = json::array();
  for (const Swap& swap : swaps_) {
    swaps.push_back({{"time", swap.time},
                     {"function", swap.function},
                     {"node", swap.node},
                     {"gpu", swap.started.gpu},
                     {"source", swap.started.source},
                     {"source_gpu", swap.started.source_gpu},
                     {"link", swap.started.link},
                     {"queued_ms", swap.started.queued_ms}});
  }
  return json{
      {"time", wall_seconds()}, {"functions", functions}, {"nodes", nodes}, {"swaps", swaps}}
      .dump();
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
