// What the simulated GPUs report about themselves: the config's model, and the attributes a real
// GPU of that compute capability reports (the values CUDA and PyTorch read).
#pragma once

#include "common/node_config.h"
#include "server/device/device.h"

namespace hiber::device::sim {

// Properties of GPU `ordinal` of the node. The UUID is derived from the node's name and the
// ordinal, so it is stable across runs and distinct across GPUs and nodes.
DeviceProperties make_properties(const NodeConfig& node, int ordinal);

}  // namespace hiber::device::sim
