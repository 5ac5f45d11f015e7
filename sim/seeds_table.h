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
  // The lowest compliant % of any model in any single seed, and that model: the strict reading
  // of "every class at least 50%" (in every run, not only on average).
  std::string lowest_seed_model;
  double lowest_seed_pct = 0;
  // Mean per run: requests never started, answered "overloaded" (shed by the scheduler,
  // SchedulerOptions::shed) or, for early binding, refused for want of an instance. Each is a
  // miss in the compliance figures.
  double rejected = 0;
  double failed = 0;      // mean per run: started, could not finish
  double unfinished = 0;  // mean per run: still queued or running at the end
  double p99_ms = 0;      // mean over seeds of the p99 latency; +inf if any seed's is
};

// Issue 20's goals, per row: at least 90% of functions compliant as the mean over the seeds, and
// at least 50% of every model class's functions compliant (as the mean over the seeds; strictly,
// also in every seed).
inline constexpr double kGoalCompliantPct = 90;
inline constexpr double kGoalClassPct = 50;
bool meets_mean_goal(const SeedsRow& row);
bool meets_class_goal(const SeedsRow& row);
bool meets_class_goal_every_seed(const SeedsRow& row);

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
