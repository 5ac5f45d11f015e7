#include "sim/metrics.h"

#include <algorithm>
#include <cmath>

namespace hiber::sim {

const char* start_kind_name(StartKind kind) {
  switch (kind) {
    case StartKind::kResident: return "resident";
    case StartKind::kPeer: return "peer";
    case StartKind::kHost: return "host";
    case StartKind::kWarm: return "warm";
    case StartKind::kCold: return "cold";
    case StartKind::kFailed: return "failed";
    case StartKind::kRejected: return "rejected";
    case StartKind::kUnfinished: return "unfinished";
  }
  return "unknown";
}

double quantile(std::vector<float>& sample, double q) {
  if (sample.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sample.size())));
  const size_t index = std::min(sample.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(index),
                   sample.end());
  return sample[index];
}

Recorder::Recorder(const Workload& workload, Time measure_from, int nodes, int gpus_per_node)
    : workload_(&workload),
      measure_from_(measure_from),
      measure_to_(workload.duration),
      nodes_(nodes),
      gpus_per_node_(gpus_per_node),
      functions_(workload.functions.size()),
      latency_ms_by_model_(paper_models().size()),
      busy_(static_cast<size_t>(nodes) * gpus_per_node, 0.0) {}

void Recorder::record(const Outcome& o) {
  if (o.arrival < measure_from_) return;
  const SimFunction& fn = workload_->functions[o.function];
  PerFunction& f = functions_[o.function];
  ++f.requests;
  ++by_kind_[static_cast<int>(o.kind)];
  float latency_ms = std::numeric_limits<float>::infinity();
  if (o.completed) {
    ++f.completed;
    const Duration latency = o.finish - o.arrival;
    if (latency <= fn.slo) ++f.on_time;
    latency_ms = static_cast<float>(static_cast<double>(latency) / kMillisecond);
    if (o.kind != StartKind::kFailed) {
      load_sum_ns_ += static_cast<double>(o.load);
      ++load_count_;
    }
  }
  latency_ms_by_model_[fn.model].push_back(latency_ms);
  normalized_.push_back(
      static_cast<float>(latency_ms / (static_cast<double>(fn.slo) / kMillisecond)));
}

void Recorder::add_busy(int node, int gpu, Time from, Time to) {
  from = std::max(from, measure_from_);
  to = std::min(to, measure_to_);
  if (to > from)
    busy_[static_cast<size_t>(node) * gpus_per_node_ + gpu] += static_cast<double>(to - from);
}

Results Recorder::results() const {
  Results r;
  r.functions_by_model.assign(paper_models().size(), 0);
  r.compliant_by_model.assign(paper_models().size(), 0);
  for (size_t i = 0; i < functions_.size(); ++i) {
    const PerFunction& f = functions_[i];
    r.requests += f.requests;
    r.completed += f.completed;
    r.on_time += f.on_time;
    if (f.completed > 0) ++r.executed;
    if (f.requests == 0) continue;
    ++r.functions_with_requests;
    const int model = workload_->functions[i].model;
    ++r.functions_by_model[model];
    const double p = workload_->functions[i].percentile;
    const uint64_t needed =
        static_cast<uint64_t>(std::ceil(p * static_cast<double>(f.requests) - 1e-9));
    if (f.on_time >= needed) {
      ++r.compliant;
      ++r.compliant_by_model[model];
    }
  }
  r.compliant_ratio =
      r.functions_with_requests ? static_cast<double>(r.compliant) / r.functions_with_requests : 0;
  std::copy(std::begin(by_kind_), std::end(by_kind_), std::begin(r.by_kind));
  const uint64_t late_binding = by_kind_[0] + by_kind_[1] + by_kind_[2];
  r.hit_ratio = late_binding ? static_cast<double>(by_kind_[0]) / late_binding : 0;
  r.mean_load_ms = load_count_ ? load_sum_ns_ / load_count_ / kMillisecond : 0;

  auto quantiles = [](std::vector<float> sample) {
    LatencyQuantiles q;
    q.p50 = quantile(sample, 0.50);
    q.p90 = quantile(sample, 0.90);
    q.p98 = quantile(sample, 0.98);
    q.p99 = quantile(sample, 0.99);
    return q;
  };
  std::vector<float> all;
  for (const auto& v : latency_ms_by_model_) all.insert(all.end(), v.begin(), v.end());
  r.latency = quantiles(std::move(all));
  for (const auto& v : latency_ms_by_model_) {
    r.latency_by_model.push_back(quantiles(v));
    r.requests_by_model.push_back(v.size());
  }

  const double window = static_cast<double>(std::max<Time>(1, measure_to_ - measure_from_));
  double load_total = 0;
  for (double b : busy_) {
    r.gpu_load.push_back(b / window);
    load_total += b / window;
  }
  r.mean_gpu_load = busy_.empty() ? 0 : load_total / busy_.size();
  for (int n = 0; n < nodes_; ++n) {
    const double* loads = r.gpu_load.data() + static_cast<size_t>(n) * gpus_per_node_;
    const double max = *std::max_element(loads, loads + gpus_per_node_);
    double mean = 0, var = 0;
    for (int g = 0; g < gpus_per_node_; ++g)
      mean += (max > 0 ? loads[g] / max : 0) / gpus_per_node_;
    for (int g = 0; g < gpus_per_node_; ++g) {
      const double x = (max > 0 ? loads[g] / max : 0) - mean;
      var += x * x / gpus_per_node_;
    }
    r.node_load_variance.push_back(var);
  }

  std::vector<float> normalized = normalized_;
  for (int k = 7; k >= 2; --k) r.normalized_quantile_levels.push_back(1.0 / (1 << k));
  r.normalized_quantile_levels.push_back(0.5);
  for (int k = 2; k <= 7; ++k) r.normalized_quantile_levels.push_back(1.0 - 1.0 / (1 << k));
  for (double level : r.normalized_quantile_levels)
    r.normalized_latency_quantiles.push_back(quantile(normalized, level));
  return r;
}

}  // namespace hiber::sim
