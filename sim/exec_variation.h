// Per-request variation of execution times (`--exec_cv_vision`, `--exec_cv_language`).
//
// A request computes for its model's execution time (Table 4) times a log-normal factor of mean
// 1 and a coefficient of variation per model class. The papers give no spread: Torpor says
// that "model execution latency is often stable" and reports means only. The evaluation's
// seeds table assumes 5% for the CNNs (fixed 224 x 224 inputs: clocks, launch and
// synchronisation jitter) and 10% for Bert-qa (more, shorter kernels, and a host-side tokenizer
// in the request path); the paper's figures keep fixed times (both 0, the default).
//
// The factor of a request is a pure function of (seed, function, the request's number within
// its function), so every policy and system sees the same draws for the same request.
#pragma once

#include <cstdint>

#include "sim/models.h"

namespace hiber::sim {

struct ExecVariation {
  double vision_cv = 0;
  double language_cv = 0;
  uint64_t seed = 1;

  // `exec` scaled for the n-th request (0-based) of function `function`, at least 1 ns when
  // `exec` > 0. Unchanged when the class's CV is 0.
  Duration scale(Duration exec, ModelClass model_class, uint32_t function, uint64_t n) const;
};

}  // namespace hiber::sim
