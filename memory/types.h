// The few names every part of memory/ shares: who owns a block, and where it sits on a GPU.
#pragma once

#include <cstdint>

#include "common/ids.h"

namespace hiber::memory {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// A function (one tenant of the node). hiberd numbers them; "nobody" is
// std::optional<FunctionId>.
using FunctionId = hiber::FunctionId;

// Where a block's bytes live on one GPU: a chunk of that GPU's pool and an offset inside it.
struct PoolLocation {
  uint32_t chunk = 0;
  uint64_t offset = 0;
  friend bool operator==(const PoolLocation&, const PoolLocation&) = default;
};

// A block's state on one GPU.
enum class Residency : uint8_t {
  kEvicted,   // no placement there (never placed, or its GPU copy was invalidated)
  kLoading,   // placed; its bytes are in flight
  kResident,  // placed and complete
};

// Blocks filled before the function's first request are its model; the host copy of a model
// block is authoritative, so eviction copies nothing back. Blocks allocated while serving
// requests are scratch: re-placed on another GPU without copying (docs/design.md).
enum class BlockKind : uint8_t { kModel, kScratch };

}  // namespace hiber::memory
