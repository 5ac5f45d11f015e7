#include "sim/experiment_support.h"

#include <atomic>
#include <thread>

#include <glog/logging.h>

namespace hiber::sim {

NodeConfig with_gpu_memory(const NodeConfig& config, uint64_t memory) {
  NodeConfig out = config;
  if (memory == 0) return out;
  for (GpuSpec& g : out.gpus) g.memory_bytes = memory;
  return out;
}

NodeConfig single_gpu(const NodeConfig& config) {
  NodeConfig out = config;
  out.name = config.name + "-gpu0";
  out.gpus.resize(1);
  out.pcie_switches = {config.pcie_switches[config.gpus[0].pcie_switch]};
  out.gpus[0].pcie_switch = 0;
  out.nvlinks.clear();
  out.nvswitches.clear();
  return out;
}

SystemSpec hiber_system(const ExperimentOptions& options, std::string label, std::string placement,
                        std::string eviction, std::string queue) {
  SystemSpec s;
  s.label = std::move(label);
  s.kind = SystemKind::kHiber;
  s.hiber = options.hiber;
  s.hiber.scheduler.placement = std::move(placement);
  s.hiber.scheduler.eviction = std::move(eviction);
  s.hiber.scheduler.queue = std::move(queue);
  s.hiber.scheduler.seed = options.seed;
  return s;
}

SystemSpec early_system(const ExperimentOptions& options, std::string label, EarlyBinding kind) {
  SystemSpec s;
  s.label = std::move(label);
  s.kind = SystemKind::kEarlyBinding;
  s.early.kind = kind;
  // NonSwap shares one runtime per GPU, as hiberd does; native containers bring their own.
  s.early.gpu_reserve_bytes = kind == EarlyBinding::kNonSwap ? options.hiber.gpu_reserve_bytes : 0;
  return s;
}

SyntheticOptions paper_workload(const ExperimentOptions& options, int functions,
                                Duration measured) {
  SyntheticOptions w;
  w.functions = functions;
  w.duration = 60 * kSecond + scaled(options, measured);
  w.seed = options.seed;
  w.min_rate_per_min = 5;
  w.max_rate_per_min = 30;
  return w;
}

Duration scaled(const ExperimentOptions& options, Duration d) {
  return static_cast<Duration>(static_cast<double>(d) * options.time_scale);
}

std::vector<Result<RunOutput>> run_all(const std::vector<std::function<Result<RunOutput>()>>& jobs,
                                       int threads) {
  std::vector<Result<RunOutput>> results(jobs.size(),
                                         Result<RunOutput>(error(ErrorCode::kUnknown, "not run")));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) results[i] = jobs[i]();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return results;
}

Status first_error(const std::vector<Result<RunOutput>>& results) {
  for (const auto& r : results) {
    if (!r.ok()) return r.status();
  }
  return Status();
}

std::string file_in(const ExperimentOptions& options, const std::string& name) {
  return options.out_dir + "/" + name;
}

CsvTable results_table(const std::string& x_name) {
  return CsvTable({"system",    x_name,         "functions_with_requests",
                   "compliant", "executed",     "compliant_ratio",
                   "requests",  "completed",    "on_time",
                   "p50_ms",    "p98_ms",       "mean_gpu_load",
                   "hit_ratio", "mean_load_ms", "resident",
                   "peer",      "host",         "warm",
                   "cold",      "failed",       "rejected",
                   "unfinished"});
}

void add_results_row(CsvTable* table, const std::string& system, const std::string& x,
                     const Results& r) {
  std::vector<std::string> row = {system,
                                  x,
                                  std::to_string(r.functions_with_requests),
                                  std::to_string(r.compliant),
                                  std::to_string(r.executed),
                                  fmt(r.compliant_ratio, 4),
                                  std::to_string(r.requests),
                                  std::to_string(r.completed),
                                  std::to_string(r.on_time),
                                  fmt(r.latency.p50, 2),
                                  fmt(r.latency.p98, 2),
                                  fmt(r.mean_gpu_load, 4),
                                  fmt(r.hit_ratio, 4),
                                  fmt(r.mean_load_ms, 3)};
  for (uint64_t count : r.by_kind) row.push_back(std::to_string(count));
  table->add(std::move(row));
}

std::string command_line(std::string_view experiment) {
  return str_cat("hiber-sim --experiment=", experiment, " --out=docs/evaluation");
}

}  // namespace hiber::sim
