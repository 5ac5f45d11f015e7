#include "tools/router_ctl.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <thread>

#include "tools/top_view.h"

namespace hiber::tools {
namespace {

using nlohmann::json;
using router::HttpConnection;
using router::HttpResponse;

// A function name as one path segment: everything but unreserved characters percent-encoded.
std::string path_segment(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

int fail(const Status& s) { return fail_router_command(s); }

int fail_answer(std::string_view what, const HttpResponse& r) {
  std::fprintf(stderr, "hiberctl: %.*s: HTTP %d: %s\n", static_cast<int>(what.size()), what.data(),
               r.status, router_error_message(r).c_str());
  return 1;
}

Result<json> get_json(HttpConnection& router, const std::string& path,
                      std::chrono::milliseconds timeout) {
  HIBER_ASSIGN_OR_RETURN(HttpResponse r, router.request("GET", path, {}, {}, timeout));
  if (!r.ok()) {
    return error(ErrorCode::kInvalidValue, "GET ", path, ": HTTP ", r.status, ": ",
                 router_error_message(r));
  }
  json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return error(ErrorCode::kInvalidValue, "GET ", path, ": not JSON");
  return j;
}

// The answer of an invocation, as `infer` gives it.
int print_answer(const HttpResponse& r, const std::string& function) {
  for (const auto& [name, value] : r.headers) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (lower == "x-request-id" || lower.rfind("x-hiber-", 0) == 0) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), value.c_str());
    }
  }
  if (!r.ok()) return fail_answer(str_cat("invoke ", function), r);
  std::fwrite(r.body.data(), 1, r.body.size(), stdout);
  std::fflush(stdout);
  return 0;
}

// Columns of the controlling terminal, 0 when stdout is none.
size_t terminal_columns() {
  winsize w{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) != 0) return 0;
  return w.ws_col;
}

}  // namespace

int fail_router_command(const Status& s) {
  // The message alone: an HTTP client's errors have no CUDA error name to show.
  std::fprintf(stderr, "hiberctl: %s\n", s.message().c_str());
  return 1;
}

std::string router_error_message(const HttpResponse& response) {
  json j = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    auto it = j.find("error");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  std::string body = response.body;
  while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.pop_back();
  return body.empty() ? "(no message)" : body;
}

int ctl_functions(HttpConnection& router, std::chrono::milliseconds timeout) {
  auto index = get_json(router, "/v2/repository/index", timeout);
  if (!index.ok()) return fail(index.status());
  // The numbers are a bonus: a registry without them still prints.
  auto status = get_json(router, "/v2/status", timeout);
  if (!status.ok()) std::fprintf(stderr, "hiberctl: %s\n", status.status().to_string().c_str());
  auto text = render_functions(*index, status.ok() ? *status : json());
  if (!text.ok()) return fail(text.status());
  std::fputs(text->c_str(), stdout);
  return 0;
}

int ctl_invoke(HttpConnection& router, const InvokeOptions& o) {
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  router::HttpHeaders headers = {{"Content-Type", o.content_type}};
  if (!o.request_id.empty()) headers.emplace_back("X-Request-Id", o.request_id);
  if (o.deadline_ms > 0) headers.emplace_back("X-Hiber-Deadline-Ms", std::to_string(o.deadline_ms));
  if (o.async) headers.emplace_back("Prefer", "respond-async");
  const std::string path = "/v2/models/" + path_segment(o.function) + "/infer";
  auto r = router.request("POST", path, o.body, headers, o.timeout);
  if (!r.ok()) return fail(r.status());
  if (!o.async || r->status != 202) return print_answer(*r, o.function);

  json accepted = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  std::string poll;
  if (auto location = r->header("location");
      location && !location->empty() && location->front() == '/') {
    poll = *location;
  } else if (accepted.is_object() && accepted.contains("id") && accepted["id"].is_string()) {
    poll = "/v2/invocations/" + path_segment(accepted["id"].get<std::string>());
  } else {
    return fail(Status(ErrorCode::kInvalidValue, "202 without an invocation id or Location"));
  }
  if (accepted.is_object() && accepted.contains("id")) {
    std::fprintf(stderr, "invocation %s\n",
                 accepted["id"].is_string() ? accepted["id"].get<std::string>().c_str()
                                            : accepted["id"].dump().c_str());
  }
  // Polls back off from 10 ms to 250 ms: quick answers come quickly, long ones cost little.
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) {
      return fail(error(ErrorCode::kTimeout, "the invocation did not finish within ",
                        o.timeout.count(), " ms (--timeout_ms); it is at ", poll));
    }
    auto answer = router.request("GET", poll, {}, {}, left);
    if (!answer.ok()) return fail(answer.status());
    if (answer->status != 202) return print_answer(*answer, o.function);
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

int ctl_load(HttpConnection& router, const std::string& function, const json& registration,
             std::chrono::milliseconds timeout) {
  auto r = router.request("POST", "/v2/repository/models/" + path_segment(function) + "/load",
                          registration.dump(), {{"Content-Type", "application/json"}}, timeout);
  if (!r.ok()) return fail(r.status());
  if (!r->ok()) return fail_answer(str_cat("load ", function), *r);
  std::printf("loaded '%s'\n", function.c_str());
  return 0;
}

int ctl_unload(HttpConnection& router, const std::string& function,
               std::chrono::milliseconds timeout) {
  auto r = router.request("POST", "/v2/repository/models/" + path_segment(function) + "/unload", {},
                          {}, timeout);
  if (!r.ok()) return fail(r.status());
  if (!r->ok()) return fail_answer(str_cat("unload ", function), *r);
  std::printf("unloaded '%s'\n", function.c_str());
  return 0;
}

int ctl_top(HttpConnection& router, const TopLoopOptions& o) {
  for (uint64_t i = 0; o.iterations == 0 || i < o.iterations; ++i) {
    if (i > 0) std::this_thread::sleep_for(o.interval);
    std::string text;
    auto status = get_json(router, "/v2/status", o.timeout);
    if (status.ok()) {
      auto rendered = render_top(*status, TopOptions{router.target().url(), 10});
      if (rendered.ok()) {
        text = std::move(*rendered);
      } else {
        status = rendered.status();
      }
    }
    if (!status.ok()) {
      // One refresh asked for: its failure is the answer. Live: shown until the next refresh.
      if (o.iterations == 1) return fail(status.status());
      text =
          str_cat("hiber-router ", router.target().url(), ": ", status.status().to_string(), "\n");
    }
    if (!o.live) {
      if (i > 0) std::fputs("\n", stdout);
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
      continue;
    }
    // Home, each line overwritten and its rest cleared, then everything below: no flicker.
    const size_t columns = terminal_columns();
    std::string screen = "\x1b[H";
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(start, end - start);
      if (columns > 0 && line.size() > columns) line.resize(columns);
      screen += line + "\x1b[K\n";
      start = end + 1;
    }
    screen += "\x1b[J";
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace hiber::tools
