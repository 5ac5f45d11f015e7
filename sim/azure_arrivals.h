// Bursty per-minute arrivals shaped like the Azure Functions trace (`--pattern=azure`).
//
// The trace gives invocations per function per minute and nothing finer. Its burstiness is
// summarised per function by three statistics of the per-minute counts N_m:
//   - cv:         sd(N) / mean(N);
//   - idle_share: the share of minutes with no invocation;
//   - lag1:       the correlation between consecutive minutes' counts.
//
// A function's counts come from a Markov-modulated, log-normal rate process with Poisson counts:
//   - an on/off chain S_m per minute, on with stationary probability `on_share` (pi);
//   - in "on" minutes a log-normal level L_m = exp(sigma Z_m - sigma^2 / 2) (mean 1), Z_m an AR(1)
//     standard normal;
//   - the chain and Z share one lag-1 correlation, `persistence` (rho);
//   - N_m ~ Poisson(mean / pi * S_m * L_m), so E[N] is the function's mean rate exactly: the
//     same load as Poisson arrivals at that rate.
// Each of the three parameters mostly sets one statistic (pi the idle minutes, sigma the spread,
// rho the correlation), and all three have closed forms (expected_minute_stats), so a target is
// fitted by one-dimensional root finding. Within a minute the counts are spread uniformly at
// random, as trace replay does (sim/azure_trace.h): the trace has no finer resolution.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "scheduler/random.h"
#include "scheduler/types.h"
#include "sim/azure_trace.h"

namespace hiber::sim {

struct MinuteStats {
  double mean = 0;        // invocations per minute
  double cv = 0;          // sd / mean (population sd); 0 when the mean is 0
  double idle_share = 0;  // minutes with no invocation / minutes
  double lag1 = 0;        // lag-1 autocorrelation; 0 when the counts are constant
};

// The statistics of one function's per-minute counts.
MinuteStats minute_stats(const std::vector<uint32_t>& counts);

// A function's burst shape, independent of its mean rate.
struct RateProcess {
  double on_share = 1;     // pi in (0, 1]: stationary share of "on" minutes
  double sigma = 0;        // log-normal spread of the level in "on" minutes
  double persistence = 0;  // rho in [0, 1): lag-1 correlation of the chain and of Z
};

// The statistics that counts from `process` at `mean_per_min` have, in expectation.
MinuteStats expected_minute_stats(const RateProcess& process, double mean_per_min);

// The process whose counts at `mean_per_min` have `target`'s cv, idle share and lag-1
// correlation (target.mean is ignored). A target outside what the process can reach (cv below
// Poisson's 1/sqrt(mean), more idle minutes than the cv allows, a lag-1 beyond the chain's) is
// met as closely as the bounds allow; expected_minute_stats says what was reached. An error for
// a mean <= 0 or a statistic that is not finite and >= 0 (idle_share and lag1 below 1).
Result<RateProcess> fit_rate_process(const MinuteStats& target, double mean_per_min);

// Per-minute counts for `minutes` minutes, starting in the stationary state.
std::vector<uint32_t> generate_minute_counts(const RateProcess& process, double mean_per_min,
                                             int minutes, scheduler::Rng& rng);

// The built-in burst targets (used unless a trace supplies them): what a function of mean
// `mean_per_min` aims for, drawn from `rng` (see docs/sim.md, "Azure-shaped arrivals").
MinuteStats default_burst_target(double mean_per_min, scheduler::Rng& rng);

// Arrival times in [0, duration) of a function with `process` at `mean_per_min`: per-minute
// counts, each spread uniformly over its minute, sorted.
std::vector<scheduler::Time> azure_arrivals(const RateProcess& process, double mean_per_min,
                                            scheduler::Duration duration, scheduler::Rng& rng);

// The burst shapes of a trace: every row (HTTP-triggered ones only with `http_only`) with a
// mean of at least `min_mean` invocations per minute, fitted at its own mean. An error names a
// row that cannot be fitted, or says that no row qualified.
Result<std::vector<RateProcess>> burst_shapes_from_trace(const std::vector<TraceFunction>& rows,
                                                         bool http_only, double min_mean);

}  // namespace hiber::sim
