// hiber-load: replays a slice of an Azure Functions trace against hiber-router over HTTP, open
// loop, and reports per function how many requests succeeded, how many met the function's SLO,
// the latency percentiles and where the models came from (X-Hiber-Source / X-Hiber-Link).
//
//   hiber-load --trace=sim/data/azure_sample.csv --functions=fn-0,fn-1 --minutes=2 --speedup=12
//
// Trace row r drives function r % N (tools/load/schedule.h); a slice's requests are spread
// over each minute as hiber-sim spreads them. Exits 1 when any request failed (non-2xx or no
// answer) unless --allow_errors, 2 on bad flags or an unreachable router.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "sim/azure_trace.h"
#include "tools/load/runner.h"
#include "tools/load/schedule.h"
#include "tools/load/summary.h"

DEFINE_string(trace, "", "Azure Functions trace (CSV, sim/azure_trace.h's format) to replay");
DEFINE_string(functions, "",
              "Registered functions, comma-separated; trace row r drives function "
              "r % N");
DEFINE_int32(start_minute, 0, "First minute (0-based) of the trace slice");
DEFINE_int32(minutes, 1, "Minutes of the trace to replay");
DEFINE_double(speedup, 1, "Replay this many times faster than the trace (60: a minute a second)");
DEFINE_int32(rows_per_function, 1, "Trace rows folded onto each function");
DEFINE_bool(http_only, false, "Use only the trace's HTTP-triggered rows");
DEFINE_uint64(seed, 1, "Seed spreading each minute's invocations (as hiber-sim's)");
DEFINE_uint64(max_requests, 0, "Send only the slice's first N requests (0: all)");
DEFINE_string(router, "http://127.0.0.1:8080", "hiber-router's address");
DEFINE_int32(connections, 16, "Keep-alive connections to the router (one request at a time each)");
DEFINE_double(timeout_ms, 60000, "A request with no answer this long after it was sent fails");
DEFINE_string(body, "", "The body of every request");
DEFINE_string(body_file, "", "Read the body of every request from this file");
DEFINE_string(body_template, "",
              "Each request's body with {function}, {index} (the function's position in "
              "--functions), {n} (the request's number) and {k} (its number among its "
              "function's) replaced; overrides --body and --body_file");
DEFINE_string(content_type, "application/octet-stream", "The requests' Content-Type");
DEFINE_string(slo_ms, "",
              "SLOs as fn:ms,...; functions not listed take slo_ms from the router "
              "(GET /v2/models/{fn}, else /v2/status)");
DEFINE_string(json_out, "", "Also write the report as JSON to this file");
DEFINE_bool(allow_errors, false, "Exit 0 even when requests failed");
DEFINE_bool(progress, true, "Show progress on stderr");

namespace hiber::load {
namespace {

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  *ok = static_cast<bool>(in) || in.eof();
  return text.str();
}

// Redrawn in place on a terminal; a line every 10% otherwise (a log, CI).
class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(STDERR_FILENO) == 1) {}

  void update(const RunProgress& p) {
    if (p.total == 0) return;
    const int tenth = static_cast<int>(10 * p.done / p.total);
    if (tty_) {
      if (p.done != p.total && p.elapsed_s - last_draw_s_ < 0.1) return;
      last_draw_s_ = p.elapsed_s;
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * p.done / p.total);
      std::fprintf(stderr, "\r[%s%s] %3d%% %llu/%llu answered, %llu failed, %.1f s",
                   std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(),
                   static_cast<int>(100 * p.done / p.total),
                   static_cast<unsigned long long>(p.done),
                   static_cast<unsigned long long>(p.total),
                   static_cast<unsigned long long>(p.failed), p.elapsed_s);
      if (p.done == p.total) std::fputc('\n', stderr);
    } else if (tenth > last_tenth_) {
      last_tenth_ = tenth;
      std::fprintf(stderr, "hiber-load: %d%% (%llu/%llu answered, %llu failed, %.1f s)\n",
                   tenth * 10, static_cast<unsigned long long>(p.done),
                   static_cast<unsigned long long>(p.total),
                   static_cast<unsigned long long>(p.failed), p.elapsed_s);
    }
    std::fflush(stderr);
  }

 private:
  bool tty_;
  double last_draw_s_ = -1;
  int last_tenth_ = 0;
};

int fail(const Status& status) {
  std::fprintf(stderr, "hiber-load: %s\n", status.to_string().c_str());
  return 2;
}

int run() {
  if (FLAGS_trace.empty()) return fail(error(ErrorCode::kInvalidValue, "--trace is required"));
  Result<std::vector<std::string>> functions = parse_function_list(FLAGS_functions);
  if (!functions.ok()) return fail(functions.status().with_context("--functions"));
  Result<Endpoint> router = parse_router_url(FLAGS_router);
  if (!router.ok()) return fail(router.status());
  Result<std::map<std::string, double>> slo_flags = parse_slo_list(FLAGS_slo_ms);
  if (!slo_flags.ok()) return fail(slo_flags.status().with_context("--slo_ms"));
  for (const auto& [name, ms] : *slo_flags) {
    if (std::find(functions->begin(), functions->end(), name) == functions->end())
      return fail(error(ErrorCode::kInvalidValue, "--slo_ms names '", name,
                        "', which is not in --functions"));
  }

  std::string body = FLAGS_body;
  if (!FLAGS_body_file.empty()) {
    bool ok = false;
    body = read_file(FLAGS_body_file, &ok);
    if (!ok) return fail(error(ErrorCode::kFileNotFound, FLAGS_body_file, ": cannot read"));
  }

  Result<std::vector<sim::TraceFunction>> trace = sim::load_azure_trace(FLAGS_trace);
  if (!trace.ok()) return fail(trace.status());
  ScheduleOptions options;
  options.start_minute = FLAGS_start_minute;
  options.minutes = FLAGS_minutes;
  options.speedup = FLAGS_speedup;
  options.rows_per_function = FLAGS_rows_per_function;
  options.http_only = FLAGS_http_only;
  options.seed = FLAGS_seed;
  options.max_requests = FLAGS_max_requests;
  Result<std::vector<ScheduledRequest>> schedule =
      build_schedule(*trace, functions->size(), options);
  if (!schedule.ok()) return fail(schedule.status());

  std::vector<std::optional<double>> slo(functions->size());
  for (size_t i = 0; i < functions->size(); ++i) {
    const std::string& name = (*functions)[i];
    if (auto it = slo_flags->find(name); it != slo_flags->end()) {
      slo[i] = it->second;
      continue;
    }
    Result<std::optional<double>> fetched = fetch_slo_ms(*router, name);
    if (!fetched.ok()) return fail(fetched.status());
    slo[i] = *fetched;
    if (!slo[i]) LOG(WARNING) << "no slo_ms for " << name << " (is it registered?)";
  }

  const double replay_s = schedule->empty() ? 0 : static_cast<double>(schedule->back().at_ns) / 1e9;
  LOG(INFO) << "replaying " << schedule->size() << " requests to " << functions->size()
            << " functions over " << replay_s << " s";
  const auto body_of = [&](const ScheduledRequest& r) {
    if (FLAGS_body_template.empty()) return body;
    return expand_body(FLAGS_body_template, (*functions)[r.function], r.function, r);
  };
  RunOptions run_options;
  run_options.connections = FLAGS_connections;
  run_options.timeout_ms = FLAGS_timeout_ms;
  run_options.content_type = FLAGS_content_type;
  ProgressBar bar;
  std::function<void(const RunProgress&)> progress;
  if (FLAGS_progress) progress = [&bar](const RunProgress& p) { bar.update(p); };
  Result<RunResult> result =
      run_load(*router, *functions, *schedule, body_of, run_options, progress);
  if (!result.ok()) return fail(result.status());

  for (const RequestRecord& r : result->records) {
    if (r.status == 0) {
      LOG(WARNING) << "a request to " << (*functions)[r.function] << " got no answer: " << r.error;
      break;  // one is enough to say why; the table counts them
    }
  }
  const Summary summary = summarize(*functions, slo, result->records, result->wall_s);
  std::fputs(format_summary(summary).c_str(), stdout);
  if (!FLAGS_json_out.empty()) {
    std::ofstream out(FLAGS_json_out);
    out << summary_json(summary).dump(2) << "\n";
    if (!out) return fail(error(ErrorCode::kInvalidValue, FLAGS_json_out, ": cannot write"));
  }
  const bool failed = summary.total.ok != summary.total.requests;
  return failed && !FLAGS_allow_errors ? 1 : 0;
}

}  // namespace
}  // namespace hiber::load

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv,
                      "Replays a slice of an Azure Functions trace against hiber-router.\n"
                      "  hiber-load --trace=FILE --functions=fn-0,fn-1 [--minutes=N] "
                      "[--speedup=X] [--router=http://127.0.0.1:8080]",
                      __FILE__);
  return hiber::load::run();
}
