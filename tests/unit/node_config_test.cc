#include "common/node_config.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/node_config_capnp.h"

namespace hiber {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string source_dir() { return HIBER_SOURCE_DIR; }

constexpr char kMinimal[] = R"({
  "name": "n",
  "gpuModels": [{"name": "m", "productName": "GPU M", "memoryBytes": 1073741824,
                 "computeCapabilityMajor": 8, "computeCapabilityMinor": 0, "multiprocessors": 4}],
  "gpus": [{"model": "m", "pcieSwitch": 0}, {"model": "m", "pcieSwitch": 0}],
  "pcieSwitches": [{"hostToDeviceGBps": 10, "deviceToHostGBps": 11}],
  "nvlinks": [{"gpuA": 0, "gpuB": 1, "bandwidthGBps": 20}]
})";

TEST(NodeConfig, TheTorporNodeMatchesThePaper) {
  auto config = load_node_config(source_dir() + "/configs/nodes/torpor-4gpu.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->gpu_count(), 4);
  // Fig. 5: pairs behind a PCIe switch.
  EXPECT_TRUE(config->share_pcie_switch(0, 1));
  EXPECT_TRUE(config->share_pcie_switch(2, 3));
  EXPECT_FALSE(config->share_pcie_switch(1, 2));
  // NVLink of two speeds; every pair is linked.
  EXPECT_EQ(config->peer_bandwidth_gbps(0, 3), 50);
  EXPECT_EQ(config->peer_bandwidth_gbps(0, 1), 25);
  EXPECT_EQ(config->peer_bandwidth_gbps(2, 1), 50);
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      if (a != b) {
        EXPECT_GT(config->peer_bandwidth_gbps(a, b), 0) << a << "-" << b;
      }
    }
  }
  EXPECT_EQ(config->gpus[2].product_name, "Tesla V100-SXM2-16GB");
  EXPECT_EQ(config->gpus[2].memory_bytes, 16ull << 30);
}

TEST(NodeConfig, TheNvSwitchNodeConnectsEveryPair) {
  auto config = load_node_config(source_dir() + "/configs/nodes/nvswitch-8gpu.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->gpu_count(), 8);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a != b) {
        EXPECT_EQ(config->peer_bandwidth_gbps(a, b), 450);
      }
    }
  }
  EXPECT_TRUE(config->share_pcie_switch(6, 7));
  EXPECT_FALSE(config->share_pcie_switch(5, 6));
}

TEST(NodeConfig, TheEmbeddedDefaultIsTheH100FileAndThePaperNodeIsNamed) {
  EXPECT_EQ(default_node_config_json(),
            read_file(source_dir() + "/configs/nodes/nvswitch-8gpu.json"));
  EXPECT_EQ(default_node_config().name, "nvswitch-8gpu");
  // CUDA 13, cuBLAS 13 and cuDNN 9 need at least 7.5.
  EXPECT_GE(default_node_config().gpus[0].compute_capability_major * 10 +
                default_node_config().gpus[0].compute_capability_minor,
            75);
  EXPECT_EQ(paper_node_config_json(), read_file(source_dir() + "/configs/nodes/torpor-4gpu.json"));
  EXPECT_EQ(paper_node_config().name, kPaperNodeName);
  ASSERT_TRUE(embedded_node_config("torpor-4gpu").has_value());
  EXPECT_EQ(embedded_node_config("torpor-4gpu")->gpus.size(), 4u);
  EXPECT_FALSE(embedded_node_config("no-such-node").has_value());
  auto by_name = node_config_by_name_or_path("nvswitch-8gpu");
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(by_name->gpus.size(), 8u);
  EXPECT_FALSE(node_config_by_name_or_path("/no/such/file.json").ok());
}

TEST(NodeConfig, MissingPciBusIdsAreMadeUpAndUnique) {
  auto config = parse_node_config(kMinimal);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->gpus[0].pci_bus_id.empty());
  EXPECT_NE(config->gpus[0].pci_bus_id, config->gpus[1].pci_bus_id);
}

TEST(NodeConfig, RoundTripsThroughCapnp) {
  auto config = load_node_config(source_dir() + "/configs/nodes/torpor-4gpu.json");
  ASSERT_TRUE(config.ok());
  capnp::MallocMessageBuilder message;
  node_config_to_capnp(*config, message.initRoot<config::NodeConfig>());
  auto back = node_config_from_capnp(message.getRoot<config::NodeConfig>().asReader());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(describe(*back), describe(*config));
}

// fuzz_handshake found a Welcome whose node had a productName starting with a NUL byte: it
// passed the "missing" check (the Text is not empty) and was kept empty (std::string from
// cStr()), so the config checked was not the config kept, and re-encoding it was refused. The
// input itself is in tests/fuzz/corpus/handshake/regression-nul-product-name.
TEST(NodeConfig, TextWithANulByteIsRefused) {
  auto config = load_node_config(source_dir() + "/configs/nodes/torpor-4gpu.json");
  ASSERT_TRUE(config.ok());
  // std::string cannot carry the NUL through node_config_to_capnp: write it into the message.
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<config::NodeConfig>();
  node_config_to_capnp(*config, root);
  root.getGpuModels()[0].getProductName().begin()[0] = '\0';
  auto back = node_config_from_capnp(root.asReader());
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(back.status().message().find(".productName has a NUL byte"), std::string::npos)
      << back.status();

  capnp::MallocMessageBuilder bus;
  auto bus_root = bus.initRoot<config::NodeConfig>();
  node_config_to_capnp(*config, bus_root);
  bus_root.getGpus()[1].getPciBusId().begin()[7] = '\0';
  back = node_config_from_capnp(bus_root.asReader());
  EXPECT_NE(back.status().message().find("gpus[1].pciBusId has a NUL byte"), std::string::npos)
      << back.status();
}

struct BadConfig {
  const char* what;
  std::string json;
  const char* message_part;
};

std::string replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

class NodeConfigRejects : public ::testing::TestWithParam<BadConfig> {};

TEST_P(NodeConfigRejects, WithAMessageNamingTheProblem) {
  auto config = parse_node_config(GetParam().json);
  ASSERT_FALSE(config.ok()) << GetParam().what;
  EXPECT_EQ(config.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(config.status().message().find(GetParam().message_part), std::string::npos)
      << config.status();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, NodeConfigRejects,
    ::testing::Values(
        BadConfig{"not json", "{\"name\": ", "not valid JSON"},
        BadConfig{"wrong type", replace(kMinimal, "\"name\": \"n\"", "\"name\": 5"),
                  "not valid JSON"},
        BadConfig{"no name", replace(kMinimal, "\"name\": \"n\"", "\"name\": \"\""), "'name'"},
        BadConfig{
            "no gpus",
            replace(
                kMinimal,
                "[{\"model\": \"m\", \"pcieSwitch\": 0}, {\"model\": \"m\", \"pcieSwitch\": 0}]",
                "[]"),
            "'gpus' is empty"},
        BadConfig{"unknown model",
                  replace(kMinimal, "{\"model\": \"m\", \"pcieSwitch\": 0},",
                          "{\"model\": \"x\", \"pcieSwitch\": 0},"),
                  "not in gpuModels"},
        BadConfig{"missing switch",
                  replace(kMinimal, "{\"model\": \"m\", \"pcieSwitch\": 0},",
                          "{\"model\": \"m\", \"pcieSwitch\": 3},"),
                  "pcieSwitch 3"},
        BadConfig{"zero memory", replace(kMinimal, "1073741824", "0"), "memoryBytes"},
        BadConfig{"zero bandwidth",
                  replace(kMinimal, "\"hostToDeviceGBps\": 10", "\"hostToDeviceGBps\": 0"),
                  "bandwidths"},
        BadConfig{"self link", replace(kMinimal, "\"gpuB\": 1", "\"gpuB\": 0"), "itself"},
        BadConfig{"link to nowhere", replace(kMinimal, "\"gpuB\": 1", "\"gpuB\": 9"),
                  "does not exist"},
        BadConfig{"negative link",
                  replace(kMinimal, "\"bandwidthGBps\": 20", "\"bandwidthGBps\": -1"),
                  "bandwidthGBps"},
        BadConfig{
            "duplicate link",
            replace(kMinimal, "\"bandwidthGBps\": 20}]",
                    "\"bandwidthGBps\": 20}, {\"gpuA\": 1, \"gpuB\": 0, \"bandwidthGBps\": 5}]"),
            "duplicates"}),
    [](const auto& info) {
      std::string name = info.param.what;
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name;
    });

TEST(NodeConfig, RejectsHugeInput) {
  std::string huge(2 << 20, ' ');
  auto config = parse_node_config(huge);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("limit"), std::string::npos);
}

TEST(NodeConfig, MissingFileIsFileNotFound) {
  auto config = load_node_config("/nonexistent/node.json");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), ErrorCode::kFileNotFound);
}

}  // namespace
}  // namespace hiber
