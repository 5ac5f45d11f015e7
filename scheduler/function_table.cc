#include "scheduler/function_table.h"

#include <algorithm>

namespace hiber::scheduler {
namespace {

// The nearest Duration to a mean of durations (>= 0); cheaper than std::llround, which the
// estimates would call on every request.
Duration rounded(double mean) { return static_cast<Duration>(mean + 0.5); }

}  // namespace

WindowTotals& WindowTotals::operator+=(const WindowTotals& o) {
  arrivals += o.arrivals;
  completions += o.completions;
  on_time += o.on_time;
  busy += o.busy;
  return *this;
}

WindowTotals& WindowTotals::operator-=(const WindowTotals& o) {
  arrivals -= o.arrivals;
  completions -= o.completions;
  on_time -= o.on_time;
  busy -= o.busy;
  return *this;
}

SlidingWindow::SlidingWindow(const WindowOptions& options)
    : width_(std::max<Duration>(1, options.length / std::max(1, options.buckets))),
      buckets_(static_cast<size_t>(std::max(1, options.buckets))) {}

int64_t SlidingWindow::index_of(Time t) const {
  // Most times fall in the window's last bucket: a multiply instead of a 64-bit division.
  if (newest_ != INT64_MIN) {
    const Time start = newest_ * width_;
    if (t >= start && t - start < width_) return newest_;
  }
  // Floor division: an epoch before zero must not fold two buckets into one.
  int64_t q = t / width_;
  if (t % width_ < 0) --q;
  return q;
}

SlidingWindow::Bucket& SlidingWindow::slot(int64_t index) {
  return buckets_[static_cast<size_t>(((index % size()) + size()) % size())];
}

WindowTotals SlidingWindow::without_expired(WindowTotals sum, int64_t end) const {
  if (sum == WindowTotals{}) return sum;  // counts only grow: nothing in the window at all
  // Walk the ring from the oldest bucket's slot; one modulo, not one per bucket.
  const size_t n = buckets_.size();
  size_t i = static_cast<size_t>((((newest_ + 1) % size()) + size()) % size());
  for (int64_t k = newest_ - size() + 1; k <= end - size(); ++k) {
    const Bucket& b = buckets_[i];
    if (b.index == k) sum -= b.totals;
    if (++i == n) i = 0;
  }
  return sum;
}

void SlidingWindow::slide_to(int64_t index) const {
  sum_ = newest_ == INT64_MIN || index - newest_ >= size() ? WindowTotals{}
                                                           : without_expired(sum_, index);
  newest_ = index;
}

void SlidingWindow::add(Time t, const WindowTotals& delta) {
  const int64_t index = index_of(t);
  if (newest_ != INT64_MIN && index <= newest_ - size()) return;
  if (newest_ == INT64_MIN || index > newest_) slide_to(index);
  // The slot holds this bucket or one that has left the window (and so left sum_ too).
  Bucket& b = slot(index);
  if (b.index != index) {
    b.index = index;
    b.totals = {};
  }
  b.totals += delta;
  sum_ += delta;
}

void SlidingWindow::add_arrival(Time t) { add(t, WindowTotals{1, 0, 0, 0}); }

void SlidingWindow::add_completion(Time t, bool on_time, Duration busy) {
  add(t, WindowTotals{0, 1, on_time ? 1u : 0u, busy});
}

WindowTotals SlidingWindow::totals(Time now) const {
  const int64_t current = index_of(now);
  if (newest_ == INT64_MIN || current > newest_) slide_to(current);
  if (current == newest_) return sum_;
  // A time before the window's end: walk the buckets.
  WindowTotals sum;
  for (const Bucket& b : buckets_) {
    if (b.index > current - size() && b.index <= current) sum += b.totals;
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
  if (index_.find(id))
    return error(ErrorCode::kInvalidValue, "function ", id, " is already registered");
  if (spec.model_bytes == 0)
    return error(ErrorCode::kInvalidValue, "function ", id, ": model_bytes must be > 0");
  if (spec.slo <= 0) return error(ErrorCode::kInvalidValue, "function ", id, ": slo must be > 0");
  if (!(spec.tail_percentile > 0 && spec.tail_percentile < 1))
    return error(ErrorCode::kInvalidValue, "function ", id, ": tail_percentile ",
                 spec.tail_percentile, " is not in (0, 1)");
  if (spec.exec_time_hint < 0 || spec.swap_time_hint < 0)
    return error(ErrorCode::kInvalidValue, "function ", id, ": negative time hint");
  const auto index = static_cast<FunctionIndex>(specs_.size());
  index_.insert(id, index);
  ids_.push_back(id);
  specs_.push_back(spec);
  FunctionStats stats;
  stats.window = SlidingWindow(window_options_);
  stats.registered_at = now;
  stats.last_arrival = now;
  stats_.push_back(std::move(stats));
  heavy_.push_back(0);
  live_.push_back(true);
  reclassify(index);
  return index;
}

Status FunctionTable::remove(FunctionId id) {
  const std::optional<FunctionIndex> found = index_.find(id);
  if (!found) return error(ErrorCode::kNotFound, "function ", id, " is not registered");
  const FunctionIndex i = *found;
  live_[i.value()] = false;
  index_.erase(id);
  return Status();
}

std::optional<FunctionIndex> FunctionTable::find(FunctionId id) const { return index_.find(id); }

void FunctionTable::set_model_bytes(FunctionIndex i, uint64_t bytes) {
  specs_[i.value()].model_bytes = bytes;
  // Without a measured or registered swap time, the estimate (and so the label) follows the size.
  reclassify(i);
}

void FunctionTable::record_arrival(FunctionIndex i, Time t) {
  FunctionStats& s = stats_[i.value()];
  s.window.add_arrival(t);
  ++s.requests;
  s.last_arrival = t;
}

void FunctionTable::record_completion(FunctionIndex i, Time t, bool on_time, Duration busy) {
  stats_[i.value()].window.add_completion(t, on_time, busy);
}

void FunctionTable::record_exec(FunctionIndex i, Duration d) {
  stats_[i.value()].exec.add(static_cast<double>(d), classifier_.options().ewma_alpha);
  reclassify(i);
}

void FunctionTable::record_host_swap(FunctionIndex i, Duration d) {
  stats_[i.value()].host_swap.add(static_cast<double>(d), classifier_.options().ewma_alpha);
  reclassify(i);
}

void FunctionTable::reclassify(FunctionIndex i) {
  const FunctionSpec& spec = specs_[i.value()];
  FunctionStats& s = stats_[i.value()];
  HeavinessInputs in;
  in.host_swap = &s.host_swap;
  in.exec = &s.exec;
  in.heavy_hint = spec.heavy_hint;
  in.swap_time_hint = swap_estimate(i);
  in.exec_time_hint = spec.exec_time_hint;
  heavy_[i.value()] = classifier_.heavy(in) ? 1 : 0;
}

double FunctionTable::arrival_rate(FunctionIndex i, Time now) const {
  return arrival_rate(i, now, stats_[i.value()].window.totals(now));
}

double FunctionTable::arrival_rate(FunctionIndex i, Time now, const WindowTotals& totals) const {
  const FunctionStats& s = stats_[i.value()];
  const Duration span = s.window.span(now, s.registered_at);
  return static_cast<double>(totals.arrivals) * kSecond / static_cast<double>(span);
}

Duration FunctionTable::swap_estimate(FunctionIndex i) const {
  const FunctionStats& s = stats_[i.value()];
  if (s.host_swap.samples > 0) return rounded(s.host_swap.value);
  const FunctionSpec& spec = specs_[i.value()];
  if (spec.swap_time_hint > 0) return spec.swap_time_hint;
  if (host_gbps_ <= 0) return 0;
  // bytes / (GB/s) = ns, with GB = 1e9 bytes as link speeds are quoted.
  return static_cast<Duration>(static_cast<double>(spec.model_bytes) / host_gbps_);
}

Duration FunctionTable::exec_estimate(FunctionIndex i) const {
  const FunctionStats& s = stats_[i.value()];
  if (s.exec.samples > 0) return rounded(s.exec.value);
  return specs_[i.value()].exec_time_hint;
}

double FunctionTable::service_seconds(FunctionIndex i, Time now) const {
  return service_seconds(i, stats_[i.value()].window.totals(now));
}

double FunctionTable::service_seconds(FunctionIndex i, const WindowTotals& totals) const {
  if (totals.completions > 0)
    return static_cast<double>(totals.busy) / static_cast<double>(totals.completions) / kSecond;
  return static_cast<double>(exec_estimate(i)) / kSecond;
}

double FunctionTable::demand(FunctionIndex i, Time now) const {
  return demand(i, now, stats_[i.value()].window.totals(now));
}

double FunctionTable::demand(FunctionIndex i, Time now, const WindowTotals& totals) const {
  return arrival_rate(i, now, totals) * service_seconds(i, totals);
}

}  // namespace hiber::scheduler
