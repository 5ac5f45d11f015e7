#include "sim/azure_arrivals.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace hiber::sim {
namespace {

using scheduler::Duration;
using scheduler::kSecond;
using scheduler::Rng;
using scheduler::Time;

constexpr Duration kMinute = 60 * kSecond;

double standard_normal(Rng& rng) {
  // Box-Muller; 1 - u keeps the logarithm finite.
  const double r = std::sqrt(-2 * std::log(1 - rng.uniform_double()));
  return r * std::cos(2 * std::numbers::pi * rng.uniform_double());
}

// Knuth's product of uniforms, in chunks of at most 16 so exp(-chunk) stays far from underflow;
// a sum of Poisson variables is Poisson. Costs about one uniform per count.
uint32_t poisson(double lambda, Rng& rng) {
  uint32_t n = 0;
  while (lambda > 0) {
    const double chunk = std::min(lambda, 16.0);
    lambda -= chunk;
    const double limit = std::exp(-chunk);
    for (double p = rng.uniform_double(); p > limit; p *= rng.uniform_double()) ++n;
  }
  return n;
}

// E[exp(-c L)] for L = exp(sigma Z - sigma^2 / 2), Z standard normal: the chance that an "on"
// minute of mean level c has no arrival. Simpson's rule over z in [-8, 8].
double empty_on_minute(double c, double sigma) {
  if (sigma == 0) return std::exp(-c);
  constexpr int kSteps = 400;
  constexpr double kLo = -8, kHi = 8, kH = (kHi - kLo) / kSteps;
  double sum = 0;
  for (int i = 0; i <= kSteps; ++i) {
    const double z = kLo + i * kH;
    const double f = std::exp(-0.5 * z * z - c * std::exp(sigma * z - 0.5 * sigma * sigma));
    sum += f * (i == 0 || i == kSteps ? 1 : (i % 2 ? 4 : 2));
  }
  return sum * kH / 3 / std::sqrt(2 * std::numbers::pi);
}

// The root of an increasing-or-decreasing f on [lo, hi]; the nearer end when f keeps one sign.
template <typename F>
double solve(F f, double lo, double hi) {
  const double f_lo = f(lo), f_hi = f(hi);
  if ((f_lo > 0) == (f_hi > 0)) return std::abs(f_lo) < std::abs(f_hi) ? lo : hi;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    if ((f(mid) > 0) == (f_lo > 0)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

}  // namespace

MinuteStats minute_stats(const std::vector<uint32_t>& counts) {
  MinuteStats s;
  if (counts.empty()) return s;
  const double n = static_cast<double>(counts.size());
  double idle = 0;
  for (uint32_t c : counts) {
    s.mean += c / n;
    if (c == 0) idle += 1;
  }
  s.idle_share = idle / n;
  double var = 0, cov = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double d = counts[i] - s.mean;
    var += d * d / n;
    if (i + 1 < counts.size()) cov += d * (counts[i + 1] - s.mean) / (n - 1);
  }
  if (s.mean > 0) s.cv = std::sqrt(var) / s.mean;
  if (var > 0) s.lag1 = cov / var;
  return s;
}

MinuteStats expected_minute_stats(const RateProcess& p, double mean) {
  MinuteStats s;
  s.mean = mean;
  const double var_level = std::exp(p.sigma * p.sigma) / p.on_share - 1;
  const double var = mean + mean * mean * var_level;
  s.cv = std::sqrt(var) / mean;
  s.idle_share = (1 - p.on_share) + p.on_share * empty_on_minute(mean / p.on_share, p.sigma);
  // E[S S'] = pi q with q = P(on -> on) = pi + rho (1 - pi); E[L L'] = exp(rho sigma^2).
  const double stay_on = p.on_share + p.persistence * (1 - p.on_share);
  const double cov =
      mean * mean * (stay_on / p.on_share * std::exp(p.persistence * p.sigma * p.sigma) - 1);
  s.lag1 = cov / var;
  return s;
}

Result<RateProcess> fit_rate_process(const MinuteStats& target, double mean) {
  if (!(mean > 0) || std::isinf(mean))
    return error(ErrorCode::kInvalidValue, "burst fit: the mean rate must be finite and > 0, got ",
                 mean);
  if (!(target.cv >= 0) || std::isinf(target.cv) || !(target.idle_share >= 0) ||
      !(target.idle_share < 1) || !(target.lag1 > -1) || !(target.lag1 < 1))
    return error(ErrorCode::kInvalidValue,
                 "burst fit: need cv >= 0, idle share in [0, 1) and lag-1 in (-1, 1); got cv ",
                 target.cv, ", idle ", target.idle_share, ", lag-1 ", target.lag1);
  RateProcess p;
  // cv^2 = 1 / mean + exp(sigma^2) / pi - 1, so pi exp(sigma^2) = k is fixed by the cv.
  const double k = target.cv * target.cv + 1 - 1 / mean;
  if (k <= 1) return p;  // at most Poisson's spread: Poisson it is
  const auto sigma_at = [k](double pi) { return std::sqrt(std::max(0.0, std::log(pi * k))); };
  p.on_share = solve(
      [&](double pi) {
        const RateProcess q{pi, sigma_at(pi), 0};
        return expected_minute_stats(q, mean).idle_share - target.idle_share;
      },
      1 / k, 1.0);
  p.sigma = sigma_at(p.on_share);
  if (target.lag1 > 0) {
    p.persistence = solve(
        [&](double rho) {
          const RateProcess q{p.on_share, p.sigma, rho};
          return expected_minute_stats(q, mean).lag1 - target.lag1;
        },
        0.0, 0.999);
  }
  return p;
}

std::vector<uint32_t> generate_minute_counts(const RateProcess& p, double mean, int minutes,
                                             Rng& rng) {
  std::vector<uint32_t> counts;
  if (minutes <= 0 || !(mean > 0)) return counts;
  counts.reserve(minutes);
  // P(off -> on) = pi (1 - rho), P(on -> off) = (1 - pi)(1 - rho): stationary at pi, lag-1 rho.
  const double to_on = p.on_share * (1 - p.persistence);
  const double to_off = (1 - p.on_share) * (1 - p.persistence);
  const double innovation = std::sqrt(1 - p.persistence * p.persistence);
  bool on = rng.uniform_double() < p.on_share;
  double z = standard_normal(rng);
  for (int m = 0; m < minutes; ++m) {
    if (m > 0) {
      on = rng.uniform_double() < (on ? 1 - to_off : to_on);
      z = p.persistence * z + innovation * standard_normal(rng);
    }
    const double level = std::exp(p.sigma * z - 0.5 * p.sigma * p.sigma);
    counts.push_back(on ? poisson(mean / p.on_share * level, rng) : 0);
  }
  return counts;
}

MinuteStats default_burst_target(double mean, Rng& rng) {
  MinuteStats t;
  t.mean = mean;
  t.cv = std::exp(std::log(3.0) * rng.uniform_double());  // log-uniform in [1, 3]
  t.idle_share = 0.1 + 0.4 * rng.uniform_double();        // uniform in [0.1, 0.5]
  t.lag1 = 0.3 + 0.4 * rng.uniform_double();              // uniform in [0.3, 0.7]
  return t;
}

std::vector<Time> azure_arrivals(const RateProcess& p, double mean, Duration duration, Rng& rng) {
  std::vector<Time> out;
  if (duration <= 0) return out;
  const int minutes = static_cast<int>((duration + kMinute - 1) / kMinute);
  const std::vector<uint32_t> counts = generate_minute_counts(p, mean, minutes, rng);
  for (int m = 0; m < minutes; ++m) {
    const size_t first = out.size();
    const Time start = static_cast<Time>(m) * kMinute;
    for (uint32_t i = 0; i < counts[m]; ++i) {
      // A partial last minute keeps its share: arrivals past the end are dropped.
      const Time t = start + static_cast<Time>(rng.uniform(kMinute));
      if (t < duration) out.push_back(t);
    }
    std::sort(out.begin() + first, out.end());
  }
  return out;
}

Result<std::vector<RateProcess>> burst_shapes_from_trace(const std::vector<TraceFunction>& rows,
                                                         bool http_only, double min_mean) {
  std::vector<RateProcess> shapes;
  for (const TraceFunction& row : rows) {
    if (http_only && row.trigger != "http") continue;
    MinuteStats stats = minute_stats(row.per_minute);
    if (stats.mean < min_mean) continue;
    // The process has no negative correlation; short rows can even estimate one below -1.
    stats.lag1 = std::clamp(stats.lag1, 0.0, 0.99);
    Result<RateProcess> shape = fit_rate_process(stats, stats.mean);
    if (!shape.ok()) return shape.status().with_context(str_cat("trace row ", row.function));
    shapes.push_back(*shape);
  }
  if (shapes.empty())
    return error(ErrorCode::kInvalidValue, "no trace row", http_only ? " (HTTP-triggered)" : "",
                 " has a mean of at least ", min_mean, " invocations per minute");
  return shapes;
}

}  // namespace hiber::sim
