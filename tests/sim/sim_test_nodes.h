// Small nodes for hand-worked scenarios, cut from the Torpor node's config so they keep its
// link speeds: PCIe switches of 12 GB/s shared by GPU pairs, NVLink of 25 and 50 GB/s.
#pragma once

#include <cstdint>

#include "common/node_config.h"

namespace hiber::sim {

// The first `gpus` GPUs of the Torpor node (GPUs 0 and 1 share a switch, as do 2 and 3), with
// the links among them, each GPU with `memory` bytes.
inline NodeConfig torpor_gpus(int gpus, uint64_t memory) {
  NodeConfig c = default_node_config();
  c.gpus.resize(gpus);
  for (GpuSpec& g : c.gpus) g.memory_bytes = memory;
  std::vector<NvLinkSpec> links;
  for (const NvLinkSpec& l : c.nvlinks) {
    if (l.gpu_a < gpus && l.gpu_b < gpus) links.push_back(l);
  }
  c.nvlinks = links;
  return c;
}

}  // namespace hiber::sim
