// Pipelined execution (Torpor §4.3): a request whose model is being swapped in starts computing
// as soon as the first group of its model has arrived, and each later part of the computation
// waits only for the bytes it needs.
//
// Model. The model's S bytes arrive in order over a link whose rate may change while they are
// in flight (another transfer starts or ends on the same PCIe switch); the computation takes
// `exec` at full speed and uses the bytes in the same order, uniformly: computing the part
// [x, x + dx) of the model takes exec * dx / S. Transfers go in groups of g bytes (the "elbow"
// group size; 2 MB on the paper's testbed), so the computation may use bytes [0, b - g) once b
// have arrived, and everything once the transfer is complete. Then the computation ends at
//
//     finish = max over t of  t + exec * (1 - usable(b(t)) / S)
//
// where usable(b) = max(0, b - g) while b < S, and S at the end, so the last term is
// t_end + exec * g / S. The arrival curve b(t) is piecewise linear (the rate only changes at
// events), and the expression is linear along each piece once b >= g, so the maximum lies at a
// breakpoint or where b crosses g: PipelinedRun keeps the running maximum over those points.
// For a constant rate r (bytes per ns) this gives the closed form
//
//     finish - start = max(g / r + exec, S / r + exec * g / S)      (S >= g)
//
// i.e. a swap hides behind a longer computation, and a computation hides behind a longer swap.
// A fixed `setup` (block allocation and mapping, staging, the first launch; fitted to Table 4)
// comes before the transfer starts.
#pragma once

#include <cstdint>

#include "scheduler/types.h"

namespace hiber::sim {

using scheduler::Duration;
using scheduler::Time;

struct PipelineOptions {
  // The elbow group size (Torpor: "about 2 MB in our testbed").
  uint64_t group_bytes = 2 * scheduler::kMiB;
  // Fixed cost of a swap before its first byte moves; fitted with LinkOptions::
  // transfer_efficiency to Table 4's Swap-PCIe and Swap-NVLink columns (docs/sim.md).
  Duration setup = 1'600 * scheduler::kMicrosecond;
};

class PipelinedRun {
 public:
  PipelinedRun() = default;
  // The transfer of `bytes` starts at `start`; the model computes for `exec`.
  PipelinedRun(Time start, uint64_t bytes, Duration exec, uint64_t group_bytes);

  // The transfer has moved `bytes_arrived` by time t (non-decreasing in both).
  void observe(Time t, double bytes_arrived);
  // The transfer completed at t: the computation's end.
  Time finish(Time transfer_end);

  // The closed form above, for a constant rate in bytes per nanosecond (GB/s).
  static Duration constant_rate(uint64_t bytes, Duration exec, uint64_t group_bytes,
                                double bytes_per_ns);

 private:
  double exec_at(double usable_bytes) const;

  double bytes_ = 0;
  double exec_ = 0;
  double group_ = 0;
  double last_t_ = 0;
  double last_b_ = 0;
  double bound_ = 0;
};

}  // namespace hiber::sim
