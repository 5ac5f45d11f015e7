// How the CUDA backend turns what it can see of the node (sysfs, the driver's peer attributes)
// into a NodeConfig. Pure functions with no CUDA, so they are unit-tested on machines without a
// GPU (tests/gpu/cuda_device_nodriver_test.cc) against a fake sysfs tree.
//
// Every bandwidth here is an estimate from link properties, not a measurement; a later issue
// replaces them with measured figures. The estimates are theoretical peaks per direction.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/node_config.h"
#include "common/status.h"

namespace hiber::device::cuda_topology {

// Used for a PCIe link whose speed sysfs does not tell (no sysfs, a VM that hides it): PCIe 4.0
// x16, 16 GT/s x 16 lanes x 128/130 encoding / 8 bits, about 31.5 GB/s per direction, the most
// common link of the data-center GPUs we run on (A100 PCIe/SXM hosts). Measured copies reach
// about 80-90% of it.
inline constexpr double kDefaultPcieGbps = 16.0 * 16 * 128.0 / 130.0 / 8.0;

// "0000:3b:00.0" from any spelling the driver or a config uses ("00000000:3B:00.0",
// "0000:3B:00.0"): lower-case hex, 4-digit domain, 2-digit bus and device. kInvalidValue if it
// is not a PCI bus id.
Result<std::string> normalize_pci_bus_id(std::string_view bus_id);

// GT/s from a sysfs link speed ("16.0 GT/s PCIe", "8 GT/s", "2.5 GT/s"). kNotFound for
// "Unknown" or anything else that is not a speed.
Result<double> parse_link_speed_gts(std::string_view text);

// Bytes per second per direction (in GB/s) of a PCIe link of `gts` GT/s per lane and `lanes`
// lanes, after line encoding: 8b/10b up to 5 GT/s (PCIe 1-2), 128b/130b for 8-32 GT/s
// (PCIe 3-5), 242B/256B FLIT for 64 GT/s and faster (PCIe 6+).
double pcie_link_gbps(double gts, int lanes);

// The PCIe device whose link carries a GPU's traffic to the host, given the GPU's resolved
// sysfs path (realpath of /sys/bus/pci/devices/<bus id>, e.g.
// /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:3b:00.0).
// A GPU behind a PCIe switch hangs off a downstream port of the switch (its parent,
// 0000:02:08.0), and the downstream ports hang off the switch's upstream port (its grandparent,
// 0000:01:00.0), whose link to the root port is what the GPUs behind the switch share. So:
//   - the grandparent if it is a PCI device (the switch's upstream port);
//   - otherwise the GPU itself: its parent is a root port or the host bridge (pci0000:00), so
//     the GPU has a link of its own to the CPU and shares it with nobody.
// This reads one level of switching; cascaded switches group at the lowest switch.
std::string uplink_device_path(std::string_view gpu_path);

// GPUs grouped by shared PCIe uplink, with each group's estimated host bandwidth.
struct PcieLayout {
  std::vector<int> switch_of_gpu;         // per GPU, an index into `switches`
  std::vector<PcieSwitchSpec> switches;   // in order of first GPU
  std::vector<std::string> uplink_paths;  // per switch, the device grouped on ("" if unknown)
  std::vector<std::string> notes;         // one line per fallback taken, for the log
};

// Discovers the PCIe layout of `bus_ids` (normalized) under `sysfs_root` ("/sys" on a real
// machine; tests pass a fake tree). A GPU whose sysfs entry cannot be resolved gets a switch of
// its own with kDefaultPcieGbps, and a note says so. The bandwidth of a group is that of its
// uplink device's link (current_link_speed x current_link_width); when the current speed is
// below max_link_speed the link is taken to be idling in a power-saving state and the lower of
// the two ends' max_link_speed is used instead, since the link trains up under load.
PcieLayout discover_pcie_layout(std::span<const std::string> bus_ids,
                                const std::string& sysfs_root = "/sys");

// Whether two GPUs with peer access are joined by NVLink, judged from what
// cuDeviceGetP2PAttribute says about the pair (the driver names no link type), and if so the
// link's estimated per-direction bandwidth:
//   - native atomics supported: an NVLink-class link (PCIe peer access has no native atomics),
//     provided the older GPU of the pair has NVLink at all (nvlink_total_gbps > 0). Estimate =
//     that GPU's total NVLink bandwidth per direction divided by (1 + performance rank): rank 0
//     is the best link the driver knows of (an NVSwitch port or the most bonded link), and each
//     rank step below it is taken to cost one more share. An upper bound on point-to-point
//     meshes, whose links are split among peers.
//   - otherwise nullopt: the pair's peer traffic crosses PCIe, which is no NVLink of the
//     topology (the PCIe switches already model it).
std::optional<double> nvlink_bandwidth_estimate_gbps(int cc_major, int cc_minor,
                                                     int performance_rank, bool native_atomics);

// Total NVLink bandwidth per direction of one GPU by compute capability, from NVIDIA's specs:
// sm_60 (P100) 4 x 20 GB/s; sm_70 (V100) 6 x 25; sm_75 (Turing bridge) 2 x 25; sm_80 (A100)
// 12 x 25; sm_86 (A40/GA102 bridge) 4 x 14; sm_90 (H100/H200) 18 x 25; sm_100 and newer
// (Blackwell) 18 x 50. 0 for GPUs without NVLink or unknown ones.
double nvlink_total_gbps(int cc_major, int cc_minor);

// A config key for a GPU model from its product name: "NVIDIA H100 80GB HBM3" ->
// "nvidia-h100-80gb-hbm3".
std::string model_key(std::string_view product_name);

}  // namespace hiber::device::cuda_topology
