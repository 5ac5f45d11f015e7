#include "scheduler/function_table.h"

#include <algorithm>
#include <cmath>

namespace hiber::scheduler {

SlidingWindow::SlidingWindow(const WindowOptions& options)
    : width_(std::max<Duration>(1, options.length / std::max(1, options.buckets))),
      buckets_(static_cast<size_t>(std::max(1, options.buckets))) {}

int64_t SlidingWindow::index_of(Time t) const {
  // Floor division: an epoch before zero must not fold two buckets into one.
  int64_t q = t / width_;
  if (t % width_ < 0) --q;
  return q;
}

SlidingWindow::Bucket& SlidingWindow::bucket_at(Time t) {
  const int64_t index = index_of(t);
  const int64_t n = static_cast<int64_t>(buckets_.size());
  Bucket& b = buckets_[static_cast<size_t>(((index % n) + n) % n)];
  if (b.index != index) {
    b.index = index;
    b.totals = {};
  }
  return b;
}

void SlidingWindow::add_arrival(Time t) { ++bucket_at(t).totals.arrivals; }

void SlidingWindow::add_completion(Time t, bool on_time, Duration busy) {
  WindowTotals& totals = bucket_at(t).totals;
  ++totals.completions;
  if (on_time) ++totals.on_time;
  totals.busy += busy;
}

WindowTotals SlidingWindow::totals(Time now) const {
  const int64_t current = index_of(now);
  const int64_t oldest = current - static_cast<int64_t>(buckets_.size()) + 1;
  WindowTotals sum;
  for (const Bucket& b : buckets_) {
    if (b.index < oldest || b.index > current) continue;
    sum.arrivals += b.totals.arrivals;
    sum.completions += b.totals.completions;
    sum.on_time += b.totals.on_time;
    sum.busy += b.totals.busy;
  }
  return sum;
}

Duration SlidingWindow::span(Time now, Time since) const {
  const int64_t oldest = index_of(now) - static_cast<int64_t>(buckets_.size()) + 1;
  const Time start = std::max<Time>(oldest * width_, since);
  return std::max<Duration>(width_, now - start);
}

FunctionTable::FunctionTable(const WindowOptions& window, const HeavinessOptions& heaviness,
                             double host_gbps)
    : window_options_(window), classifier_(heaviness), host_gbps_(host_gbps) {}

Result<FunctionIndex> FunctionTable::add(FunctionId id, const FunctionSpec& spec, Time now) {
  if (index_.count(id)) return error(ErrorCode::kInvalidValue, "function ", id, " is already registered");
  if (spec.model_bytes == 0)
    return error(ErrorCode::kInvalidValue, "function ", id, ": model_bytes must be > 0");
  if (spec.slo <= 0) return error(ErrorCode::kInvalidValue, "function ", id, ": slo must be > 0");
  if (!(spec.tail_percentile > 0 && spec.tail_percentile < 1))
    return error(ErrorCode::kInvalidValue, "function ", id, ": tail_percentile ",
                 spec.tail_percentile, " is not in (0, 1)");
  if (spec.exec_time_hint < 0 || spec.swap_time_hint < 0)
    return error(ErrorCode::kInvalidValue, "function ", id, ": negative time hint");
  const auto index = static_cast<FunctionIndex>(specs_.size());
  index_.emplace(id, index);
  ids_.push_back(id);
  specs_.push_back(spec);
  FunctionStats stats;
  stats.window = SlidingWindow(window_options_);
  stats.registered_at = now;
  stats.last_arrival = now;
  stats_.push_back(std::move(stats));
  live_.push_back(true);
  reclassify(index);
  return index;
}

Status FunctionTable::remove(FunctionId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return error(ErrorCode::kNotFound, "function ", id, " is not registered");
  live_[it->second] = false;
  index_.erase(it);
  return Status();
}

FunctionIndex FunctionTable::find(FunctionId id) const {
  auto it = index_.find(id);
  return it == index_.end() ? kNoFunction : it->second;
}

void FunctionTable::record_arrival(FunctionIndex i, Time t) {
  FunctionStats& s = stats_[i];
  s.window.add_arrival(t);
  ++s.requests;
  s.last_arrival = t;
}

void FunctionTable::record_completion(FunctionIndex i, Time t, bool on_time, Duration busy) {
  stats_[i].window.add_completion(t, on_time, busy);
}

void FunctionTable::record_exec(FunctionIndex i, Duration d) {
  stats_[i].exec.add(static_cast<double>(d), classifier_.options().ewma_alpha);
  reclassify(i);
}

void FunctionTable::record_host_swap(FunctionIndex i, Duration d) {
  stats_[i].host_swap.add(static_cast<double>(d), classifier_.options().ewma_alpha);
  reclassify(i);
}

void FunctionTable::reclassify(FunctionIndex i) {
  const FunctionSpec& spec = specs_[i];
  FunctionStats& s = stats_[i];
  HeavinessInputs in;
  in.host_swap = &s.host_swap;
  in.exec = &s.exec;
  in.heavy_hint = spec.heavy_hint;
  in.swap_time_hint = swap_estimate(i);
  in.exec_time_hint = spec.exec_time_hint;
  s.heavy = classifier_.heavy(in);
}

double FunctionTable::arrival_rate(FunctionIndex i, Time now) const {
  const FunctionStats& s = stats_[i];
  const Duration span = s.window.span(now, s.registered_at);
  return static_cast<double>(s.window.totals(now).arrivals) * kSecond / static_cast<double>(span);
}

Duration FunctionTable::swap_estimate(FunctionIndex i) const {
  const FunctionStats& s = stats_[i];
  if (s.host_swap.samples > 0) return static_cast<Duration>(std::llround(s.host_swap.value));
  const FunctionSpec& spec = specs_[i];
  if (spec.swap_time_hint > 0) return spec.swap_time_hint;
  if (host_gbps_ <= 0) return 0;
  // bytes / (GB/s) = ns, with GB = 1e9 bytes as link speeds are quoted.
  return static_cast<Duration>(static_cast<double>(spec.model_bytes) / host_gbps_);
}

double FunctionTable::service_seconds(FunctionIndex i, Time now) const {
  const FunctionStats& s = stats_[i];
  const WindowTotals totals = s.window.totals(now);
  if (totals.completions > 0)
    return static_cast<double>(totals.busy) / static_cast<double>(totals.completions) / kSecond;
  if (s.exec.samples > 0) return s.exec.value / kSecond;
  return static_cast<double>(specs_[i].exec_time_hint) / kSecond;
}

double FunctionTable::demand(FunctionIndex i, Time now) const {
  return arrival_rate(i, now) * service_seconds(i, now);
}

}  // namespace hiber::scheduler
