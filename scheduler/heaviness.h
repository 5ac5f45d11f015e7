// Heavy or light: does swapping a model over PCIe slow its inference? (Torpor §5.3, Table 4.)
//
// Torpor labels models heavy by their bandwidth needs and uses the label twice: Algorithm 1
// avoids loading a model from the host next to a GPU that is loading a heavy one, and eviction
// (§5.4) throws out light models first. The paper measured the labels once, offline. We decide
// them from what the node observes, per function:
//
//   ratio = (mean host->GPU swap time) / (mean execution time with the model resident)
//   heavy  <=>  ratio >= heavy_ratio
//
// Why this ratio: Hiber pipelines a swap with the kernels that need it (docs/design.md, "Swap
// engine"), so a request whose model comes from the host takes about max(exec, swap). A swap
// shorter than the execution hides behind it; one longer than it stretches the request, and
// another load on the same switch (which halves the bandwidth) stretches it further. The
// default 0.75 reproduces the paper's Table 4 on its V100 node (12 GB/s per switch), taking
// fp32 model sizes: the models whose Swap-PCIe latency is 40% or more above their
// GPU-remoting latency, ResNet-50 (+44%; ~98 MB: 8 ms swap / 9 ms exec = 0.9), ResNet-101
// (+57%; ~170 MB: 14/14 = 1.0), ResNet-152 (+47%; ~230 MB: 19/17 = 1.1) and Bert-qa (+235%;
// bert-large, ~1.3 GB: 110/43 = 2.5), come out heavy; those within 21%, Inception-v3 (~95 MB:
// 8/14 = 0.57), DenseNet-169 (~57 MB: 5/25 = 0.2), DenseNet-201 (~80 MB: 7/28 = 0.24) and
// EfficientNet (~21 MB: 2/12 = 0.15), light. It is below 1 because contention doubles the
// swap time: a model at 0.75 alone is at 1.5 next to a loading neighbour, which is exactly the
// slowdown Algorithm 1 tries to avoid.
//
// Measurements accumulate as exponentially weighted means (recent behaviour counts more; a
// model whose inputs grow can turn heavy), and the label is recomputed after every sample.
// Until both means have min_samples samples, a registered hint decides; without a hint, the
// ratio of the registered time hints; without those, `unknown_is_heavy`.
#pragma once

#include <cstdint>
#include <optional>

#include "scheduler/types.h"

namespace hiber::scheduler {

struct HeavinessOptions {
  // Heavy when swap / exec >= heavy_ratio. See the derivation above.
  double heavy_ratio = 0.75;
  // Samples of each kind (host swaps, resident executions) before measurements overrule hints.
  uint32_t min_samples = 3;
  // Weight of a new sample in the moving means: 0.2 follows a change within ~10 samples while
  // a single outlier (a swap that met a burst of host traffic) moves the mean by only 20%.
  double ewma_alpha = 0.2;
  // The label of a function with no measurements and no hints. Light by default: a model the
  // node knows nothing about is evicted first, the cheap mistake (a swap it did not need)
  // rather than the expensive one (pinning memory for it).
  bool unknown_is_heavy = false;
};

// A mean that weights recent samples more; the first sample is taken as is.
struct MovingMean {
  double value = 0;
  uint64_t samples = 0;
  void add(double x, double alpha) {
    value = samples == 0 ? x : value + alpha * (x - value);
    ++samples;
  }
};

// What the classifier reads about one function.
struct HeavinessInputs {
  const MovingMean* host_swap = nullptr;  // measured host->GPU swap durations (ns)
  const MovingMean* exec = nullptr;       // measured resident execution durations (ns)
  std::optional<bool> heavy_hint;         // registered label
  Duration swap_time_hint = 0;            // registered or estimated swap time (0 = unknown)
  Duration exec_time_hint = 0;            // registered execution time (0 = unknown)
};

class HeavinessClassifier {
 public:
  explicit HeavinessClassifier(const HeavinessOptions& options) : options_(options) {}

  bool heavy(const HeavinessInputs& in) const;

  // swap / exec for a swap and execution time; +inf when exec is 0 and swap is not.
  static double ratio(double swap, double exec);

  const HeavinessOptions& options() const { return options_; }

 private:
  HeavinessOptions options_;
};

}  // namespace hiber::scheduler
