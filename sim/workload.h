// What the simulated node is asked to do: the functions deployed on it and the times their
// requests arrive.
//
// Synthetic functions follow the paper's setup:
//   - Popularity like Fig. 2: 85% of functions invoked at most once a minute, 97% at most once
//     a second. We draw each function's mean rate (requests per minute) from the log-normal
//     distribution through those two points: ln(rate) ~ N(mu, sigma) with
//     Phi((0 - mu) / sigma) = 0.85 and Phi((ln 60 - mu) / sigma) = 0.97, i.e.
//     sigma = ln 60 / (z(0.97) - z(0.85)) = 4.849 and mu = -z(0.85) sigma = -5.026: a median
//     of one request every 2.5 hours and a long tail of busy functions, as in the Azure trace.
//   - §7.3's workloads are "sampled from production traces (Fig. 2), where function request
//     rates range from 5 to 30 r/m": the same distribution, conditioned on [5, 30]
//     (inverse-CDF sampling between the two quantiles).
//   - Arrivals are Poisson, or bursty: an on/off Markov-modulated Poisson process with the same
//     mean rate, all requests in the "on" periods (exponential, mean burst_on; "off" periods
//     mean burst_off), the shape of the paper's Fig. 1; or "azure": per-minute counts with the
//     Azure trace's burstiness at the same mean rate (sim/azure_arrivals.h).
//   - Models are assigned round-robin over the chosen models (§7: "distribute them across
//     inference functions in a round-robin manner").
//   - Deadlines per model class: 80 ms for CV models and 200 ms for Bert-qa at p98 (§7), 150
//     and 250 ms in the cluster experiments (§7.4).
// Each function draws from its own random stream (seed and function index), so adding
// functions leaves the others' arrivals unchanged, and a run is a pure function of its seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/azure_arrivals.h"
#include "sim/models.h"

namespace hiber::sim {

struct Deadlines {
  Duration vision = 80 * kMillisecond;
  Duration language = 200 * kMillisecond;
  double percentile = 0.98;

  Duration for_model(const Model& model) const {
    return model.model_class == ModelClass::kLanguage ? language : vision;
  }
};

// One deployed function.
struct SimFunction {
  std::string name;
  int model = 0;            // index into paper_models()
  double rate_per_min = 0;  // mean request rate
  Duration slo = 0;
  double percentile = 0.98;
};

struct Arrival {
  Time time = 0;
  uint32_t function = 0;  // index into Workload::functions
};

struct Workload {
  std::vector<SimFunction> functions;
  std::vector<Arrival> arrivals;  // sorted by (time, function)
  Time duration = 0;              // arrivals lie in [0, duration)
};

enum class ArrivalPattern : uint8_t { kPoisson, kBursty, kAzure };
Result<ArrivalPattern> parse_arrival_pattern(std::string_view name);

struct BurstOptions {
  // kBursty: mean "on" and "off" periods.
  Duration on = 20 * kSecond;
  Duration off = 100 * kSecond;
  // kAzure: each function draws one of these shapes (fitted from a trace's rows); empty = each
  // function fits default_burst_target() at its own mean rate.
  std::vector<RateProcess> azure_shapes;
};

// Fig. 2's rate distribution (requests per minute).
struct PopularityModel {
  double mu = -5.0257;
  double sigma = 4.8490;
  // Draws a rate with the quantile u in (0, 1).
  double rate_at(double u) const;
  // The quantile of a rate.
  double quantile_of(double rate_per_min) const;
};

struct SyntheticOptions {
  int functions = 100;
  Duration duration = 10 * 60 * kSecond;
  uint64_t seed = 1;
  // Rates are drawn from the popularity model conditioned on [min, max] requests per minute;
  // 0 and +inf keep the whole distribution.
  double min_rate_per_min = 5;
  double max_rate_per_min = 30;
  ArrivalPattern pattern = ArrivalPattern::kPoisson;
  BurstOptions burst;
  std::vector<int> models;  // round-robin over these; empty = all eight
  Deadlines deadlines;
};

Result<Workload> synthetic_workload(const SyntheticOptions& options);

// Arrival times of one function in [0, duration) (exposed for tests).
std::vector<Time> generate_arrivals(double rate_per_min, Duration duration, ArrivalPattern pattern,
                                    const BurstOptions& burst, uint64_t seed);

// Sorts arrivals by (time, function) and fills Workload::arrivals.
void merge_arrivals(std::vector<std::vector<Time>>& per_function, Workload* workload);

// Standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9).
double normal_quantile(double p);

}  // namespace hiber::sim
