// What a run measured: every request's outcome, every GPU's busy time, and the paper's metrics
// computed from them.
//
// Metrics (Torpor §7):
//   - A function is SLO-compliant when its tail latency at its percentile (p98 by default) is
//     within its deadline. With nearest-rank percentiles that is: at least ceil(p * n) of its n
//     requests finished within the deadline. A request that never finished (rejected, failed,
//     still queued when the run ended) is late. Functions without requests in the measured
//     window are left out of the ratio.
//   - A function "executed" when at least one of its requests finished (Fig. 10 right).
//   - GPU load: the share of the measured window in which the GPU served a request (from
//     dispatch to completion, swap included). Fig. 14b's per-node load variance is the variance
//     of a node's GPU loads after dividing them by the node's largest.
//   - Hit ratio and load time (the caching papers): a request hits when its model was resident
//     on the GPU that ran it; its load time is from dispatch to the model being complete there
//     (0 for a hit).
// Only requests arriving at or after `measure_from` count (the warm-up is left out); busy time
// counts inside [measure_from, measure_to).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "sim/workload.h"

namespace hiber::sim {

// How a request got its model (or did not).
enum class StartKind : uint8_t {
  kResident,    // late binding: already on the GPU
  kPeer,        // late binding: copied GPU to GPU
  kHost,        // late binding: loaded from host memory
  kWarm,        // early binding: the function's instance was up
  kCold,        // early binding: the instance had to be started first
  kFailed,      // started but could not finish (no memory for its blocks)
  kRejected,    // never started: no instance could exist (Native out of memory), or shed
                //   by the scheduler (SchedulerOptions::shed) as unable to meet its deadline
  kUnfinished,  // still waiting or running when the run ended
};
inline constexpr int kStartKinds = 8;
const char* start_kind_name(StartKind kind);

struct Outcome {
  uint32_t function = 0;
  int node = 0;
  int gpu = -1;
  Time arrival = 0;
  Time finish = 0;    // meaningful when completed
  Duration load = 0;  // dispatch to model ready (swaps, cold starts)
  StartKind kind = StartKind::kUnfinished;
  bool completed = false;
};

struct LatencyQuantiles {
  double p50 = 0, p90 = 0, p98 = 0, p99 = 0;  // ms; +inf if that many never finished
};

struct Results {
  int functions_with_requests = 0;
  int compliant = 0;
  int executed = 0;
  double compliant_ratio = 0;
  uint64_t requests = 0;
  uint64_t completed = 0;
  uint64_t on_time = 0;
  uint64_t by_kind[kStartKinds] = {};
  double hit_ratio = 0;      // resident starts / started late-binding requests
  double mean_load_ms = 0;   // over started requests, hits counted as 0
  LatencyQuantiles latency;  // all requests
  std::vector<LatencyQuantiles> latency_by_model;  // per paper_models() index
  std::vector<uint64_t> requests_by_model;
  std::vector<int> functions_by_model;  // with requests
  std::vector<int> compliant_by_model;
  std::vector<double> gpu_load;            // node-major
  std::vector<double> node_load_variance;  // per node, loads normalised to the node's max
  double mean_gpu_load = 0;
  // Latency / deadline at the quantiles 1/128, 1/64, ..., 1/2, ..., 63/64, 127/128 (Fig. 14b).
  std::vector<double> normalized_quantile_levels;
  std::vector<double> normalized_latency_quantiles;
};

class Recorder {
 public:
  Recorder(const Workload& workload, Time measure_from, int nodes, int gpus_per_node);

  void record(const Outcome& outcome);
  void add_busy(int node, int gpu, Time from, Time to);

  Results results() const;

 private:
  struct PerFunction {
    uint64_t requests = 0;
    uint64_t completed = 0;
    uint64_t on_time = 0;
  };

  const Workload* workload_;
  Time measure_from_;
  Time measure_to_;
  int nodes_;
  int gpus_per_node_;
  std::vector<PerFunction> functions_;
  std::vector<std::vector<float>> latency_ms_by_model_;  // +inf for unfinished
  std::vector<float> normalized_;                        // latency / deadline
  std::vector<double> busy_;                             // ns, node-major
  uint64_t by_kind_[kStartKinds] = {};
  double load_sum_ns_ = 0;
  uint64_t load_count_ = 0;
};

// Nearest-rank quantile of an unsorted sample (sorts it); +inf where the rank is unfinished.
double quantile(std::vector<float>& sample, double q);

}  // namespace hiber::sim
