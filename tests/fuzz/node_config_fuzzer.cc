// A node config as hiberd, hiber-sim and hiber-router read it (--node_config: a JSON file,
// parse_node_config) and as a client gets it in the Welcome (node_config_from_capnp).
//
// Promises checked: nothing crashes, leaks or hangs; every error is kInvalidValue; a config that
// parses has every index in range (the topology queries below would read out of bounds
// otherwise, which ASan reports) and survives the Cap'n Proto form the handshake carries:
// to_capnp then from_capnp accepts it and describes the same node.
#include <capnp/message.h>

#include <string_view>

#include "common/node_config.h"
#include "common/node_config_capnp.h"
#include "tests/fuzz/fuzz_support.h"

namespace hiber {
namespace {

void check_topology(const NodeConfig& config) {
  const int gpus = config.gpu_count();
  CHECK_GT(gpus, 0);
  for (const GpuSpec& gpu : config.gpus) {
    CHECK_GE(gpu.pcie_switch, 0);
    CHECK_LT(static_cast<size_t>(gpu.pcie_switch), config.pcie_switches.size());
  }
  for (const NvLinkSpec& link : config.nvlinks) {
    CHECK(link.gpu_a >= 0 && link.gpu_a < gpus && link.gpu_b >= 0 && link.gpu_b < gpus);
  }
  for (const NvSwitchSpec& fabric : config.nvswitches) {
    for (int g : fabric.gpus) CHECK(g >= 0 && g < gpus);
  }
  for (int a = 0; a < gpus; ++a) {
    for (int b = 0; b < gpus; ++b) {
      (void)config.share_pcie_switch(a, b);
      CHECK_GE(config.peer_bandwidth_gbps(a, b), 0.0);
    }
  }
}

}  // namespace
}  // namespace hiber

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hiber::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  const hiber::Result<hiber::NodeConfig> config = hiber::parse_node_config(json);
  if (!config.ok()) {
    CHECK_EQ(static_cast<int>(config.status().code()),
             static_cast<int>(hiber::ErrorCode::kInvalidValue))
        << config.status();
    return 0;
  }
  hiber::check_topology(*config);
  const std::string described = hiber::describe(*config);
  capnp::MallocMessageBuilder message;
  hiber::node_config_to_capnp(*config, message.initRoot<hiber::config::NodeConfig>());
  const auto back =
      hiber::node_config_from_capnp(message.getRoot<hiber::config::NodeConfig>().asReader());
  CHECK(back.ok()) << "a parsed config fails its Cap'n Proto form: " << back.status();
  CHECK_EQ(hiber::describe(*back), described);
  return 0;
}
