#include "server/device/cuda_topology.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>

namespace hiber::device::cuda_topology {
namespace {

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Parses up to `max_digits` hex digits from text[pos..] (at least one), advancing pos.
std::optional<unsigned> hex_field(std::string_view text, size_t& pos, size_t max_digits) {
  size_t start = pos;
  unsigned value = 0;
  while (pos < text.size() && is_hex(text[pos]) && pos - start < max_digits) {
    char c = text[pos];
    unsigned digit = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
    value = value * 16 + digit;
    ++pos;
  }
  if (pos == start) return std::nullopt;
  return value;
}

std::string last_component(std::string_view path) {
  size_t slash = path.find_last_of('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string parent_path(std::string_view path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string_view::npos ? std::string() : std::string(path.substr(0, slash));
}

bool is_pci_device_name(std::string_view name) { return normalize_pci_bus_id(name).ok(); }

// The first line of a small sysfs file, or nullopt.
std::optional<std::string> read_line(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

std::optional<double> read_speed(const std::string& device, const char* file) {
  auto text = read_line(device + "/" + file);
  if (!text) return std::nullopt;
  Result<double> gts = parse_link_speed_gts(*text);
  if (!gts.ok()) return std::nullopt;
  return *gts;
}

std::optional<int> read_width(const std::string& device) {
  auto text = read_line(device + "/current_link_width");
  if (!text) return std::nullopt;
  char* end = nullptr;
  long width = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || width <= 0 || width > 64) return std::nullopt;
  return static_cast<int>(width);
}

// The per-direction bandwidth of `device`'s upstream link, or nullopt with `why` set.
std::optional<double> link_gbps(const std::string& device, std::string& why) {
  std::optional<double> current = read_speed(device, "current_link_speed");
  std::optional<int> width = read_width(device);
  if (!current || !width) {
    why = str_cat("no readable current_link_speed/current_link_width under ", device);
    return std::nullopt;
  }
  double gts = *current;
  // GPUs and switches drop their link to a lower speed when idle; the link trains back up to
  // the slower end's maximum under load, and that is the speed copies will see.
  std::optional<double> max_here = read_speed(device, "max_link_speed");
  std::optional<double> max_there = read_speed(parent_path(device), "max_link_speed");
  if (max_here && *max_here > gts) {
    gts = max_there ? std::min(*max_here, *max_there) : *max_here;
    if (gts < *current) gts = *current;
  }
  return pcie_link_gbps(gts, *width);
}

}  // namespace

Result<std::string> normalize_pci_bus_id(std::string_view bus_id) {
  // domain:bus:device.function, each hex; the domain may have up to 8 digits.
  size_t pos = 0;
  auto domain = hex_field(bus_id, pos, 8);
  bool ok = domain.has_value() && pos < bus_id.size() && bus_id[pos++] == ':';
  auto bus = ok ? hex_field(bus_id, pos, 2) : std::nullopt;
  ok = ok && bus.has_value() && pos < bus_id.size() && bus_id[pos++] == ':';
  auto dev = ok ? hex_field(bus_id, pos, 2) : std::nullopt;
  ok = ok && dev.has_value() && pos < bus_id.size() && bus_id[pos++] == '.';
  auto fn = ok ? hex_field(bus_id, pos, 1) : std::nullopt;
  ok = ok && fn.has_value() && pos == bus_id.size();
  if (!ok || *domain > 0xffff || *dev > 0x1f || *fn > 7) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("'", bus_id, "' is not a PCI bus id (domain:bus:device.function)"));
  }
  char out[16];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", *domain, *bus, *dev, *fn);
  return std::string(out);
}

Result<double> parse_link_speed_gts(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  double gts = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !(gts > 0) || gts > 1024) {
    return Status(ErrorCode::kNotFound, str_cat("'", text, "' is not a PCIe link speed"));
  }
  std::string_view rest(end);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.substr(0, 4) != "GT/s") {
    return Status(ErrorCode::kNotFound, str_cat("'", text, "' is not a PCIe link speed in GT/s"));
  }
  return gts;
}

double pcie_link_gbps(double gts, int lanes) {
  double efficiency = gts <= 5.0 ? 8.0 / 10.0 : gts < 64.0 ? 128.0 / 130.0 : 242.0 / 256.0;
  return gts * efficiency / 8.0 * lanes;
}

std::string uplink_device_path(std::string_view gpu_path) {
  std::string parent = parent_path(gpu_path);
  std::string grandparent = parent_path(parent);
  if (!parent.empty() && is_pci_device_name(last_component(parent)) && !grandparent.empty() &&
      is_pci_device_name(last_component(grandparent))) {
    return grandparent;
  }
  return std::string(gpu_path);
}

PcieLayout discover_pcie_layout(std::span<const std::string> bus_ids,
                                const std::string& sysfs_root) {
  PcieLayout layout;
  std::map<std::string, int> switch_of_uplink;
  for (size_t gpu = 0; gpu < bus_ids.size(); ++gpu) {
    std::string entry = sysfs_root + "/bus/pci/devices/" + bus_ids[gpu];
    char resolved[PATH_MAX];
    if (realpath(entry.c_str(), resolved) == nullptr) {
      layout.notes.push_back(str_cat("GPU ", gpu, ": cannot resolve ", entry,
                                     "; assuming a PCIe link of its own at ", kDefaultPcieGbps,
                                     " GB/s"));
      layout.switch_of_gpu.push_back(static_cast<int>(layout.switches.size()));
      layout.switches.push_back({kDefaultPcieGbps, kDefaultPcieGbps});
      layout.uplink_paths.emplace_back();
      continue;
    }
    std::string uplink = uplink_device_path(resolved);
    auto [it, inserted] =
        switch_of_uplink.emplace(uplink, static_cast<int>(layout.switches.size()));
    layout.switch_of_gpu.push_back(it->second);
    if (!inserted) continue;

    std::string why;
    std::optional<double> gbps = link_gbps(uplink, why);
    if (!gbps && uplink != resolved) {
      // The switch's port may hide its link (some VMs); the GPU's own link bounds it.
      std::string why_gpu;
      gbps = link_gbps(resolved, why_gpu);
    }
    if (!gbps) {
      layout.notes.push_back(str_cat("GPU ", gpu, ": ", why, "; assuming ", kDefaultPcieGbps,
                                     " GB/s for its PCIe uplink"));
      gbps = kDefaultPcieGbps;
    }
    layout.switches.push_back({*gbps, *gbps});
    layout.uplink_paths.push_back(uplink);
  }
  return layout;
}

double nvlink_total_gbps(int cc_major, int cc_minor) {
  switch (cc_major) {
    case 6: return 4 * 20.0;
    case 7: return cc_minor >= 5 ? 2 * 25.0 : 6 * 25.0;
    case 8: return cc_minor == 0 ? 12 * 25.0 : cc_minor == 6 ? 4 * 14.0625 : 0.0;
    case 9: return 18 * 25.0;
    default: return cc_major >= 10 ? 18 * 50.0 : 0.0;
  }
}

std::optional<double> nvlink_bandwidth_estimate_gbps(int cc_major, int cc_minor,
                                                     int performance_rank, bool native_atomics) {
  double nvlink = nvlink_total_gbps(cc_major, cc_minor);
  if (!native_atomics || nvlink <= 0) return std::nullopt;
  int rank = performance_rank < 0 ? 0 : performance_rank;
  return nvlink / (1.0 + rank);
}

std::string model_key(std::string_view product_name) {
  std::string key;
  bool dash = false;
  for (char c : product_name) {
    bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alnum) {
      if (dash && !key.empty()) key += '-';
      key += static_cast<char>(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
      dash = false;
    } else {
      dash = true;
    }
  }
  return key.empty() ? std::string("gpu") : key;
}

}  // namespace hiber::device::cuda_topology
