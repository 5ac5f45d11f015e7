// The seeds-and-arrivals table (hiber-sim --experiment=seeds): each configuration over several
// seeds and two arrival models, summarised by its spread rather than one run.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/experiments.h"
#include "sim/metrics.h"
#include "sim/simulation.h"

namespace hiber::sim {

struct Spread {
  double mean = 0;
  double sd = 0;  // sample standard deviation (n - 1); 0 for a single value
  double min = 0;
  double max = 0;
};

// REQUIRES: values not empty.
Spread spread_of(const std::vector<double>& values);

// One row: a configuration under one arrival model, over its seeds.
struct SeedsRow {
  std::string config;
  std::string arrivals;
  int seeds = 0;
  Spread compliant_pct;  // SLO-compliant functions, %
  // The model whose functions comply least, as the mean over seeds of its compliant %, and the
  // lowest single-seed value of that model.
  std::string worst_model;
  double worst_model_pct = 0;
  double worst_model_min_pct = 0;
  double rejected = 0;    // mean per run: requests answered without running
  double failed = 0;      // mean per run: started, could not finish
  double unfinished = 0;  // mean per run: still queued or running at the end
  double p99_ms = 0;      // mean over seeds of the p99 latency; +inf if any seed's is
};

// Summarises per-seed results. REQUIRES: per_seed not empty, each with paper_models()-sized
// per-model vectors.
SeedsRow summarize_seeds(std::string config, std::string arrivals,
                         const std::vector<Results>& per_seed);

// A configuration selectable by name in --policies.
struct SeedsConfig {
  std::string_view name;
  std::string_view mechanism;  // a paragraph for docs/evaluation.md
  std::function<SystemSpec(const ExperimentOptions&)> make;
};

// Every known configuration, in the report's order; adding one is one entry here.
const std::vector<SeedsConfig>& seeds_configs();
// kInvalidValue for an unknown name, listing the known ones.
Result<const SeedsConfig*> find_seeds_config(std::string_view name);

// The default --policies list.
std::string default_seeds_policies();

}  // namespace hiber::sim
