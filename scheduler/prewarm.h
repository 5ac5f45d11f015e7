// Prewarming from predicted arrivals: the hybrid histogram policy of "Serverless in the Wild"
// (Shahrad et al., ATC'20, §4.2) applied to model replicas instead of containers.
//
// Per function, a histogram of idle times (arrival to next arrival). When it is representative,
// the next arrival is predicted inside [last arrival + head, last arrival + tail], head and tail
// being the histogram's 5th and 99th percentiles: before the head the model may leave memory,
// and a prewarm brings it back just before it; after the tail nothing is predicted. When the
// histogram is not representative (too few samples, idle times spread evenly, too many beyond
// its range), the fallback is the fixed keep-alive: the window is [last, last + keep_alive].
//
// plan_prewarm() is the decision: which model to load onto which idle GPU, and which replicas
// to evict for it. It is pure (time is passed in); the Scheduler commits what it returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "scheduler/eviction.h"
#include "scheduler/function_table.h"
#include "scheduler/node_state.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

enum class PrewarmRule : uint8_t { kNone, kHistogram };
// "none", "histogram"; kInvalidValue for another name.
Result<PrewarmRule> prewarm_rule_from_name(std::string_view name);

struct PrewarmOptions {
  // Bin width. The paper bins by the minute because its functions idle for minutes; ours (the
  // simulator's 560 functions) idle for seconds, so minute bins would put every sample in bin 0.
  Duration bin = kSecond;
  int bins = 240;  // idle times beyond bins x bin are out of range
  uint64_t min_samples = 10;
  // A histogram whose bin counts vary less than this (CV) is spread too evenly to predict.
  double min_cv = 2;
  double max_out_of_range = 0.5;  // share of samples beyond the range, above which: fallback
  double head_percentile = 0.05;
  double tail_percentile = 0.99;
  Duration keep_alive = 60 * kSecond;  // the fallback window
  // GPUs that must stay available after a prewarm: a prewarm holds its GPU for the load, and an
  // arrival finding no GPU waits for it. On the paper's 4-GPU node, 3 (prewarm only when every
  // GPU is idle) lost less than 1 (docs/scheduler.md).
  int keep_idle_gpus = 3;
};
Status validate(const PrewarmOptions& options);

inline constexpr Time kNotExpected = INT64_MAX;

// When a function's next arrival is predicted.
struct ArrivalWindow {
  Time from = 0;
  Time until = 0;
  bool representative = false;  // from the histogram, not the fixed keep-alive
};

class IdleHistograms {
 public:
  explicit IdleHistograms(const PrewarmOptions& options) : options_(options) {}

  void ensure_slots(size_t slots);
  void forget(FunctionIndex f);  // the function was unregistered
  void record_arrival(FunctionIndex f, Time now);
  // A prewarm loaded f: not again until its next arrival (an evicted prewarm is a prediction
  // that failed once already).
  void record_prewarm(FunctionIndex f);
  bool prewarmed(FunctionIndex f) const {
    return f.value() < functions_.size() && functions_[f.value()].prewarmed;
  }
  // None before the first arrival.
  std::optional<ArrivalWindow> window(FunctionIndex f) const;
  // The time the function is next expected: the window's start, or `now` inside it;
  // kNotExpected after it or before any arrival.
  Time next_use(FunctionIndex f, Time now) const;

 private:
  struct Function {
    bool seen = false;
    bool prewarmed = false;  // since the last arrival
    Time last = 0;
    std::vector<uint32_t> counts;  // per bin; empty until the first idle time
    uint64_t samples = 0;
    uint64_t out_of_range = 0;
  };
  Duration percentile(const Function& h, double p) const;
  bool representative(const Function& h) const;

  PrewarmOptions options_;
  std::vector<Function> functions_;
};

struct PrewarmPlan {
  FunctionIndex function{0};
  int gpu = -1;
  std::vector<Eviction> evictions;  // in order
};

// The next prewarm, if any, while more than keep_idle_gpus GPUs are available. Candidates: live
// functions with nothing in flight (`in_flight`, per function index), no replica anywhere
// (complete or loading), no prewarm since their last arrival, and a predicted next use no later
// than now + their host swap estimate (the model is then loaded when the window opens); the
// soonest first, then the costliest miss (host swap + execution over the SLO), then the lower id.
// GPUs: available ones whose own and PCIe neighbours' host links are idle, the most free memory
// first, then the lowest. Victims on that GPU: replicas not executing, loading or a copy's
// source, whose predicted next use is strictly later than the candidate's; the farthest first
// (never-predicted before all, then least recently used, then the lower id), taken until the
// model fits. Nothing when no candidate fits anywhere.
std::optional<PrewarmPlan> plan_prewarm(const NodeState& node, const FunctionTable& functions,
                                        const IdleHistograms& histograms,
                                        const std::vector<uint32_t>& in_flight,
                                        const PrewarmOptions& options, Time now);

// The first time after `now` at which a function becomes due for a prewarm (the rules above);
// kNotExpected if none will without an arrival. One already due waits for an event instead.
Time next_prewarm_due(const NodeState& node, const FunctionTable& functions,
                      const IdleHistograms& histograms, const std::vector<uint32_t>& in_flight,
                      Time now);

}  // namespace hiber::scheduler
