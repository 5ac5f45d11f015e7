// Policies by name: what SchedulerOptions' strings (and so hiberd's and hiber-sim's flags) can
// say. No global registry (STYLE.md §6): each name maps to its factory here, and an unknown name
// is refused with the list of known ones.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "common/status.h"
#include "scheduler/eviction.h"
#include "scheduler/oracle.h"
#include "scheduler/placement.h"
#include "scheduler/queue.h"

namespace hiber::scheduler {

// The known names, default first.
std::span<const std::string_view> placement_policy_names();
std::span<const std::string_view> eviction_policy_names();
std::span<const std::string_view> queue_policy_names();

// True for the eviction policies that need a FutureOracle ("belady", "cremebrulee-oracle").
bool eviction_needs_oracle(std::string_view name);

// kInvalidValue for an unknown name, listing the known ones; for an oracle policy without an
// oracle.
Result<std::unique_ptr<PlacementPolicy>> make_placement_policy(std::string_view name);
Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(std::string_view name,
                                                             const EvictionOptions& options,
                                                             const FutureOracle* oracle);
Result<std::unique_ptr<QueuePolicy>> make_queue_policy(std::string_view name,
                                                       const QueueOptions& options);

}  // namespace hiber::scheduler
