// The router's HTTP API (docs/router.md): health and metadata, inference, the model
// repository (load, unload, index) and the status report. The invocation pipeline they feed is
// router.cc's.
#include "router/router.h"

#include <algorithm>
#include <cmath>

#include <glog/logging.h>

#include "common/build_info.h"
#include "common/token.h"
#include "router/router_internal.h"

namespace hiber::router {
using detail::Clock;
using detail::kRateWindow;
using detail::media_type;
using detail::retry_later;
using detail::status_for;
using detail::wall_seconds;
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using nlohmann::json;

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
  // A function without the shim uses no GPU: it runs whether or not a node answers. One with
  // it waits up to --node_wait_ms for a node (a hiberd restarting).
  const bool no_node =
      function->spec.shim &&
      std::none_of(nodes_.begin(), nodes_.end(), [](const auto& node) { return node->up(); });
  if (no_node && options_.node_wait.count() == 0) {
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
  if (no_node) invocation->node_wait_until = invocation->arrival + options_.node_wait;
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

}  // namespace hiber::router
