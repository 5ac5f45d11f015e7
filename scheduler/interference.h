// Interference between requests that execute on one GPU at once (spatial sharing), and the
// admission rule that decides whether a request may join a GPU that is already running others.
//
// The model (docs/scheduler.md, "Spatial sharing", has the numbers and where they come from).
// A request running alone uses a share of the GPU's compute space (SM occupancy; USHER's Creq)
// and of its memory bandwidth (USHER's Mreq, as its ground truth `dram_utilization` measures
// it). USHER (OSDI'24, §3.3) places models so that the shares on a GPU sum to at most 100% in
// both dimensions, and states that there is then no compute or memory interference. Beyond that
// we take the oversubscribed resource to be shared in proportion (a fluid, processor-sharing
// model): every request on the GPU slows by the same factor,
//
//     slowdown(S) = max(1, sum_{i in S} compute_i, sum_{i in S} memory_i).
//
// Two compute-heavy CNNs (compute ~0.9 each) then slow to 1.8x, a goodput ratio of 0.55: the
// value USHER's Fig. 2 reports for 87% (GPUlet) and 100% (AlpaServe) of models under naive
// multiplexing. A compute-heavy model beside a memory-heavy one slows less: USHER's pairing.
//
// The admission rule (spatial sharing, SchedulerOptions::sharing): a request may join a GPU's
// runners only if, under the slowdown of the enlarged set, it finishes by its deadline and so
// does every runner that would have finished by its own alone. A runner already late is not
// protected: slowing it cannot change that it is late.
#pragma once

#include <optional>
#include <span>

#include "scheduler/types.h"

namespace hiber::scheduler {

// What one request asks of a GPU while it runs alone, as shares of the whole GPU in (0, 1].
struct Intensity {
  double compute = 1;  // compute space (SM occupancy)
  double memory = 1;   // memory bandwidth
};

// The factor by which each of `set` slows when they run at once; 1 for one request or none.
double co_run_slowdown(std::span<const Intensity> set);

// One request executing on a GPU, as the admission rule sees it.
struct CoRunner {
  Intensity intensity;
  Duration work_left = 0;  // execution left, in time alone
  Time deadline = 0;
};

// The slowdown every request would run at if `incoming` joined `runners` at `now`; nullopt when
// that makes `incoming`, or a runner that would otherwise finish by its deadline, late.
std::optional<double> admit_co_runner(std::span<const CoRunner> runners, const CoRunner& incoming,
                                      Time now);

}  // namespace hiber::scheduler
