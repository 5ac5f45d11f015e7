#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "scheduler/random.h"

namespace hiber::sim {
namespace {

// A function's own stream: the run's seed mixed with the function's index.
uint64_t stream_seed(uint64_t seed, uint64_t index) {
  return seed * 0x9e3779b97f4a7c15ULL + index * 0xd1b54a32d192ed03ULL + 1;
}

double exponential(scheduler::Rng& rng, double mean) {
  return -std::log(1.0 - rng.uniform_double()) * mean;
}

}  // namespace

Result<ArrivalPattern> parse_arrival_pattern(std::string_view name) {
  if (name == "poisson") return ArrivalPattern::kPoisson;
  if (name == "bursty") return ArrivalPattern::kBursty;
  if (name == "azure") return ArrivalPattern::kAzure;
  return error(ErrorCode::kInvalidValue, "unknown arrival pattern '", name,
               "' (known: poisson, bursty, azure)");
}

double normal_quantile(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double low = 0.02425;
  if (p <= 0) return -std::numeric_limits<double>::infinity();
  if (p >= 1) return std::numeric_limits<double>::infinity();
  if (p < low) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - low) {
    const double q = std::sqrt(-2 * std::log(1 - p));
    return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double q = p - 0.5;
  const double r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

double PopularityModel::rate_at(double u) const {
  return std::exp(mu + sigma * normal_quantile(u));
}

double PopularityModel::quantile_of(double rate_per_min) const {
  if (rate_per_min <= 0) return 0;
  if (std::isinf(rate_per_min)) return 1;
  return 0.5 * std::erfc(-(std::log(rate_per_min) - mu) / (sigma * std::sqrt(2.0)));
}

std::vector<Time> generate_arrivals(double rate_per_min, Duration duration, ArrivalPattern pattern,
                                    const BurstOptions& burst, uint64_t seed) {
  std::vector<Time> out;
  if (rate_per_min <= 0 || duration <= 0) return out;
  scheduler::Rng rng(seed);
  const double mean_gap = 60.0 * kSecond / rate_per_min;  // ns
  const double end = static_cast<double>(duration);
  if (pattern == ArrivalPattern::kPoisson) {
    for (double t = exponential(rng, mean_gap); t < end; t += exponential(rng, mean_gap))
      out.push_back(static_cast<Time>(t));
    return out;
  }
  if (pattern == ArrivalPattern::kAzure) {
    RateProcess shape;
    if (!burst.azure_shapes.empty()) {
      shape = burst.azure_shapes[rng.uniform(burst.azure_shapes.size())];
    } else {
      // The default targets are always in range, so the fit cannot fail.
      shape = *fit_rate_process(default_burst_target(rate_per_min, rng), rate_per_min);
    }
    return azure_arrivals(shape, rate_per_min, duration, rng);
  }
  // On/off: the same mean rate packed into the "on" share of time.
  const double on = static_cast<double>(burst.on);
  const double off = static_cast<double>(burst.off);
  const double on_gap = mean_gap * on / (on + off);
  // Start in the stationary state so the first minutes look like the rest.
  bool is_on = rng.uniform_double() < on / (on + off);
  double t = 0;
  while (t < end) {
    const double period_end = t + exponential(rng, is_on ? on : off);
    if (is_on) {
      for (double a = t + exponential(rng, on_gap); a < period_end && a < end;
           a += exponential(rng, on_gap))
        out.push_back(static_cast<Time>(a));
    }
    t = period_end;
    is_on = !is_on;
  }
  return out;
}

void merge_arrivals(std::vector<std::vector<Time>>& per_function, Workload* workload) {
  size_t total = 0;
  for (const auto& times : per_function) total += times.size();
  workload->arrivals.clear();
  workload->arrivals.reserve(total);
  for (size_t f = 0; f < per_function.size(); ++f) {
    for (Time t : per_function[f]) workload->arrivals.push_back({t, static_cast<uint32_t>(f)});
  }
  std::sort(workload->arrivals.begin(), workload->arrivals.end(),
            [](const Arrival& a, const Arrival& b) {
              return a.time != b.time ? a.time < b.time : a.function < b.function;
            });
}

Result<Workload> synthetic_workload(const SyntheticOptions& options) {
  if (options.functions <= 0) return error(ErrorCode::kInvalidValue, "functions must be > 0");
  if (options.duration <= 0) return error(ErrorCode::kInvalidValue, "duration must be > 0");
  if (!(options.min_rate_per_min >= 0) || !(options.max_rate_per_min > options.min_rate_per_min))
    return error(ErrorCode::kInvalidValue, "need 0 <= min rate < max rate, got [",
                 options.min_rate_per_min, ", ", options.max_rate_per_min, "]");
  if (options.burst.on <= 0 || options.burst.off < 0)
    return error(ErrorCode::kInvalidValue, "burst on must be > 0 and off >= 0");
  std::vector<int> models = options.models;
  if (models.empty()) {
    for (size_t i = 0; i < paper_models().size(); ++i) models.push_back(static_cast<int>(i));
  }
  for (int m : models) {
    if (m < 0 || m >= static_cast<int>(paper_models().size()))
      return error(ErrorCode::kInvalidValue, "model index ", m, " out of range");
  }
  const PopularityModel popularity;
  const double q_lo = popularity.quantile_of(options.min_rate_per_min);
  const double q_hi = popularity.quantile_of(options.max_rate_per_min);
  Workload w;
  w.duration = options.duration;
  std::vector<std::vector<Time>> times(options.functions);
  scheduler::Rng rates(stream_seed(options.seed, 0));
  for (int f = 0; f < options.functions; ++f) {
    SimFunction fn;
    fn.model = models[f % models.size()];
    const Model& model = paper_models()[fn.model];
    fn.name = str_cat("f", f, "-", model.name);
    fn.rate_per_min = popularity.rate_at(q_lo + (q_hi - q_lo) * rates.uniform_double());
    fn.slo = options.deadlines.for_model(model);
    fn.percentile = options.deadlines.percentile;
    times[f] = generate_arrivals(fn.rate_per_min, options.duration, options.pattern, options.burst,
                                 stream_seed(options.seed, f + 1));
    w.functions.push_back(std::move(fn));
  }
  merge_arrivals(times, &w);
  return w;
}

}  // namespace hiber::sim
