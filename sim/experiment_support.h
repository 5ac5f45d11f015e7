// What the experiments share: the node as the paper ran it, the systems compared, the
// workloads, and a runner that spreads independent runs over threads.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sim/experiments.h"
#include "sim/report.h"
#include "sim/simulation.h"

namespace hiber::sim {

// The experiment's node config with every GPU's memory set to `memory` (0: unchanged).
NodeConfig with_gpu_memory(const NodeConfig& config, uint64_t memory);
// GPU 0 of the config alone, with its PCIe switch and no links (the caching experiment).
NodeConfig single_gpu(const NodeConfig& config);

// Hiber with the named policies; the timing model and memory layout from `options`.
SystemSpec hiber_system(const ExperimentOptions& options, std::string label,
                        std::string placement = "algorithm1", std::string eviction = "heaviness",
                        std::string queue = "rrc");
SystemSpec early_system(const ExperimentOptions& options, std::string label, EarlyBinding kind);

// §7.3's workload: n functions, rates from Fig. 2 between 5 and 30 r/m, models round-robin.
SyntheticOptions paper_workload(const ExperimentOptions& options, int functions, Duration measured);

Duration scaled(const ExperimentOptions& options, Duration d);

// Runs every job, `threads` at a time; results in job order. Deterministic whatever the
// interleaving: jobs share nothing.
std::vector<Result<RunOutput>> run_all(const std::vector<std::function<Result<RunOutput>()>>& jobs,
                                       int threads);

// The first error among results, or OK.
Status first_error(const std::vector<Result<RunOutput>>& results);

std::string file_in(const ExperimentOptions& options, const std::string& name);

// One row per run: the system, the x value, and the run's headline metrics.
CsvTable results_table(const std::string& x_name);
void add_results_row(CsvTable* table, const std::string& system, const std::string& x,
                     const Results& r);

// The command that regenerates one experiment, for the report.
std::string command_line(std::string_view experiment);

}  // namespace hiber::sim
