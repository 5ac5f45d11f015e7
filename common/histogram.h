// Counts of observations in fixed buckets, as Prometheus histograms have them: status reports
// carry them (wire/schema/control.capnp Histogram) and /metrics exports them unchanged.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hiber {

struct Histogram {
  std::vector<double> upper_bounds;  // ascending; a last bucket (+Inf) follows
  std::vector<uint64_t> counts;      // per bucket, not cumulative: upper_bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;

  Histogram() = default;
  explicit Histogram(std::vector<double> bounds)
      : upper_bounds(std::move(bounds)), counts(upper_bounds.size() + 1, 0) {}

  // The bucket `value` falls in: the first whose upper bound is >= value (Prometheus's "le").
  size_t bucket_of(double value) const {
    return static_cast<size_t>(std::lower_bound(upper_bounds.begin(), upper_bounds.end(), value) -
                               upper_bounds.begin());
  }
  void observe(double value) {
    ++counts[bucket_of(value)];
    sum += value;
    ++count;
  }
  // Adds `other`'s counts; REQUIRES: the same bounds.
  void add(const Histogram& other) {
    for (size_t i = 0; i < counts.size() && i < other.counts.size(); ++i) {
      counts[i] += other.counts[i];
    }
    sum += other.sum;
    count += other.count;
  }
};

// Swap durations, seconds: from a small model over NVLink (~1 ms) to a large one from host.
inline std::vector<double> swap_seconds_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

// Calls per batch (wire/limits.h caps a batch at 4096).
inline std::vector<double> batch_size_bounds() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};
}

}  // namespace hiber
