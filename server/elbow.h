// The "elbow" of host-to-GPU transfers (Torpor §4.3): the smallest transfer size beyond which
// bigger transfers hardly raise the throughput. Swaps move models in groups of this size: big
// enough to run the link near its peak, small enough that a kernel waits only for the first few
// groups (pipelined execution). It depends on the node (PCIe generation, driver, IOMMU), not on
// the model, so hiberd measures it once on its own node and remembers it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/device/device.h"
#include "server/model_repository.h"

namespace hiber::server {

struct ElbowSample {
  uint64_t bytes = 0;  // one transfer
  double gbps = 0;     // throughput of back-to-back transfers of this size
};

// The elbow of `samples` (ascending sizes): the smallest size reaching `fraction` of the best
// throughput seen.
uint64_t elbow_of(const std::vector<ElbowSample>& samples, double fraction = 0.9);

// Times pinned host-to-GPU copies of 64 KiB to 64 MiB on GPU 0, each size as back-to-back
// transfers with an event after each (as a swap's groups are), and returns the elbow. Uses
// device memory of its own: call it before the pools reserve the GPU.
Result<std::vector<ElbowSample>> measure_transfers(device::Device& device,
                                                   ModelRepository& repository);

// The elbow from `cache_path` if it holds one for this node, else measured (and written there).
// An empty path measures every time.
Result<uint64_t> find_elbow(device::Device& device, ModelRepository& repository,
                            const std::string& cache_path);

}  // namespace hiber::server
