// How a GPU's memory is handed out to functions' blocks: one interface, three allocators.
//
//   buddy  (buddy_allocator.h)  the paper's §4.4: a binary buddy over chunks reserved once at
//                               start, with consolidation and sharing. hiberd's default.
//   block  (block_allocator.h)  the paper's Torpor-Block ablation: one cache of freed device
//                               allocations.
//   naive  (naive_allocator.h)  one device allocation per request.
//
// Running out of memory is an answer, not a crash: allocate() returns a Shortfall that says how
// much is missing and whose blocks would have to go to fit the request.
//
// Thread safety: none; an allocator belongs to one caller at a time (GpuPools serialises).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "memory/types.h"

namespace hiber::memory {

// One live allocation: where its bytes are and how many it took from the pool (the request
// rounded up, plus whatever the allocator could not give back).
struct Allocation {
  PoolLocation where;
  uint64_t bytes = 0;
  friend bool operator==(const Allocation&, const Allocation&) = default;
};

struct OwnerBytes {
  FunctionId function;
  uint64_t bytes = 0;
  friend bool operator==(const OwnerBytes&, const OwnerBytes&) = default;
};

// Whether a refused request's Shortfall names what to evict. Finding the cheapest eviction
// searches the pool (the buddy allocator's region costs); a caller whose own policy picks the
// victims (hiber-sim, through the node core's make_room) skips that search.
enum class EvictionAdvice : uint8_t {
  kWanted,   // evict_bytes and evict are filled in
  kSkipped,  // they stay 0 and empty (an over-quota refusal still gives evict_bytes)
};

// Why a request did not fit, and what eviction would make it fit.
struct Shortfall {
  int gpu = -1;  // set by GpuPools; -1 for a bare allocator
  uint64_t requested_bytes = 0;
  uint64_t needed_bytes = 0;  // what it would take from the pool after rounding
  uint64_t free_bytes = 0;    // free now, including caches the allocator would flush
  uint64_t largest_free_bytes = 0;
  bool over_quota = false;  // the function's own quota on this GPU is the limit
  bool never_fits = false;  // larger than the pool could ever give one block
  // The cheapest eviction that makes the request fit: these functions' allocations, with
  // the bytes of theirs that would be freed. For the buddy allocator it is the contiguous
  // region holding the fewest evictable bytes; for block and naive, whose placement is the
  // device's business, any `evict_bytes` will do and `evict` is empty. Empty with
  // evict_bytes == 0 when nothing evictable would make room. Not computed when the request
  // skipped the advice (`advised` false).
  uint64_t evict_bytes = 0;
  std::vector<OwnerBytes> evict;
  bool advised = true;

  std::string describe() const;
};

// Either an Allocation or a Shortfall.
class AllocationResult {
 public:
  AllocationResult(Allocation allocation) : value_(allocation) {}
  AllocationResult(Shortfall shortfall) : value_(std::move(shortfall)) {}
  bool ok() const { return std::holds_alternative<Allocation>(value_); }
  const Allocation& value() const { return std::get<Allocation>(value_); }
  const Allocation& operator*() const { return value(); }
  const Allocation* operator->() const { return &value(); }
  const Shortfall& shortfall() const { return std::get<Shortfall>(value_); }
  Shortfall& shortfall() { return std::get<Shortfall>(value_); }

 private:
  std::variant<Allocation, Shortfall> value_;
};

// Which functions may be evicted to make room (executing functions and transfer sources may
// not). Empty means "everyone but the requester".
using EvictablePredicate = std::function<bool(FunctionId)>;

struct PoolStats {
  uint64_t capacity_bytes = 0;   // the pool (buddy) or the device budget (block, naive)
  uint64_t allocated_bytes = 0;  // taken by live allocations
  uint64_t requested_bytes = 0;  // what those allocations asked for
  uint64_t cached_bytes = 0;     // free but held in a cache (block's cache, buddy's shared sizes)
  uint64_t free_bytes = 0;       // capacity - allocated - cached
  // The largest request sure to fit now without touching caches: the largest free block (the
  // buddy allocator can also join adjacent free blocks: BuddyAllocator::largest_free_run_bytes).
  uint64_t largest_free_bytes = 0;
  // The largest block the pool makes (the buddy's chunk, the budget of block and naive): no
  // free block can be larger, however much is free.
  uint64_t max_block_bytes = 0;
  uint64_t live_allocations = 0;
  // Counters since construction.
  uint64_t allocations = 0;
  uint64_t deallocations = 0;
  uint64_t failures = 0;                // requests answered with a Shortfall
  uint64_t fragmentation_failures = 0;  // ... although free + cached bytes were enough
  uint64_t splits = 0;
  uint64_t merges = 0;
  uint64_t cache_hits = 0;
  uint64_t upstream_allocations = 0;  // device allocations made after start
  uint64_t upstream_releases = 0;

  // Rounding waste inside live allocations.
  uint64_t internal_waste_bytes() const { return allocated_bytes - requested_bytes; }
  // 1 - largest free block / the largest free block there could be: all free bytes (caches
  // included), but never more than max_block_bytes. 0 when free memory is as whole as the pool
  // allows (an empty pool, a pool whose free chunks are whole) or there is none; towards 1 as
  // it turns to dust.
  double fragmentation() const;
};

class PoolAllocator {
 public:
  virtual ~PoolAllocator() = default;
  PoolAllocator(const PoolAllocator&) = delete;
  PoolAllocator& operator=(const PoolAllocator&) = delete;

  // "buddy", "block" or "naive".
  virtual std::string_view name() const = 0;

  // Places `bytes` for `owner`. A request of 0 bytes or over the pool's size is answered, as
  // is one that does not fit now; `advice` says whether that answer names what to evict.
  AllocationResult allocate(uint64_t bytes, FunctionId owner,
                            const EvictablePredicate& evictable = {},
                            EvictionAdvice advice = EvictionAdvice::kWanted);

  // Gives an allocation back. kInvalidValue (and no change) for anything that is not a live
  // allocation of this pool, so a confused caller cannot corrupt it.
  Status deallocate(const Allocation& allocation) noexcept;

  // The function a live allocation of this pool (exactly this location and size) belongs to;
  // nullopt for anything else. O(1) for buddy (its page arrays), a hash lookup for the others.
  virtual std::optional<FunctionId> owner(const Allocation& allocation) const noexcept = 0;

  // Releases whatever caches hold (back to the buddy lists, or to the device).
  virtual void release_cached() noexcept = 0;

  virtual PoolStats stats() const = 0;

  // Checks every internal invariant (lists, accounting, no overlap); an error names the first
  // one broken. For tests and the simulator's paranoid mode: O(pool size).
  virtual Status check_invariants() const = 0;

 protected:
  PoolAllocator() = default;

 private:
  virtual AllocationResult do_allocate(uint64_t bytes, FunctionId owner,
                                       const EvictablePredicate& evictable,
                                       EvictionAdvice advice) = 0;
  virtual Status do_deallocate(const Allocation& allocation) noexcept = 0;
  virtual uint64_t max_request_bytes() const = 0;
};

// Where block and naive get device allocations: hiberd creates physical memory on the GPU;
// hiber-sim and the tests count bytes. Chunk ids are the upstream's to choose.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  virtual Result<uint32_t> create_chunk(uint64_t bytes) = 0;
  virtual void release_chunk(uint32_t chunk) noexcept = 0;
};

// A ChunkSource that only counts: ids are reused after release, creation fails past
// `capacity_bytes` (as a device would when full).
class CountingChunkSource final : public ChunkSource {
 public:
  explicit CountingChunkSource(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
  Result<uint32_t> create_chunk(uint64_t bytes) override;
  void release_chunk(uint32_t chunk) noexcept override;
  uint64_t live_bytes() const { return live_bytes_; }
  uint64_t live_chunks() const { return live_chunks_; }

 private:
  uint64_t capacity_bytes_;
  uint64_t live_bytes_ = 0;
  uint64_t live_chunks_ = 0;
  std::vector<uint64_t> bytes_;  // by chunk id; 0 = free id
  std::vector<uint32_t> free_ids_;
};

inline constexpr uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace hiber::memory
