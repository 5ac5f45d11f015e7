// Small nodes for hand-worked scenarios, cut from the Torpor node's config so they keep its
// link speeds: PCIe switches of 12 GB/s shared by GPU pairs, NVLink of 25 and 50 GB/s; and the
// pieces every scenario shares: its functions, and delivering an arrival.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "sim/event_queue.h"
#include "sim/node.h"
#include "sim/workload.h"

namespace hiber::sim {

// The first `gpus` GPUs of the Torpor node (GPUs 0 and 1 share a switch, as do 2 and 3), with
// the links among them, each GPU with `memory` bytes.
inline NodeConfig torpor_gpus(int gpus, uint64_t memory) {
  NodeConfig c = paper_node_config();
  c.gpus.resize(gpus);
  for (GpuSpec& g : c.gpus) g.memory_bytes = memory;
  std::vector<NvLinkSpec> links;
  for (const NvLinkSpec& l : c.nvlinks) {
    if (l.gpu_a < gpus && l.gpu_b < gpus) links.push_back(l);
  }
  c.nvlinks = links;
  return c;
}

// A workload of 1000 s with one function per named model (10 requests a minute, the paper's
// deadline for its class at p98), named after the model and its index; no arrivals.
inline Workload hand_workload(const std::vector<std::string>& models) {
  Workload workload;
  workload.duration = 1000 * kSecond;
  const Deadlines deadlines;
  for (size_t i = 0; i < models.size(); ++i) {
    const int m = *find_model(models[i]);
    workload.functions.push_back({models[i] + std::to_string(i), m, 10,
                                  deadlines.for_model(paper_models()[m]), deadlines.percentile});
  }
  return workload;
}

// Delivers an arrival of function `f` at t to `node`, running every event before it.
inline void deliver_arrival(EventQueue& queue, Node& node, uint32_t f, Time t) {
  while (!queue.empty() && queue.next_time() <= t) queue.run_next();
  queue.advance_to(t);
  node.arrive(f, t);
}

}  // namespace hiber::sim
