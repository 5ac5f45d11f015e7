// hiber-sim: the trace-driven simulator of Hiber nodes and clusters.
//
//   hiber-sim --experiment=fig10 --out=DIR       one of the paper's experiments (CSV + report)
//   hiber-sim --experiment=all --out=DIR --report=docs/evaluation.md
//   hiber-sim --functions=500 --eviction=lru     one run of a synthetic workload, printed
//   hiber-sim --trace=day01.csv --trace_minutes=60   one run of an Azure Functions trace
//   hiber-sim --functions=1000 --min_rate=0 --max_rate=inf --write_trace=t.csv
//                                                write a synthetic trace in Azure's format
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "common/node_config.h"
#include "sim/experiment_support.h"
#include "sim/experiments.h"
#include "sim/trace_workload.h"

// What to do.
DEFINE_string(experiment, "",
              "Run one of the paper's experiments (calibration, fig10, fig11, "
              "fig12, fig14, caching, queue, seeds) or 'all'; empty: one run of the "
              "workload described by the other flags");
DEFINE_string(out, ".", "Folder for CSV files");
DEFINE_string(report, "", "With --experiment=all: write the evaluation report (Markdown) here");
DEFINE_string(write_trace, "", "Write the workload as an Azure Functions trace CSV and exit");

// The node.
// The paper's experiments run on the paper's node, so it is hiber-sim's default by name (the
// library default, default_node_config(), is an H100 node).
DEFINE_string(node_config, "torpor-4gpu",
              "Node config: an embedded one by name (torpor-4gpu: the paper's 4x V100 node; "
              "nvswitch-8gpu: 8x H100), or a JSON file");
DEFINE_double(gpu_memory_gib, 32,
              "Memory of every GPU in GiB (the paper's V100s have 32); "
              "0 keeps the config's");
DEFINE_int32(nodes, 1, "Nodes behind the load balancer (single runs)");

// The system.
DEFINE_string(system, "hiber", "hiber, native, infless-ka or nonswap");
DEFINE_string(placement, "algorithm1", "Hiber placement policy: algorithm1, random");
DEFINE_string(eviction, "heaviness",
              "Hiber eviction policy: heaviness, lru, lfu, random, mcache, "
              "cremebrulee, cremebrulee-oracle, belady, slack");
DEFINE_string(queue, "rrc", "Hiber queue policy: rrc, fifo, gshare");
DEFINE_double(slack_weight_s, 60,
              "slack eviction: seconds of recency a model whose host load takes its whole SLO "
              "is worth");
DEFINE_double(slack_power, 3, "slack eviction: exponent of the SLO share a host load takes");
DEFINE_string(prewarm, "none",
              "Hiber prewarming: none, or histogram (an idle-time histogram per function; while "
              "no request waits, load the model of a function predicted to arrive soon onto an "
              "idle GPU whose host link is idle, evicting only models predicted later)");
DEFINE_int32(prewarm_bin_ms, 1000, "prewarm=histogram: width of an idle-time bin, ms");
DEFINE_int32(prewarm_keep_idle_gpus, 3,
             "prewarm=histogram: GPUs that must stay available after a prewarm takes one");
DEFINE_string(shed, "none",
              "Hiber admission: none, late (shed a request that cannot meet its deadline even "
              "if started now) or hopeless (also when the host swap alone ends past it and no GPU "
              "holds the model); shed requests are answered 'overloaded' and count as misses");
DEFINE_string(sharing, "off",
              "Hiber spatial sharing: off, or usher (a request may start beside a running one "
              "where its model is resident and every deadline holds under the predicted "
              "interference)");
DEFINE_int32(max_runners_per_gpu, 2, "With --sharing: requests one GPU may execute at once");
DEFINE_bool(interference, true,
            "Requests executing on one GPU at once slow each other (docs/sim.md); off: never");
DEFINE_string(memory_pool, "buddy", "Hiber GPU pool: buddy, block, naive");
DEFINE_double(keep_alive_s, 60, "INFless-KA keep-alive window, seconds");
DEFINE_bool(check_invariants, false,
            "Check the scheduler's and pools' invariants after every "
            "event (slow)");

// The timing model.
DEFINE_double(pcie_efficiency, 0.88, "Share of a link one transfer gets alone");
DEFINE_double(swap_setup_us, 1600, "Fixed cost of a swap before its first byte moves, us");
DEFINE_double(group_mib, 2, "Pipelining group size (the elbow), MiB");
DEFINE_double(gpu_reserve_mib, 512, "GPU memory kept from the pools (the runtime), MiB");
DEFINE_double(malloc_us, 100, "Device cudaMalloc fixed cost (block/naive pools), us");
DEFINE_double(malloc_us_per_mib, 2, "Device cudaMalloc cost per MiB, us");
DEFINE_double(free_us, 100, "Device cudaFree fixed cost, us");
DEFINE_double(free_us_per_mib, 1, "Device cudaFree cost per MiB, us");
DEFINE_double(exec_cv_vision, 0,
              "Per-request execution-time CV of the CNNs (log-normal, mean Table 4's); 0 = fixed");
DEFINE_double(exec_cv_language, 0, "Per-request execution-time CV of Bert-qa; 0 = fixed");

// The workload.
DEFINE_string(trace, "", "Azure Functions 2019 invocation CSV to replay (default: synthetic)");
DEFINE_int32(trace_start_minute, 0, "First minute of the trace to replay (0-based)");
DEFINE_int32(trace_minutes, 60, "Minutes of the trace to replay");
DEFINE_bool(http_only, false, "Keep only HTTP-triggered functions of the trace");
DEFINE_int32(functions, 160, "Synthetic functions (or the most trace rows to keep; 0 = all)");
DEFINE_double(duration_s, 660, "Synthetic workload length, seconds (warm-up included)");
DEFINE_double(min_rate, 5, "Synthetic rates from Fig. 2 conditioned on [min_rate, max_rate] r/m");
DEFINE_double(max_rate, 30, "Upper end of the rate window, r/m ('inf' for none)");
DEFINE_string(pattern, "poisson", "Synthetic arrivals: poisson, bursty (on/off) or azure");
DEFINE_string(burst_trace, "",
              "--pattern=azure: draw each function's burst shape from this Azure-format trace's "
              "rows (those with >= 1 invocation a minute; --http_only applies) instead of the "
              "built-in targets");
DEFINE_string(models, "", "Comma-separated models assigned round-robin (default: all eight)");
DEFINE_double(vision_slo_ms, 80, "Deadline of CV models, ms");
DEFINE_double(language_slo_ms, 200, "Deadline of Bert-qa, ms");
DEFINE_double(percentile, 0.98, "Tail percentile of every deadline");
DEFINE_double(warmup_s, 60, "Requests arriving earlier are not measured, seconds");
DEFINE_double(drain_s, 60, "Time after the last arrival for queued requests to finish, seconds");

// Experiments.
DEFINE_uint64(seed, 1, "Seed of every random choice (workload and policies)");
DEFINE_double(time_scale, 1.0, "Experiments: multiply measured durations by this");
DEFINE_int32(threads, 2, "Experiments: runs simulated at once");
DEFINE_string(policies, "",
              "--experiment=seeds: comma-separated configurations (default: every known one; an "
              "unknown name lists them)");
DEFINE_int32(seeds, 10, "--experiment=seeds: seeds per configuration (--seed, --seed + 1, ...)");

namespace hiber::sim {
namespace {

constexpr char kUsage[] =
    "hiber-sim: simulates Hiber nodes (the real scheduler and GPU pools against simulated "
    "time) and the paper's baselines.\n"
    "  hiber-sim --experiment=fig10 --out=DIR     one of the paper's experiments\n"
    "  hiber-sim --experiment=all --out=DIR --report=docs/evaluation.md\n"
    "  hiber-sim [--functions=N | --trace=FILE] [--system=...] [policy flags]   one run";

Duration seconds(double s) { return static_cast<Duration>(std::llround(s * kSecond)); }
Duration micros(double us) { return static_cast<Duration>(std::llround(us * kMicrosecond)); }

Result<NodeConfig> node_config() {
  if (FLAGS_node_config.empty()) return paper_node_config();
  return node_config_by_name_or_path(FLAGS_node_config);
}

Result<HiberOptions> hiber_options() {
  HiberOptions h;
  h.scheduler.placement = FLAGS_placement;
  h.scheduler.eviction = FLAGS_eviction;
  h.scheduler.queue = FLAGS_queue;
  h.scheduler.eviction_options.slack_weight = seconds(FLAGS_slack_weight_s);
  h.scheduler.eviction_options.slack_power = FLAGS_slack_power;
  HIBER_ASSIGN_OR_RETURN(h.scheduler.shed, scheduler::shed_rule_from_name(FLAGS_shed));
  HIBER_ASSIGN_OR_RETURN(h.scheduler.prewarm, scheduler::prewarm_rule_from_name(FLAGS_prewarm));
  h.scheduler.prewarm_options.bin = FLAGS_prewarm_bin_ms * scheduler::kMillisecond;
  h.scheduler.prewarm_options.keep_idle_gpus = FLAGS_prewarm_keep_idle_gpus;
  h.scheduler.seed = FLAGS_seed;
  h.scheduler.sharing = FLAGS_sharing;
  h.scheduler.max_runners_per_gpu = FLAGS_max_runners_per_gpu;
  h.interference = FLAGS_interference;
  HIBER_ASSIGN_OR_RETURN(h.pool, memory::parse_pool_kind(FLAGS_memory_pool));
  if (!(FLAGS_pcie_efficiency > 0 && FLAGS_pcie_efficiency <= 1))
    return error(ErrorCode::kInvalidValue, "--pcie_efficiency must be in (0, 1]");
  if (FLAGS_swap_setup_us < 0 || FLAGS_group_mib <= 0 || FLAGS_gpu_reserve_mib < 0)
    return error(ErrorCode::kInvalidValue,
                 "--swap_setup_us, --gpu_reserve_mib must be >= 0 and "
                 "--group_mib > 0");
  if (FLAGS_malloc_us < 0 || FLAGS_malloc_us_per_mib < 0 || FLAGS_free_us < 0 ||
      FLAGS_free_us_per_mib < 0)
    return error(ErrorCode::kInvalidValue, "device allocation costs must be >= 0");
  h.links.transfer_efficiency = FLAGS_pcie_efficiency;
  h.pipeline.setup = micros(FLAGS_swap_setup_us);
  h.pipeline.group_bytes = static_cast<uint64_t>(FLAGS_group_mib * kMiB);
  h.gpu_reserve_bytes = static_cast<uint64_t>(FLAGS_gpu_reserve_mib * kMiB);
  h.device_malloc.malloc_fixed = micros(FLAGS_malloc_us);
  h.device_malloc.malloc_per_mib = micros(FLAGS_malloc_us_per_mib);
  h.device_malloc.free_fixed = micros(FLAGS_free_us);
  h.device_malloc.free_per_mib = micros(FLAGS_free_us_per_mib);
  h.check_invariants = FLAGS_check_invariants;
  if (!(FLAGS_exec_cv_vision >= 0 && FLAGS_exec_cv_language >= 0) ||
      std::isinf(FLAGS_exec_cv_vision) || std::isinf(FLAGS_exec_cv_language))
    return error(ErrorCode::kInvalidValue, "--exec_cv_vision and --exec_cv_language must be >= 0");
  h.exec_variation = {FLAGS_exec_cv_vision, FLAGS_exec_cv_language, FLAGS_seed};
  return h;
}

Result<std::vector<int>> model_list() {
  std::vector<int> models;
  std::string_view rest = FLAGS_models;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    HIBER_ASSIGN_OR_RETURN(int m, find_model(rest.substr(0, comma)));
    models.push_back(m);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return models;
}

Result<Workload> workload() {
  Deadlines deadlines;
  deadlines.vision = micros(FLAGS_vision_slo_ms * 1000);
  deadlines.language = micros(FLAGS_language_slo_ms * 1000);
  deadlines.percentile = FLAGS_percentile;
  if (!(deadlines.percentile > 0 && deadlines.percentile < 1) || deadlines.vision <= 0 ||
      deadlines.language <= 0)
    return error(ErrorCode::kInvalidValue, "deadlines must be > 0 and the percentile in (0, 1)");
  HIBER_ASSIGN_OR_RETURN(std::vector<int> models, model_list());
  if (!FLAGS_trace.empty()) {
    HIBER_ASSIGN_OR_RETURN(std::vector<TraceFunction> trace, load_azure_trace(FLAGS_trace));
    TraceOptions t;
    t.start_minute = FLAGS_trace_start_minute;
    t.minutes = FLAGS_trace_minutes;
    t.http_only = FLAGS_http_only;
    t.max_functions = FLAGS_functions;
    t.seed = FLAGS_seed;
    t.models = models;
    t.deadlines = deadlines;
    return workload_from_trace(trace, t);
  }
  SyntheticOptions s;
  s.functions = FLAGS_functions;
  s.duration = seconds(FLAGS_duration_s);
  s.seed = FLAGS_seed;
  s.min_rate_per_min = FLAGS_min_rate;
  s.max_rate_per_min = FLAGS_max_rate;
  HIBER_ASSIGN_OR_RETURN(s.pattern, parse_arrival_pattern(FLAGS_pattern));
  if (!FLAGS_burst_trace.empty()) {
    HIBER_ASSIGN_OR_RETURN(std::vector<TraceFunction> rows, load_azure_trace(FLAGS_burst_trace));
    HIBER_ASSIGN_OR_RETURN(s.burst.azure_shapes,
                           burst_shapes_from_trace(rows, FLAGS_http_only, /*min_mean=*/1));
  }
  s.models = models;
  s.deadlines = deadlines;
  return synthetic_workload(s);
}

Status run_experiments(const ExperimentOptions& options) {
  std::filesystem::create_directories(options.out_dir);
  std::vector<std::string_view> names;
  if (FLAGS_experiment == "all") {
    names = experiment_names();
  } else {
    names.push_back(FLAGS_experiment);
  }
  std::vector<ExperimentResult> results;
  for (std::string_view name : names) {
    LOG(INFO) << "experiment " << name;
    HIBER_ASSIGN_OR_RETURN(ExperimentResult r, run_experiment(name, options));
    for (const std::string& f : r.files)
      std::printf("wrote %s/%s\n", options.out_dir.c_str(), f.c_str());
    std::printf("%s: paper: %s\n%s: ours: %s\n", std::string(name).c_str(), r.paper.c_str(),
                std::string(name).c_str(), r.ours.c_str());
    if (FLAGS_report.empty()) std::printf("\n%s", r.markdown.c_str());
    results.push_back(std::move(r));
  }
  if (!FLAGS_report.empty()) {
    HIBER_RETURN_IF_ERROR(write_file(FLAGS_report, evaluation_report(options, names, results)));
    std::printf("wrote %s\n", FLAGS_report.c_str());
  }
  return Status();
}

Status run_once(const NodeConfig& node, const HiberOptions& hiber) {
  HIBER_ASSIGN_OR_RETURN(Workload w, workload());
  if (!FLAGS_write_trace.empty()) {
    const int minutes = static_cast<int>((w.duration + 60 * kSecond - 1) / (60 * kSecond));
    HIBER_RETURN_IF_ERROR(
        write_file(FLAGS_write_trace, format_azure_trace(trace_from_workload(w, minutes))));
    std::printf("wrote %s: %zu functions, %d minutes, %zu invocations\n", FLAGS_write_trace.c_str(),
                w.functions.size(), minutes, w.arrivals.size());
    return Status();
  }
  SystemSpec system;
  system.label = FLAGS_system;
  if (FLAGS_system == "hiber") {
    system.kind = SystemKind::kHiber;
    system.hiber = hiber;
  } else {
    system.kind = SystemKind::kEarlyBinding;
    Result<EarlyBinding> kind = parse_early_binding(FLAGS_system);
    if (!kind.ok())
      return error(ErrorCode::kInvalidValue, "unknown --system '", FLAGS_system,
                   "' (known: hiber, native, infless-ka, nonswap)");
    system.early.kind = *kind;
    system.early.keep_alive = seconds(FLAGS_keep_alive_s);
    system.early.exec_variation = hiber.exec_variation;
    if (system.early.kind == EarlyBinding::kNonSwap)
      system.early.gpu_reserve_bytes = hiber.gpu_reserve_bytes;
  }
  RunConfig run;
  run.node = with_gpu_memory(node, static_cast<uint64_t>(FLAGS_gpu_memory_gib * kGiB));
  run.nodes = FLAGS_nodes;
  run.warmup = seconds(FLAGS_warmup_s);
  run.drain = seconds(FLAGS_drain_s);
  HIBER_ASSIGN_OR_RETURN(RunOutput out, simulate(system, run, w));
  const Results& r = out.results;
  for (const std::string& s : out.node_summaries) std::printf("%s\n", s.c_str());
  std::printf("%zu functions, %" PRIu64 " arrivals, %" PRIu64 " events\n", w.functions.size(),
              out.arrivals, out.events);
  std::printf("SLO-compliant: %d of %d functions with requests (%s); executed: %d\n", r.compliant,
              r.functions_with_requests, pct(r.compliant_ratio).c_str(), r.executed);
  std::printf("requests: %" PRIu64 " measured, %" PRIu64 " completed, %" PRIu64 " on time\n",
              r.requests, r.completed, r.on_time);
  std::printf("latency ms: p50 %s, p90 %s, p98 %s, p99 %s\n", fmt(r.latency.p50, 2).c_str(),
              fmt(r.latency.p90, 2).c_str(), fmt(r.latency.p98, 2).c_str(),
              fmt(r.latency.p99, 2).c_str());
  std::printf("starts:");
  for (int k = 0; k < kStartKinds; ++k)
    std::printf(" %s %" PRIu64, start_kind_name(static_cast<StartKind>(k)), r.by_kind[k]);
  std::printf("\nhit ratio %s, mean load %s ms, mean GPU load %s\n", pct(r.hit_ratio).c_str(),
              fmt(r.mean_load_ms, 2).c_str(), pct(r.mean_gpu_load).c_str());
  std::printf("compliant by model:");
  for (size_t m = 0; m < r.functions_by_model.size() && m < paper_models().size(); ++m) {
    if (r.functions_by_model[m] == 0) continue;
    std::printf(" %s %d/%d", paper_models()[m].name.c_str(), r.compliant_by_model[m],
                r.functions_by_model[m]);
  }
  std::printf("\n");
  if (FLAGS_out != ".") {
    std::filesystem::create_directories(FLAGS_out);
    CsvTable table = results_table("functions");
    add_results_row(&table, FLAGS_system, std::to_string(w.functions.size()), r);
    HIBER_RETURN_IF_ERROR(table.write(FLAGS_out + "/run.csv"));
  }
  return Status();
}

int main_impl() {
  Result<NodeConfig> node = node_config();
  if (!node.ok()) {
    LOG(ERROR) << node.status();
    return 2;
  }
  Result<HiberOptions> hiber = hiber_options();
  if (!hiber.ok()) {
    LOG(ERROR) << hiber.status();
    return 2;
  }
  if (FLAGS_gpu_memory_gib < 0) {
    LOG(ERROR) << "--gpu_memory_gib must be >= 0";
    return 2;
  }
  Status s;
  if (!FLAGS_experiment.empty()) {
    ExperimentOptions options;
    options.out_dir = FLAGS_out;
    options.seed = FLAGS_seed;
    options.time_scale = FLAGS_time_scale;
    options.threads = FLAGS_threads;
    options.node = *node;
    options.gpu_memory_bytes = static_cast<uint64_t>(FLAGS_gpu_memory_gib * kGiB);
    options.hiber = *hiber;
    options.policies = FLAGS_policies;
    options.seeds = FLAGS_seeds;
    s = run_experiments(options);
  } else {
    s = run_once(*node, *hiber);
  }
  if (!s.ok()) {
    LOG(ERROR) << s;
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace hiber::sim

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv, hiber::sim::kUsage, __FILE__);
  return hiber::sim::main_impl();
}
