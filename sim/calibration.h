// The timing model against the paper's own measurements (docs/sim.md shows the tables):
//   - Table 4: each model's latency when its request swaps the model in over PCIe, or over
//     NVLink from another GPU, alone on the node;
//   - Table 3: a model's swap-in latency while a neighbour behind the same PCIe switch swaps
//     another model in, back to back, the whole time.
// Both use the simulator's own parts (LinkModel, PipelinedRun, the setup time), so what they
// print is what the node simulation does.
#pragma once

#include <vector>

#include "common/node_config.h"
#include "sim/links.h"
#include "sim/models.h"
#include "sim/pipeline.h"

namespace hiber::sim {

struct SwapLatency {
  Duration pcie = 0;    // host -> GPU over one PCIe switch, alone
  Duration nvlink = 0;  // GPU -> GPU over the node's fastest NVLink, alone
};

// Table 4's two swap columns for `model` on `config` (the fastest link of the node for NVLink).
SwapLatency swap_latency(const NodeConfig& config, const Model& model,
                         const PipelineOptions& pipeline, const LinkOptions& links);

// Table 3: the mean latency of `row`'s pipelined swap-in on GPU 0 while `column` is swapped
// into GPU 1 (same PCIe switch) back to back, each run starting as soon as the previous ended;
// `row` repeats `runs` times, the same way. A null `column` measures the row alone (Table 3's
// diagonal).
Duration contended_latency(const NodeConfig& config, const Model& row, const Model* column,
                           const PipelineOptions& pipeline, const LinkOptions& links, int runs);

}  // namespace hiber::sim
