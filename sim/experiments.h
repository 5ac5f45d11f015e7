// The paper's experiments, each one command (hiber-sim --experiment=NAME --out=DIR):
//
//   calibration  Table 4 (swap latencies alone) and Table 3 (PCIe contention): the timing model
//                against the paper's measurements.
//   fig10        SLO-compliant functions vs number of functions (40-160, 4 GPUs): Hiber's late
//                binding against native early binding and INFless-KA.
//   fig11        Full policies against the FIFO, Random, LRU and Block ablations (320-560),
//                and an ideal allocator as an upper bound.
//   fig12        DenseNet-201 and Bert-qa tail latencies, heaviness-aware eviction against LRU,
//                Bert-qa at 60% of the memory footprint.
//   fig14        6 nodes, 500-2500 functions: Hiber against Native, NonSwap and SimpleSwap;
//                latency / deadline quantiles and per-node GPU load variance at 1000 and 2500.
//   caching      Eviction policies of the caching papers (mCache, CremeBrulee, LRU, LFU,
//                Belady) on hit ratio and load time at 40/60/80% capacity.
//   queue        RRC against FIFO and gShare queueing under Poisson and bursty arrivals.
//   seeds        Fig. 11's 560-function point over seeds 1..N, Poisson and Azure-shaped
//                arrivals, per-request execution-time variation, for the configurations named
//                in `policies` (sim/seeds_table.h): means, spreads, the lowest model class,
//                rejected ("overloaded") requests, p99, and issue 20's goals met or not.
//
// Each writes its CSV files into the output folder and returns its section of
// docs/evaluation.md (setup, our numbers, the paper's beside them). "all" runs every one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/node_config.h"
#include "common/status.h"
#include "sim/hiber_node.h"

namespace hiber::sim {

struct ExperimentOptions {
  std::string out_dir = ".";
  uint64_t seed = 1;
  // Multiplies every run's measured duration; below 1 for quick looks and tests.
  double time_scale = 1.0;
  int threads = 2;
  // The node's topology: configs/nodes/torpor-4gpu.json unless another config is given.
  NodeConfig node;
  // The paper's §7 node has V100s with 32 GB; the config describes 16 GB ones. 0 keeps the
  // config's memory.
  uint64_t gpu_memory_bytes = 32 * kGiB;
  // Timing model and memory layout shared by every Hiber run (policies are per experiment).
  HiberOptions hiber;
  // seeds: comma-separated configuration names (empty: every known one), and how many seeds
  // (seed, seed + 1, ...).
  std::string policies;
  int seeds = 10;
};

struct ExperimentResult {
  std::string markdown;            // the section of docs/evaluation.md
  std::vector<std::string> files;  // CSV files written
  // One line each for the report's summary table: what the paper claims, what we measured.
  std::string paper;
  std::string ours;
};

const std::vector<std::string_view>& experiment_names();

// kInvalidValue for an unknown name (listing the known ones).
Result<ExperimentResult> run_experiment(std::string_view name, const ExperimentOptions& options);

// The head of docs/evaluation.md: what the report is, how to regenerate it, the shared setup.
std::string evaluation_preamble(const ExperimentOptions& options);
// The whole report: the preamble, a table of every experiment's claim and result, then each
// experiment's section. `names[i]` ran into `results[i]`.
std::string evaluation_report(const ExperimentOptions& options,
                              const std::vector<std::string_view>& names,
                              const std::vector<ExperimentResult>& results);

}  // namespace hiber::sim
