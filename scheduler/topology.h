// The scheduler's model of the node: which GPUs there are, how much memory each has, which
// GPUs share a PCIe switch (and so contend for host bandwidth), and how fast each GPU pair can
// copy directly (NVLink or NVSwitch).
//
// Built from the same hiber::NodeConfig the simulated GPU behaves by
// (configs/nodes/torpor-4gpu.json is the Torpor paper's Fig. 5 node, nvswitch-8gpu.json a
// DGX-H100-class node). On a real GPU node, server/device/cuda_topology.{h,cc} discovers a
// NodeConfig from the driver: PCI bus ids and sysfs give the PCIe switches, and
// cuDeviceGetP2PAttribute (access supported, native atomics, performance rank) gives the links
// and their estimated bandwidths. The topology here only reads the config; it never touches a
// device, so hiberd and hiber-sim build it the same way.
//
// Everything is precomputed into small arrays at construction: Algorithm 1 asks "which of these
// GPUs share a switch with g" and "how fast is the link g-m" once per decision, and those must
// be a load and a mask, not a walk over the config's link list.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/node_config.h"
#include "common/status.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

class Topology {
 public:
  // Validates what the scheduler relies on: 1 to kMaxGpus GPUs, each with memory, each on a
  // PCIe switch the config lists, links only between GPUs that exist. kInvalidValue otherwise.
  static Result<Topology> from_config(const NodeConfig& config);

  int gpu_count() const { return gpu_count_; }
  GpuMask all_gpus() const { return all_; }

  // Bytes of device memory of GPU g as the config states it (what the driver reports).
  uint64_t memory_bytes(int g) const { return memory_bytes_[g]; }

  // Host-to-device bandwidth of g's PCIe switch (GB/s), shared by every GPU behind it.
  double host_to_device_gbps(int g) const { return host_gbps_[g]; }

  // The GPUs other than g behind g's PCIe switch: g's "neighbours" in Algorithm 1. A host load
  // onto any of them contends with a host load onto g.
  GpuMask pcie_neighbours(int g) const { return neighbours_[g]; }

  // Fastest direct GPU-to-GPU path a<->b in GB/s (point-to-point NVLink or a shared NVSwitch);
  // 0 when a peer copy would have to cross PCIe (or a == b).
  double peer_gbps(int a, int b) const { return peer_gbps_[a * gpu_count_ + b]; }

  // The pair's performance rank in the sense of CUDA's CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
  // 0 for the fastest kind of link in this node, 1 for the next slower, ...; -1 without a
  // direct link. Derived from peer_gbps (the config carries bandwidths; cuda_topology turns the
  // driver's ranks into bandwidths, so ordering them gives the ranks back).
  int performance_rank(int a, int b) const { return rank_[a * gpu_count_ + b]; }

  // GPUs in descending order of link speed from g (fastest first, ties by lower index); GPUs
  // without a direct link are left out.
  const std::vector<int>& peers_by_speed(int g) const { return peers_by_speed_[g]; }

  const NodeConfig& config() const { return config_; }

 private:
  Topology() = default;

  NodeConfig config_;
  int gpu_count_ = 0;
  GpuMask all_ = 0;
  std::vector<uint64_t> memory_bytes_;
  std::vector<double> host_gbps_;
  std::vector<GpuMask> neighbours_;
  std::vector<double> peer_gbps_;  // gpu_count x gpu_count, row-major
  std::vector<int> rank_;          // gpu_count x gpu_count, row-major
  std::vector<std::vector<int>> peers_by_speed_;
};

}  // namespace hiber::scheduler
