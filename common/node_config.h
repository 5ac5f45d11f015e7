// The node's GPUs and how they are connected, read from a JSON config file.
//
// Used by the simulated GPU (which behaves as the config says), by the CUDA backend (which
// reports what it discovers in the same shape) and, later, by the scheduler and hiber-sim.
// Pure data: parsing is separate from reading files, so pure libraries can use the types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace hiber {

struct GpuSpec {
  std::string model;         // key of the model in the config
  std::string product_name;  // "Tesla V100-SXM2-16GB"
  uint64_t memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessors = 0;
  double memory_bandwidth_gbps = 0;  // copies within the GPU; 0 = not throttled
  int clock_rate_khz = 0;
  int memory_clock_rate_khz = 0;
  int memory_bus_width_bits = 0;
  int l2_cache_bytes = 0;
  int pcie_switch = 0;     // index into NodeConfig::pcie_switches
  std::string pci_bus_id;  // "0000:3b:00.0"
};

struct PcieSwitchSpec {
  double host_to_device_gbps = 0;
  double device_to_host_gbps = 0;
};

struct NvLinkSpec {
  int gpu_a = 0;
  int gpu_b = 0;
  double bandwidth_gbps = 0;  // per direction
};

struct NvSwitchSpec {
  std::vector<int> gpus;
  double port_bandwidth_gbps = 0;  // per GPU port, per direction
};

struct NodeConfig {
  std::string name;
  std::string description;
  std::vector<GpuSpec> gpus;
  std::vector<PcieSwitchSpec> pcie_switches;
  std::vector<NvLinkSpec> nvlinks;
  std::vector<NvSwitchSpec> nvswitches;

  int gpu_count() const { return static_cast<int>(gpus.size()); }

  // True when GPUs a and b sit behind the same PCIe switch (and so share its host bandwidth).
  bool share_pcie_switch(int a, int b) const;

  // The point-to-point NVLink between a and b, or nullptr.
  const NvLinkSpec* nvlink(int a, int b) const;

  // The NVSwitch fabric both a and b hang off, or nullptr.
  const NvSwitchSpec* nvswitch(int a, int b) const;

  // Bandwidth of the fastest direct GPU-to-GPU path from a to b in GB/s (a point-to-point
  // NVLink, or an NVSwitch both GPUs are on); 0 when the only path goes through the host.
  double peer_bandwidth_gbps(int a, int b) const;
};

// Parses and validates a node config in JSON. Every error names the offending field.
Result<NodeConfig> parse_node_config(std::string_view json);

// Reads and parses a file; errors start with the path.
Result<NodeConfig> load_node_config(const std::string& path);

// The node Hiber runs on when no config is given: 8 H100s on one NVSwitch
// (configs/nodes/nvswitch-8gpu.json, embedded at build time). An H100 (9.0) because CUDA 13,
// cuBLAS 13 and cuDNN 9 no longer support the paper's V100s (7.0).
std::string_view default_node_config_json();
const NodeConfig& default_node_config();

// The Torpor paper's 4x V100 node (configs/nodes/torpor-4gpu.json, embedded), which hiber-sim's
// paper experiments and scripts/evaluate.sh name explicitly.
inline constexpr std::string_view kPaperNodeName = "torpor-4gpu";
std::string_view paper_node_config_json();
const NodeConfig& paper_node_config();

// An embedded config by its name ("nvswitch-8gpu", "torpor-4gpu"), or std::nullopt.
std::optional<NodeConfig> embedded_node_config(std::string_view name);

// `name_or_path`: an embedded config's name, else a JSON file to load.
Result<NodeConfig> node_config_by_name_or_path(const std::string& name_or_path);

// A multi-line human-readable summary (GPUs, switches, links).
std::string describe(const NodeConfig& config);

}  // namespace hiber
