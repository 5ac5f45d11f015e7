#include "scheduler/policy_factory.h"

#include <array>
#include <string>

namespace hiber::scheduler {
namespace {

constexpr std::array<std::string_view, 2> kPlacement = {"algorithm1", "random"};
constexpr std::array<std::string_view, 9> kEviction = {
    "heaviness",          "lru",    "lfu",  "random", "mcache", "cremebrulee",
    "cremebrulee-oracle", "belady", "slack"};
constexpr std::array<std::string_view, 3> kQueue = {"rrc", "fifo", "gshare"};

Status unknown(std::string_view kind, std::string_view name,
               std::span<const std::string_view> known) {
  std::string list;
  for (std::string_view k : known) {
    if (!list.empty()) list += ", ";
    list += k;
  }
  return error(ErrorCode::kInvalidValue, "unknown ", kind, " policy '", name, "' (known: ", list,
               ")");
}

}  // namespace

std::span<const std::string_view> placement_policy_names() { return kPlacement; }
std::span<const std::string_view> eviction_policy_names() { return kEviction; }
std::span<const std::string_view> queue_policy_names() { return kQueue; }

bool eviction_needs_oracle(std::string_view name) {
  return name == "belady" || name == "cremebrulee-oracle";
}

Result<std::unique_ptr<PlacementPolicy>> make_placement_policy(std::string_view name) {
  if (name == "algorithm1") return make_algorithm1_placement();
  if (name == "random") return make_random_placement();
  return unknown("placement", name, kPlacement);
}

Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(std::string_view name,
                                                             const EvictionOptions& options,
                                                             const FutureOracle* oracle) {
  if (eviction_needs_oracle(name) && oracle == nullptr)
    return error(ErrorCode::kInvalidValue, "eviction policy '", name,
                 "' needs to know the future: only a simulator replaying a trace can run it");
  if (name == "heaviness") return make_heaviness_eviction();
  if (name == "lru") return make_lru_eviction();
  if (name == "lfu") return make_lfu_eviction();
  if (name == "random") return make_random_eviction();
  if (name == "mcache") return make_mcache_eviction(options);
  if (name == "cremebrulee") return make_cremebrulee_eviction(/*oracle=*/false);
  if (name == "cremebrulee-oracle") return make_cremebrulee_eviction(/*oracle=*/true);
  if (name == "belady") return make_belady_eviction();
  if (name == "slack") return make_slack_eviction(options);
  return unknown("eviction", name, kEviction);
}

Result<std::unique_ptr<QueuePolicy>> make_queue_policy(std::string_view name,
                                                       const QueueOptions& options) {
  if (name == "rrc") return make_rrc_queue(options);
  if (name == "fifo") return make_fifo_queue();
  if (name == "gshare") return make_gshare_queue(options);
  return unknown("queue", name, kQueue);
}

}  // namespace hiber::scheduler
