#include "scheduler/prewarm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <tuple>

namespace hiber::scheduler {

Result<PrewarmRule> prewarm_rule_from_name(std::string_view name) {
  if (name == "none") return PrewarmRule::kNone;
  if (name == "histogram") return PrewarmRule::kHistogram;
  return error(ErrorCode::kInvalidValue, "unknown prewarm rule '", name,
               "' (known: none, histogram)");
}

Status validate(const PrewarmOptions& o) {
  if (o.bin <= 0 || o.bins < 1)
    return error(ErrorCode::kInvalidValue, "prewarm: ", o.bins, " bins of ", o.bin,
                 " ns (needs bins >= 1 and a width > 0)");
  if (!(o.head_percentile >= 0 && o.head_percentile < o.tail_percentile && o.tail_percentile <= 1))
    return error(ErrorCode::kInvalidValue, "prewarm: percentiles ", o.head_percentile, " and ",
                 o.tail_percentile, " (needs 0 <= head < tail <= 1)");
  if (!(o.min_cv >= 0 && std::isfinite(o.min_cv)) ||
      !(o.max_out_of_range >= 0 && o.max_out_of_range <= 1))
    return error(ErrorCode::kInvalidValue, "prewarm: min_cv ", o.min_cv, " or max_out_of_range ",
                 o.max_out_of_range, " out of range");
  if (o.keep_alive < 0) return error(ErrorCode::kInvalidValue, "prewarm: keep_alive is negative");
  if (o.keep_idle_gpus < 0)
    return error(ErrorCode::kInvalidValue, "prewarm: keep_idle_gpus is negative");
  return Status();
}

void IdleHistograms::ensure_slots(size_t slots) {
  if (functions_.size() < slots) functions_.resize(slots);
}

void IdleHistograms::forget(FunctionIndex f) {
  if (f.value() < functions_.size()) functions_[f.value()] = Function{};
}

void IdleHistograms::record_arrival(FunctionIndex f, Time now) {
  ensure_slots(f.value() + 1);
  Function& h = functions_[f.value()];
  if (h.seen && now >= h.last) {
    const int64_t bin = (now - h.last) / options_.bin;
    if (h.counts.empty()) h.counts.assign(static_cast<size_t>(options_.bins), 0);
    if (bin < options_.bins) {
      ++h.counts[static_cast<size_t>(bin)];
    } else {
      ++h.out_of_range;
    }
    ++h.samples;
  }
  h.seen = true;
  h.prewarmed = false;
  h.last = std::max(h.last, now);
}

void IdleHistograms::record_prewarm(FunctionIndex f) {
  ensure_slots(f.value() + 1);
  functions_[f.value()].prewarmed = true;
}

// The upper edge of the bin where the in-range samples reach share p (the paper rounds the head
// down and the tail up to whole bins; the lower edge for the head).
Duration IdleHistograms::percentile(const Function& h, double p) const {
  const uint64_t in_range = h.samples - h.out_of_range;
  const double target = p * static_cast<double>(in_range);
  uint64_t seen = 0;
  for (int b = 0; b < options_.bins; ++b) {
    seen += h.counts[static_cast<size_t>(b)];
    if (static_cast<double>(seen) >= target && seen > 0) return b * options_.bin;
  }
  return options_.bins * options_.bin;
}

bool IdleHistograms::representative(const Function& h) const {
  if (h.samples < options_.min_samples || h.counts.empty()) return false;
  if (static_cast<double>(h.out_of_range) >
      options_.max_out_of_range * static_cast<double>(h.samples))
    return false;
  const double n = static_cast<double>(options_.bins);
  double sum = 0, sum2 = 0;
  for (uint32_t c : h.counts) {
    sum += c;
    sum2 += static_cast<double>(c) * c;
  }
  const double mean = sum / n;
  const double var = std::max(0.0, sum2 / n - mean * mean);
  return mean > 0 && std::sqrt(var) / mean >= options_.min_cv;
}

std::optional<ArrivalWindow> IdleHistograms::window(FunctionIndex f) const {
  if (f.value() >= functions_.size() || !functions_[f.value()].seen) return std::nullopt;
  const Function& h = functions_[f.value()];
  if (!representative(h)) return ArrivalWindow{h.last, h.last + options_.keep_alive, false};
  const Duration head = percentile(h, options_.head_percentile);
  // The tail is the upper edge of its bin.
  const Duration tail = percentile(h, options_.tail_percentile) + options_.bin;
  return ArrivalWindow{h.last + head, h.last + tail, true};
}

Time IdleHistograms::next_use(FunctionIndex f, Time now) const {
  const std::optional<ArrivalWindow> w = window(f);
  if (!w || now > w->until) return kNotExpected;
  return std::max(now, w->from);
}

namespace {

// The share of its SLO that a miss in memory costs the function (as the slack eviction).
double miss_cost(const FunctionTable& functions, FunctionIndex f) {
  const Duration slo = functions.spec(f).slo;
  const double cost = static_cast<double>(functions.swap_estimate(f) + functions.exec_estimate(f));
  return slo > 0 ? cost / static_cast<double>(slo) : cost;
}

bool resident_anywhere(const NodeState& node, FunctionIndex f) {
  for (int g = 0; g < node.gpu_count(); ++g)
    if (node.find(g, f) != nullptr) return true;
  return false;
}

// Victims on `g` making room for `bytes`, all predicted later than `before`; false if that
// cannot make room.
bool plan_victims(const NodeState& node, const FunctionTable& functions,
                  const IdleHistograms& histograms, int g, uint64_t bytes, Time before, Time now,
                  std::vector<Eviction>* out) {
  out->clear();
  uint64_t free = node.free_bytes(g);
  if (free >= bytes) return true;
  const GpuState& gpu = node.gpu(g);
  std::vector<std::tuple<Time, Time, FunctionId, const Replica*>> order;  // (-next, last, id)
  for (const Replica& r : gpu.replicas) {
    if (r.loading || r.source_pins > 0 || gpu.running_function == r.function) continue;
    const Time next = histograms.next_use(r.function, now);
    if (next <= before) continue;
    // Farthest first: a negated next use sorts it so; kNotExpected the farthest of all.
    order.emplace_back(next == kNotExpected ? INT64_MIN : -next, r.last_used,
                       functions.id(r.function), &r);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  for (const auto& [key, last, id, replica] : order) {
    out->push_back(Eviction{id, g, replica->bytes});
    free += replica->bytes;
    if (free >= bytes) return true;
  }
  out->clear();
  return false;
}

// When f becomes due for a prewarm: its window opens within the time a host load takes, as the
// paper prewarms at the head, not ahead of it. kNotExpected when it is no candidate.
Time due_at(const NodeState& node, const FunctionTable& functions, const IdleHistograms& histograms,
            const std::vector<uint32_t>& in_flight, FunctionIndex f, Time now) {
  if (!functions.live(f)) return kNotExpected;
  if (f.value() < in_flight.size() && in_flight[f.value()] > 0) return kNotExpected;
  if (histograms.prewarmed(f) || resident_anywhere(node, f)) return kNotExpected;
  const Time next = histograms.next_use(f, now);
  if (next == kNotExpected) return kNotExpected;
  return next - functions.swap_estimate(f);
}

}  // namespace

Time next_prewarm_due(const NodeState& node, const FunctionTable& functions,
                      const IdleHistograms& histograms, const std::vector<uint32_t>& in_flight,
                      Time now) {
  Time first = kNotExpected;
  for (size_t i = 0; i < functions.slots(); ++i) {
    const Time due = due_at(node, functions, histograms, in_flight,
                            FunctionIndex{static_cast<uint32_t>(i)}, now);
    if (due > now) first = std::min(first, due);
  }
  return first;
}

std::optional<PrewarmPlan> plan_prewarm(const NodeState& node, const FunctionTable& functions,
                                        const IdleHistograms& histograms,
                                        const std::vector<uint32_t>& in_flight,
                                        const PrewarmOptions& options, Time now) {
  if (std::popcount(node.available()) <= options.keep_idle_gpus) return std::nullopt;
  // GPUs whose host link is idle: available, not loading, and no PCIe neighbour loading.
  std::vector<int> gpus;
  const GpuMask loading = node.host_loading();
  for (int g = 0; g < node.gpu_count(); ++g) {
    if ((node.available() & gpu_bit(g)) == 0 || (loading & gpu_bit(g)) != 0) continue;
    if ((loading & node.topology().pcie_neighbours(g)) != 0) continue;
    gpus.push_back(g);
  }
  if (gpus.empty()) return std::nullopt;
  std::sort(gpus.begin(), gpus.end(), [&](int a, int b) {
    return std::make_pair(node.free_bytes(b), -b) < std::make_pair(node.free_bytes(a), -a);
  });
  struct Candidate {
    Time next;
    double cost;
    FunctionId id;
    FunctionIndex f;
  };
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < functions.slots(); ++i) {
    const FunctionIndex f{static_cast<uint32_t>(i)};
    const Time next = histograms.next_use(f, now);
    if (due_at(node, functions, histograms, in_flight, f, now) > now) continue;
    candidates.push_back({next, miss_cost(functions, f), functions.id(f), f});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.next != b.next) return a.next < b.next;
    if (a.cost != b.cost) return a.cost > b.cost;
    return a.id < b.id;
  });
  PrewarmPlan plan;
  for (const Candidate& c : candidates) {
    const uint64_t bytes = functions.spec(c.f).model_bytes;
    for (int g : gpus) {
      if (node.usable_bytes(g) < bytes) continue;
      if (plan_victims(node, functions, histograms, g, bytes, c.next, now, &plan.evictions)) {
        plan.function = c.f;
        plan.gpu = g;
        return plan;
      }
    }
  }
  return std::nullopt;
}

}  // namespace hiber::scheduler
