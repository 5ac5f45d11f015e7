// One run: a system (Hiber with some policies, or an early-binding baseline) on one node or a
// cluster of identical nodes, driven by a workload, measured by a Recorder.
//
// The loop: the next thing to happen is either the next arrival of the workload or the
// earliest pending event; at equal times events go first (a completion frees a GPU before a
// new request looks for one). Arrivals go to the node the balancer chose for their function.
// After the last arrival the run goes on for `drain` so that queued requests can finish; what
// is left then is recorded as unfinished. Everything is deterministic: the same workload,
// system and seed give the same results, to the bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "sim/early_binding_node.h"
#include "sim/hiber_node.h"
#include "sim/metrics.h"
#include "sim/workload.h"

namespace hiber::sim {

enum class SystemKind : uint8_t { kHiber, kEarlyBinding };

struct SystemSpec {
  std::string label;
  SystemKind kind = SystemKind::kHiber;
  HiberOptions hiber;
  EarlyBindingOptions early;
};

struct RunConfig {
  NodeConfig node;
  int nodes = 1;
  Duration warmup = 60 * kSecond;  // requests arriving earlier are not measured
  Duration drain = 60 * kSecond;
};

struct RunOutput {
  Results results;
  std::vector<std::string> node_summaries;
  uint64_t events = 0;
  uint64_t arrivals = 0;
};

Result<RunOutput> simulate(const SystemSpec& system, const RunConfig& config,
                           const Workload& workload);

// Whether a Hiber eviction policy needs to know the future.
bool needs_oracle(const std::string& eviction);

}  // namespace hiber::sim
