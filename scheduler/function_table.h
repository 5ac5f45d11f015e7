// What the scheduler knows about each registered function: what it declared (model size, SLO,
// hints) and what the node has observed (arrivals, completions on time or late, execution and
// swap times). Policies read it; only the Scheduler writes it.
//
// Observations over time go into a sliding window of fixed buckets (SlidingWindow): constant
// memory per function whatever its rate, O(1) per event, and a bucket boundary that is a plain
// division, so tests can compute every figure by hand. The window serves two policies:
//   - RRC (§5.2) counts requests n and on-time requests m "over a sliding window";
//   - the RRC threshold needs each function's demand on the GPUs: arrival rate x mean service
//     time (the GPU time from dispatch to completion, swap included).
#pragma once

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "scheduler/heaviness.h"
#include "scheduler/id_index.h"
#include "scheduler/interference.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

// What a function declares when it is registered.
struct FunctionSpec {
  std::string name;                // for logs and tools only
  uint64_t model_bytes = 0;        // GPU memory one replica of the model takes; > 0
  Duration slo = 0;                // deadline, from arrival to completion; > 0
  double tail_percentile = 0.98;   // p of the SLO: this share of requests must meet it; (0, 1)
  std::optional<bool> heavy_hint;  // heaviness label until it is measured (heaviness.h)
  Duration exec_time_hint = 0;     // expected execution time with the model resident; 0 = unknown
  Duration swap_time_hint = 0;     // expected host->GPU swap time; 0 = bytes / PCIe bandwidth
  // What a request asks of a GPU while it runs alone (interference.h); unknown: the whole GPU,
  // so that spatial sharing predicts the worst for it.
  std::optional<Intensity> intensity;
};

struct WindowOptions {
  // The RRC window. Torpor's functions see 5 to 80 requests a minute (§7.2-7.3), so a minute
  // holds enough requests for a 98th percentile to mean something, and forgets a burst within
  // a minute.
  Duration length = 60 * kSecond;
  // Granularity: the window slides one bucket (length / buckets) at a time.
  int buckets = 12;
};

// Totals over the window.
struct WindowTotals {
  uint64_t arrivals = 0;
  uint64_t completions = 0;  // n of RRC
  uint64_t on_time = 0;      // m of RRC
  Duration busy = 0;         // GPU time of the completed requests (dispatch to done)

  WindowTotals& operator+=(const WindowTotals& o);
  WindowTotals& operator-=(const WindowTotals& o);
  friend bool operator==(const WindowTotals&, const WindowTotals&) = default;
};

// Counts in `buckets` buckets of width length / buckets. Bucket k covers
// [k * width, (k + 1) * width); at time t the window is the bucket holding t and the
// buckets - 1 before it.
//
// The sum over the window is kept as events come in and as totals() moves the window's end
// forward (a cache: totals() is const but slides it), so a query is one read, or a few
// subtractions for the buckets that left since the last one. The policies ask for a function's
// totals on every request and the RRC threshold for every function each second; with
// thousands of functions, a walk over every bucket would be a cache miss per bucket. Events
// older than the window are ignored (they are forgotten already). A query for a time before
// the window's end walks the buckets.
class SlidingWindow {
 public:
  SlidingWindow() = default;
  explicit SlidingWindow(const WindowOptions& options);

  void add_arrival(Time t);
  void add_completion(Time t, bool on_time, Duration busy);
  WindowTotals totals(Time now) const;

  // Time covered by the window at `now`, not before `since`: from the start of its oldest
  // bucket (or `since`, if later) to now; at least one bucket width, so a rate never divides
  // by ~0.
  Duration span(Time now, Time since) const;

  Duration width() const { return width_; }

 private:
  struct Bucket {
    int64_t index = INT64_MIN;
    WindowTotals totals;
  };
  void add(Time t, const WindowTotals& delta);
  // Moves the window's end to bucket `index` (> newest_), dropping buckets that leave it.
  void slide_to(int64_t index) const;
  // `sum` minus the buckets in (newest_ - n, end - n], those that leave when the end moves on.
  WindowTotals without_expired(WindowTotals sum, int64_t end) const;
  Bucket& slot(int64_t index);
  int64_t index_of(Time t) const;
  int64_t size() const { return static_cast<int64_t>(buckets_.size()); }

  Duration width_ = 5 * kSecond;
  std::vector<Bucket> buckets_;
  // The window's end: the highest bucket index written or queried.
  mutable int64_t newest_ = INT64_MIN;
  mutable WindowTotals sum_;  // the buckets in (newest_ - buckets, newest_]
};

// What the node has seen of one function.
struct FunctionStats {
  SlidingWindow window;
  uint64_t requests = 0;  // all arrivals since registration (LFU's frequency)
  Time registered_at = 0;
  Time last_arrival = 0;
  MovingMean exec;       // resident executions: dispatch to done, no swap
  MovingMean host_swap;  // host->GPU swaps: dispatch to swap finished
};

class FunctionTable {
 public:
  // `host_gbps`: the host bandwidth a swap estimate assumes when a function registers no swap
  // time (the slowest PCIe switch of the node, so the estimate errs long).
  FunctionTable(const WindowOptions& window, const HeavinessOptions& heaviness, double host_gbps);

  // kInvalidValue for a bad spec or an id already registered.
  Result<FunctionIndex> add(FunctionId id, const FunctionSpec& spec, Time now);
  // Frees the id; the slot is not reused (indices stay valid for policies' tables).
  Status remove(FunctionId id);

  // nullopt when id is not registered.
  std::optional<FunctionIndex> find(FunctionId id) const;
  // Slots ever handed out, including removed ones: the bound for per-index tables.
  size_t slots() const { return specs_.size(); }
  size_t live_count() const { return index_.size(); }
  bool live(FunctionIndex i) const { return i.value() < live_.size() && live_[i.value()]; }

  FunctionId id(FunctionIndex i) const { return ids_[i.value()]; }
  const FunctionSpec& spec(FunctionIndex i) const { return specs_[i.value()]; }
  const FunctionStats& stats(FunctionIndex i) const { return stats_[i.value()]; }
  // The current label (heaviness.h), recomputed on each sample.
  bool heavy(FunctionIndex i) const { return heavy_[i.value()] != 0; }

  // The model's size changed (hiberd learns it when the first run ends). REQUIRES: bytes > 0.
  void set_model_bytes(FunctionIndex i, uint64_t bytes);

  // Observations (the Scheduler reports them).
  void record_arrival(FunctionIndex i, Time t);
  void record_completion(FunctionIndex i, Time t, bool on_time, Duration busy);
  void record_exec(FunctionIndex i, Duration d);
  void record_host_swap(FunctionIndex i, Duration d);

  // Requests per second over the window.
  double arrival_rate(FunctionIndex i, Time now) const;
  // Expected host->GPU swap time: the measured mean once there is a sample, else the hint,
  // else model_bytes / host_gbps. Caching policies use it as the miss penalty.
  Duration swap_estimate(FunctionIndex i) const;
  // Expected execution time with the model resident: the measured mean once there is a sample,
  // else the hint, else 0 (unknown).
  Duration exec_estimate(FunctionIndex i) const;
  // Mean GPU time per request over the window (dispatch to done); without completions in the
  // window, the execution estimate (measured mean, else hint).
  double service_seconds(FunctionIndex i, Time now) const;
  // GPU-seconds per second the function asks of the node: arrival_rate x service_seconds.
  double demand(FunctionIndex i, Time now) const;
  // The same three from the window's totals at `now`, when the caller has them already.
  double arrival_rate(FunctionIndex i, Time now, const WindowTotals& totals) const;
  double service_seconds(FunctionIndex i, const WindowTotals& totals) const;
  double demand(FunctionIndex i, Time now, const WindowTotals& totals) const;

  const HeavinessClassifier& classifier() const { return classifier_; }
  const WindowOptions& window_options() const { return window_options_; }

 private:
  void reclassify(FunctionIndex i);

  WindowOptions window_options_;
  HeavinessClassifier classifier_;
  double host_gbps_;
  IdIndex index_;
  std::vector<FunctionId> ids_;
  std::vector<FunctionSpec> specs_;
  std::vector<FunctionStats> stats_;
  // Apart from stats_, densely: eviction reads the label of every replica on a GPU.
  std::vector<uint8_t> heavy_;
  std::vector<bool> live_;
};

}  // namespace hiber::scheduler
