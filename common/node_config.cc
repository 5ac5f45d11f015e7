#include "common/node_config.h"

#include <capnp/compat/json.h>
#include <capnp/message.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/node_config_capnp.h"

namespace hiber {
namespace {

// Longest config we accept; real ones are a few KiB.
constexpr size_t kMaxConfigBytes = 1 << 20;

Status invalid(const std::string& what) {
  return Status(ErrorCode::kInvalidValue, "node config: " + what);
}

bool positive(double v) { return v > 0 && v < 1e9; }

// Text becomes std::string through cStr(), which stops at a NUL byte, so a NUL inside would make
// the config checked differ from the config kept (fuzz_handshake: a productName "\0..." passed
// the "missing" check and was kept empty).
Status check_text(capnp::Text::Reader text, const std::string& where) {
  if (std::memchr(text.begin(), '\0', text.size()) != nullptr)
    return invalid(where + " has a NUL byte");
  return Status();
}

}  // namespace

Result<NodeConfig> node_config_from_capnp(config::NodeConfig::Reader in) {
  NodeConfig out;
  HIBER_RETURN_IF_ERROR(check_text(in.getName(), "'name'"));
  HIBER_RETURN_IF_ERROR(check_text(in.getDescription(), "'description'"));
  out.name = in.getName();
  out.description = in.getDescription();
  if (out.name.empty()) return invalid("'name' is missing");

  std::map<std::string, config::GpuModel::Reader> models;
  for (auto m : in.getGpuModels()) {
    HIBER_RETURN_IF_ERROR(check_text(m.getName(), "a gpuModels entry's 'name'"));
    std::string name = m.getName();
    std::string where = "gpuModels['" + name + "']";
    HIBER_RETURN_IF_ERROR(check_text(m.getProductName(), where + ".productName"));
    if (name.empty()) return invalid("a gpuModels entry has no 'name'");
    if (!models.emplace(name, m).second) return invalid(where + " is defined twice");
    if (m.getMemoryBytes() == 0) return invalid(where + ".memoryBytes must be > 0");
    if (m.getComputeCapabilityMajor() == 0 || m.getComputeCapabilityMajor() > 20)
      return invalid(where + ".computeCapabilityMajor must be in 1..20");
    if (m.getMultiprocessors() == 0 || m.getMultiprocessors() > 4096)
      return invalid(where + ".multiprocessors must be in 1..4096");
    if (m.getMemoryBandwidthGBps() < 0 || m.getMemoryBandwidthGBps() >= 1e9)
      return invalid(where + ".memoryBandwidthGBps must be >= 0 (0 = not throttled)");
    if (m.getProductName().size() == 0) return invalid(where + ".productName is missing");
    if (m.getProductName().size() > 255) return invalid(where + ".productName is longer than 255");
  }

  const auto switches = in.getPcieSwitches();
  for (uint32_t i = 0; i < switches.size(); ++i) {
    PcieSwitchSpec s{switches[i].getHostToDeviceGBps(), switches[i].getDeviceToHostGBps()};
    if (!positive(s.host_to_device_gbps) || !positive(s.device_to_host_gbps))
      return invalid(str_cat("pcieSwitches[", i, "] bandwidths must be > 0 GB/s"));
    out.pcie_switches.push_back(s);
  }

  const auto gpus = in.getGpus();
  if (gpus.size() == 0) return invalid("'gpus' is empty: a node needs at least one GPU");
  if (gpus.size() > 64) return invalid("more than 64 GPUs");
  std::set<std::string> bus_ids;
  for (uint32_t i = 0; i < gpus.size(); ++i) {
    auto g = gpus[i];
    HIBER_RETURN_IF_ERROR(check_text(g.getModel(), str_cat("gpus[", i, "].model")));
    HIBER_RETURN_IF_ERROR(check_text(g.getPciBusId(), str_cat("gpus[", i, "].pciBusId")));
    auto it = models.find(g.getModel());
    if (it == models.end())
      return invalid(
          str_cat("gpus[", i, "].model '", g.getModel().cStr(), "' is not in gpuModels"));
    if (g.getPcieSwitch() >= out.pcie_switches.size())
      return invalid(str_cat("gpus[", i, "].pcieSwitch ", g.getPcieSwitch(), " does not exist (",
                             out.pcie_switches.size(), " switches)"));
    auto m = it->second;
    GpuSpec spec;
    spec.model = m.getName();
    spec.product_name = m.getProductName();
    spec.memory_bytes = m.getMemoryBytes();
    spec.compute_capability_major = static_cast<int>(m.getComputeCapabilityMajor());
    spec.compute_capability_minor = static_cast<int>(m.getComputeCapabilityMinor());
    spec.multiprocessors = static_cast<int>(m.getMultiprocessors());
    spec.memory_bandwidth_gbps = m.getMemoryBandwidthGBps();
    spec.clock_rate_khz = static_cast<int>(m.getClockRateKhz());
    spec.memory_clock_rate_khz = static_cast<int>(m.getMemoryClockRateKhz());
    spec.memory_bus_width_bits = static_cast<int>(m.getMemoryBusWidthBits());
    spec.l2_cache_bytes = static_cast<int>(m.getL2CacheBytes());
    spec.pcie_switch = static_cast<int>(g.getPcieSwitch());
    spec.pci_bus_id = g.getPciBusId();
    if (spec.pci_bus_id.empty()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0000:%02x:00.0", 0x10 + i);
      spec.pci_bus_id = buf;
    }
    if (!bus_ids.insert(spec.pci_bus_id).second)
      return invalid(str_cat("gpus[", i, "].pciBusId ", spec.pci_bus_id, " is used twice"));
    out.gpus.push_back(std::move(spec));
  }

  const int n = out.gpu_count();
  auto valid_gpu = [n](uint32_t g) { return g < static_cast<uint32_t>(n); };
  std::set<std::pair<int, int>> pairs;
  const auto links = in.getNvlinks();
  for (uint32_t i = 0; i < links.size(); ++i) {
    auto l = links[i];
    std::string where = str_cat("nvlinks[", i, "]");
    if (!valid_gpu(l.getGpuA()) || !valid_gpu(l.getGpuB()))
      return invalid(where + " names a GPU that does not exist");
    if (l.getGpuA() == l.getGpuB()) return invalid(where + " links a GPU to itself");
    if (!positive(l.getBandwidthGBps())) return invalid(where + ".bandwidthGBps must be > 0");
    int a = static_cast<int>(std::min(l.getGpuA(), l.getGpuB()));
    int b = static_cast<int>(std::max(l.getGpuA(), l.getGpuB()));
    if (!pairs.insert({a, b}).second)
      return invalid(str_cat(where, " duplicates the link between GPUs ", a, " and ", b));
    out.nvlinks.push_back({a, b, l.getBandwidthGBps()});
  }

  const auto fabrics = in.getNvswitches();
  for (uint32_t i = 0; i < fabrics.size(); ++i) {
    std::string where = str_cat("nvswitches[", i, "]");
    NvSwitchSpec s;
    s.port_bandwidth_gbps = fabrics[i].getPortBandwidthGBps();
    if (!positive(s.port_bandwidth_gbps)) return invalid(where + ".portBandwidthGBps must be > 0");
    std::set<int> seen;
    for (uint32_t g : fabrics[i].getGpus()) {
      if (!valid_gpu(g)) return invalid(where + " names a GPU that does not exist");
      if (!seen.insert(static_cast<int>(g)).second) return invalid(where + " lists a GPU twice");
      s.gpus.push_back(static_cast<int>(g));
    }
    if (s.gpus.size() < 2) return invalid(where + " needs at least two GPUs");
    out.nvswitches.push_back(std::move(s));
  }
  return out;
}

void node_config_to_capnp(const NodeConfig& config, config::NodeConfig::Builder out) {
  out.setName(config.name);
  out.setDescription(config.description);
  std::vector<const GpuSpec*> models;
  for (const GpuSpec& g : config.gpus) {
    bool known = std::any_of(models.begin(), models.end(),
                             [&](const GpuSpec* m) { return m->model == g.model; });
    if (!known) models.push_back(&g);
  }
  auto model_list = out.initGpuModels(static_cast<unsigned>(models.size()));
  for (size_t i = 0; i < models.size(); ++i) {
    const GpuSpec& g = *models[i];
    auto m = model_list[static_cast<unsigned>(i)];
    m.setName(g.model);
    m.setProductName(g.product_name);
    m.setMemoryBytes(g.memory_bytes);
    m.setComputeCapabilityMajor(static_cast<uint32_t>(g.compute_capability_major));
    m.setComputeCapabilityMinor(static_cast<uint32_t>(g.compute_capability_minor));
    m.setMultiprocessors(static_cast<uint32_t>(g.multiprocessors));
    m.setMemoryBandwidthGBps(g.memory_bandwidth_gbps);
    m.setClockRateKhz(static_cast<uint32_t>(g.clock_rate_khz));
    m.setMemoryClockRateKhz(static_cast<uint32_t>(g.memory_clock_rate_khz));
    m.setMemoryBusWidthBits(static_cast<uint32_t>(g.memory_bus_width_bits));
    m.setL2CacheBytes(static_cast<uint32_t>(g.l2_cache_bytes));
  }
  auto gpus = out.initGpus(static_cast<unsigned>(config.gpus.size()));
  for (size_t i = 0; i < config.gpus.size(); ++i) {
    auto g = gpus[static_cast<unsigned>(i)];
    g.setModel(config.gpus[i].model);
    g.setPcieSwitch(static_cast<uint32_t>(config.gpus[i].pcie_switch));
    g.setPciBusId(config.gpus[i].pci_bus_id);
  }
  auto switches = out.initPcieSwitches(static_cast<unsigned>(config.pcie_switches.size()));
  for (size_t i = 0; i < config.pcie_switches.size(); ++i) {
    switches[static_cast<unsigned>(i)].setHostToDeviceGBps(
        config.pcie_switches[i].host_to_device_gbps);
    switches[static_cast<unsigned>(i)].setDeviceToHostGBps(
        config.pcie_switches[i].device_to_host_gbps);
  }
  auto links = out.initNvlinks(static_cast<unsigned>(config.nvlinks.size()));
  for (size_t i = 0; i < config.nvlinks.size(); ++i) {
    links[static_cast<unsigned>(i)].setGpuA(static_cast<uint32_t>(config.nvlinks[i].gpu_a));
    links[static_cast<unsigned>(i)].setGpuB(static_cast<uint32_t>(config.nvlinks[i].gpu_b));
    links[static_cast<unsigned>(i)].setBandwidthGBps(config.nvlinks[i].bandwidth_gbps);
  }
  auto fabrics = out.initNvswitches(static_cast<unsigned>(config.nvswitches.size()));
  for (size_t i = 0; i < config.nvswitches.size(); ++i) {
    const NvSwitchSpec& s = config.nvswitches[i];
    auto f = fabrics[static_cast<unsigned>(i)];
    f.setPortBandwidthGBps(s.port_bandwidth_gbps);
    auto members = f.initGpus(static_cast<unsigned>(s.gpus.size()));
    for (size_t j = 0; j < s.gpus.size(); ++j) {
      members.set(static_cast<unsigned>(j), static_cast<uint32_t>(s.gpus[j]));
    }
  }
}

bool NodeConfig::share_pcie_switch(int a, int b) const {
  if (a < 0 || b < 0 || a >= gpu_count() || b >= gpu_count()) return false;
  return gpus[a].pcie_switch == gpus[b].pcie_switch;
}

const NvLinkSpec* NodeConfig::nvlink(int a, int b) const {
  for (const auto& l : nvlinks) {
    if ((l.gpu_a == a && l.gpu_b == b) || (l.gpu_a == b && l.gpu_b == a)) return &l;
  }
  return nullptr;
}

const NvSwitchSpec* NodeConfig::nvswitch(int a, int b) const {
  for (const auto& s : nvswitches) {
    bool has_a = std::find(s.gpus.begin(), s.gpus.end(), a) != s.gpus.end();
    bool has_b = std::find(s.gpus.begin(), s.gpus.end(), b) != s.gpus.end();
    if (has_a && has_b) return &s;
  }
  return nullptr;
}

double NodeConfig::peer_bandwidth_gbps(int a, int b) const {
  if (a == b) return 0;
  double best = 0;
  if (const NvLinkSpec* l = nvlink(a, b)) best = l->bandwidth_gbps;
  if (const NvSwitchSpec* s = nvswitch(a, b)) best = std::max(best, s->port_bandwidth_gbps);
  return best;
}

Result<NodeConfig> parse_node_config(std::string_view json) {
  if (json.size() > kMaxConfigBytes)
    return invalid(str_cat("file is ", json.size(), " bytes; the limit is ", kMaxConfigBytes));
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<config::NodeConfig>();
  capnp::JsonCodec codec;
  // kj reports JSON and type errors as exceptions; turn them into a Status for the caller.
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions(
      [&]() { codec.decode(kj::ArrayPtr<const char>(json.data(), json.size()), root); });
  KJ_IF_MAYBE (e, failure) {
    return invalid(str_cat("not valid JSON for the NodeConfig schema (common/node_config.capnp): ",
                           e->getDescription().cStr()));
  }
  return node_config_from_capnp(root.asReader());
}

Result<NodeConfig> load_node_config(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status(ErrorCode::kFileNotFound, "node config: cannot open " + path);
  std::ostringstream text;
  text << file.rdbuf();
  Result<NodeConfig> config = parse_node_config(text.str());
  if (!config.ok()) return config.status().with_context(path);
  return config;
}

namespace {

NodeConfig parse_embedded(std::string_view json) {
  Result<NodeConfig> parsed = parse_node_config(json);
  if (!parsed.ok()) {
    std::fprintf(stderr, "an embedded node config is invalid: %s\n",
                 parsed.status().to_string().c_str());
    std::abort();
  }
  return std::move(parsed).value();
}

}  // namespace

const NodeConfig& default_node_config() {
  static const NodeConfig config = parse_embedded(default_node_config_json());
  return config;
}

const NodeConfig& paper_node_config() {
  static const NodeConfig config = parse_embedded(paper_node_config_json());
  return config;
}

std::optional<NodeConfig> embedded_node_config(std::string_view name) {
  if (name == default_node_config().name) return default_node_config();
  if (name == paper_node_config().name) return paper_node_config();
  return std::nullopt;
}

Result<NodeConfig> node_config_by_name_or_path(const std::string& name_or_path) {
  if (auto embedded = embedded_node_config(name_or_path)) return *std::move(embedded);
  return load_node_config(name_or_path);
}

std::string describe(const NodeConfig& config) {
  std::ostringstream out;
  out << "node " << config.name;
  if (!config.description.empty()) out << " (" << config.description << ")";
  out << ": " << config.gpu_count() << " GPUs\n";
  for (int i = 0; i < config.gpu_count(); ++i) {
    const GpuSpec& g = config.gpus[i];
    out << "  GPU " << i << ": " << g.product_name << ", " << (g.memory_bytes >> 20) << " MiB, sm_"
        << g.compute_capability_major << g.compute_capability_minor << ", " << g.multiprocessors
        << " SMs, PCIe switch " << g.pcie_switch << ", bus " << g.pci_bus_id << "\n";
  }
  for (size_t i = 0; i < config.pcie_switches.size(); ++i) {
    out << "  PCIe switch " << i << ": host->GPU " << config.pcie_switches[i].host_to_device_gbps
        << " GB/s, GPU->host " << config.pcie_switches[i].device_to_host_gbps << " GB/s, GPUs";
    for (int g = 0; g < config.gpu_count(); ++g) {
      if (config.gpus[g].pcie_switch == static_cast<int>(i)) out << " " << g;
    }
    out << "\n";
  }
  for (const auto& l : config.nvlinks) {
    out << "  NVLink GPU " << l.gpu_a << " <-> GPU " << l.gpu_b << ": " << l.bandwidth_gbps
        << " GB/s per direction\n";
  }
  for (const auto& s : config.nvswitches) {
    out << "  NVSwitch GPUs";
    for (int g : s.gpus) out << " " << g;
    out << ": " << s.port_bandwidth_gbps << " GB/s per port per direction\n";
  }
  return out.str();
}

}  // namespace hiber
