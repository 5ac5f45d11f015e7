#include "scheduler/topology.h"

#include <algorithm>

namespace hiber::scheduler {

Result<Topology> Topology::from_config(const NodeConfig& config) {
  const int n = config.gpu_count();
  if (n <= 0) return error(ErrorCode::kInvalidValue, "topology: the node has no GPUs");
  if (n > kMaxGpus)
    return error(ErrorCode::kInvalidValue, "topology: ", n, " GPUs; the scheduler handles at most ",
                 kMaxGpus);
  const int switches = static_cast<int>(config.pcie_switches.size());
  for (int g = 0; g < n; ++g) {
    const GpuSpec& gpu = config.gpus[g];
    if (gpu.memory_bytes == 0)
      return error(ErrorCode::kInvalidValue, "topology: GPU ", g, " has no memory");
    if (gpu.pcie_switch < 0 || gpu.pcie_switch >= switches)
      return error(ErrorCode::kInvalidValue, "topology: GPU ", g, " is on PCIe switch ",
                   gpu.pcie_switch, " of ", switches);
  }
  for (const NvLinkSpec& link : config.nvlinks) {
    if (link.gpu_a < 0 || link.gpu_a >= n || link.gpu_b < 0 || link.gpu_b >= n ||
        link.gpu_a == link.gpu_b)
      return error(ErrorCode::kInvalidValue, "topology: NVLink ", link.gpu_a, "-", link.gpu_b,
                   " does not join two GPUs of the node");
  }
  for (const NvSwitchSpec& fabric : config.nvswitches) {
    for (int g : fabric.gpus) {
      if (g < 0 || g >= n)
        return error(ErrorCode::kInvalidValue, "topology: NVSwitch lists GPU ", g, " of ", n);
    }
  }

  Topology t;
  t.config_ = config;
  t.gpu_count_ = n;
  t.all_ = n == kMaxGpus ? ~GpuMask{0} : gpu_bit(n) - 1;
  t.memory_bytes_.resize(n);
  t.host_gbps_.resize(n);
  t.neighbours_.assign(n, 0);
  t.peer_gbps_.assign(static_cast<size_t>(n) * n, 0.0);
  t.rank_.assign(static_cast<size_t>(n) * n, -1);
  t.peers_by_speed_.resize(n);

  std::vector<double> speeds;  // distinct link speeds, for the ranks
  for (int a = 0; a < n; ++a) {
    t.memory_bytes_[a] = config.gpus[a].memory_bytes;
    t.host_gbps_[a] = config.pcie_switches[config.gpus[a].pcie_switch].host_to_device_gbps;
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      if (config.share_pcie_switch(a, b)) t.neighbours_[a] |= gpu_bit(b);
      const double gbps = config.peer_bandwidth_gbps(a, b);
      t.peer_gbps_[a * n + b] = gbps;
      if (gbps > 0) speeds.push_back(gbps);
    }
  }
  std::sort(speeds.begin(), speeds.end(), std::greater<>());
  speeds.erase(std::unique(speeds.begin(), speeds.end()), speeds.end());
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      const double gbps = t.peer_gbps_[a * n + b];
      if (gbps <= 0) continue;
      t.rank_[a * n + b] =
          static_cast<int>(std::find(speeds.begin(), speeds.end(), gbps) - speeds.begin());
      t.peers_by_speed_[a].push_back(b);
    }
    std::stable_sort(t.peers_by_speed_[a].begin(), t.peers_by_speed_[a].end(), [&](int x, int y) {
      return t.peer_gbps_[a * n + x] > t.peer_gbps_[a * n + y];
    });
  }
  return t;
}

}  // namespace hiber::scheduler
