// Shared by the scheduler tests: the shipped node configs, small hand-sized variants of them,
// and function specs with round numbers.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "scheduler/scheduler.h"

namespace hiber::scheduler::testing {

inline constexpr Duration kMs = kMillisecond;

// The function ids first..last (inclusive), in order.
inline std::vector<FunctionId> function_ids(uint32_t first, uint32_t last) {
  std::vector<FunctionId> ids;
  for (uint32_t id = first; id <= last; ++id) ids.push_back(FunctionId{id});
  return ids;
}

// configs/nodes/<name>; the test fails if it does not load.
inline NodeConfig shipped_config(const std::string& name) {
  Result<NodeConfig> config =
      load_node_config(std::string(HIBER_SOURCE_DIR) + "/configs/nodes/" + name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : NodeConfig{};
}

// The Torpor paper's 4-GPU node (Fig. 5): GPUs {0,1} and {2,3} share a PCIe switch; NVLink
// 0-3, 1-2, 2-3 at 50 GB/s and 0-1, 0-2, 1-3 at 25 GB/s. `memory` replaces each GPU's memory
// when non-zero, so that a handful of models fill it.
inline Topology torpor_topology(uint64_t memory = 0) {
  NodeConfig config = shipped_config("torpor-4gpu.json");
  if (memory != 0) {
    for (GpuSpec& gpu : config.gpus) gpu.memory_bytes = memory;
  }
  Result<Topology> topology = Topology::from_config(config);
  EXPECT_TRUE(topology.ok()) << topology.status();
  return std::move(topology).value();
}

// A node of `gpus` GPUs on one PCIe switch, without NVLink.
inline Topology plain_topology(int gpus, uint64_t memory) {
  NodeConfig config = shipped_config("torpor-4gpu.json");
  config.gpus.resize(static_cast<size_t>(gpus), config.gpus[0]);
  for (size_t g = 0; g < config.gpus.size(); ++g) {
    config.gpus[g].memory_bytes = memory;
    config.gpus[g].pcie_switch = 0;
    config.gpus[g].pci_bus_id = "0000:" + std::to_string(10 + g) + ":00.0";
  }
  config.nvlinks.clear();
  Result<Topology> topology = Topology::from_config(config);
  EXPECT_TRUE(topology.ok()) << topology.status();
  return std::move(topology).value();
}

inline FunctionSpec spec(uint64_t bytes, Duration slo = 100 * kMs, Duration exec = 10 * kMs,
                         std::optional<bool> heavy = std::nullopt) {
  FunctionSpec s;
  s.model_bytes = bytes;
  s.slo = slo;
  s.exec_time_hint = exec;
  s.heavy_hint = heavy;
  return s;
}

inline std::unique_ptr<Scheduler> make_scheduler(const Topology& topology,
                                                 const SchedulerOptions& options = {},
                                                 const FutureOracle* oracle = nullptr) {
  Result<std::unique_ptr<Scheduler>> s = Scheduler::create(topology, options, oracle);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(s).value() : nullptr;
}

inline std::vector<Decision> dispatch(Scheduler& s, Time now) {
  std::vector<Decision> out;
  s.dispatch(now, &out);
  return out;
}

#define EXPECT_INVARIANTS(s)                           \
  do {                                                 \
    const ::hiber::Status st = (s).check_invariants(); \
    EXPECT_TRUE(st.ok()) << st;                        \
  } while (0)

}  // namespace hiber::scheduler::testing
