// A binary buddy allocator over a GPU's pool: chunks reserved once at start, blocks placed in
// them by power-of-two orders, split and coalesced in O(log n). With the paper's (§4.4)
// extensions:
//
// - Minimum block 2 MiB. PyTorch's caching allocator asks the device for 2 MiB, 20 MiB and
//   2 MiB-rounded segments only, so nothing of its requests is lost to rounding; 2 MiB is also
//   the CUDA VMM allocation granularity of current GPUs, so every block can be mapped on its
//   own at the function's virtual address (the mapping mechanism). A smaller minimum would
//   place blocks that cannot be mapped alone; a larger one (Clockwork's 16 MiB pages) would
//   waste 14 MiB on each of the many 2 MiB segments.
// - Tail trimming. A request takes the prefix of a block of the next order up and gives the
//   rest back as smaller free blocks (a 20 MiB segment takes 20 MiB, not 32), so waste stays
//   below one minimum block. Freeing decomposes the prefix again and coalesces each piece.
// - Runs. When no free block is large enough, a request takes the shortest run of adjacent free
//   blocks that holds it (a 20 MiB segment fits in [4, 24) MiB though no aligned 32 MiB block
//   is free) before the allocator answers with a shortfall. The search is O(blocks) on this
//   slow path only, and walks again only the chunks that changed since; the fast paths stay
//   O(log n).
// - Consolidation. A function's first block starts a region of its own: it is cut from a
//   free block of at least `home_region_bytes` where one exists (else the largest there is).
//   Its next blocks go, in order of preference, right after its latest block (exactly there:
//   the pages that follow, whichever free blocks they span, so a 20 MiB segment after a 20 MiB
//   segment does not skip to the next 32 MiB boundary), into the free buddies of that block's
//   ancestors (its own region), then anywhere in its home chunk, and only then elsewhere. So a
//   function's blocks end up back to back: evicting it frees large contiguous runs instead of
//   holes, and a swap maps them in few calls (memory/translation.h). A block placed right
//   after another need not be aligned to its own size; freeing it still decomposes it into
//   aligned pieces that coalesce as usual.
// - Sharing. Freed blocks of the common sizes (by default 2 and 20 MiB, PyTorch's segment
//   sizes) wait in a bounded cache and go to the next function that asks for that size,
//   whoever it is: scratch blocks released after each request are reused with no split or
//   coalesce. The cache is flushed before the allocator reports a shortfall.
//
// Offsets inside a chunk are multiples of the minimum block; a free block of order k is
// aligned to its size relative to the chunk's start. Chunks need not be powers of two: a chunk
// is cut into aligned power-of-two pieces, which never coalesce across the chunk's end.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "memory/pool_allocator.h"

namespace hiber::memory {

struct BuddyOptions {
  // The smallest block: a power of two. Chunk sizes must be multiples of it.
  uint64_t min_block_bytes = 2 * kMiB;
  // Give back the unused tail of the power-of-two block a request was rounded up to.
  bool trim_tail = true;
  // Keep each function's blocks together (home chunk first).
  bool consolidate = true;
  // The free block a function's first allocation is cut from, when one this large exists:
  // room for its later blocks to follow. 256 MiB is a typical CNN model with its activations
  // (the paper's Table 4 models are 100-700 MiB).
  uint64_t home_region_bytes = 256 * kMiB;
  // Sizes whose freed blocks are cached for reuse across functions (multiples of the minimum
  // block). Empty disables sharing.
  std::vector<uint64_t> shared_sizes = {2 * kMiB, 20 * kMiB};
  // The most the sharing cache holds; 0 means 1/16 of the pool.
  uint64_t shared_cache_bytes = 0;
};

class BuddyAllocator final : public PoolAllocator {
 public:
  // One chunk per entry of `chunk_bytes`; chunk i is PoolLocation::chunk == i.
  // kInvalidValue for a bad option or a chunk that is not a multiple of the minimum block.
  static Result<std::unique_ptr<BuddyAllocator>> create(const std::vector<uint64_t>& chunk_bytes,
                                                        BuddyOptions options = {});

  std::string_view name() const override { return "buddy"; }
  std::optional<FunctionId> owner(const Allocation& allocation) const noexcept override;
  void release_cached() noexcept override;
  PoolStats stats() const override;
  Status check_invariants() const override;

  // Adds a chunk (the pinned host pool grows this way, a large chunk at a time). Its index. A
  // chunk larger than all before raises the largest block to its size.
  Result<uint32_t> add_chunk(uint64_t bytes);
  uint32_t chunk_count() const { return static_cast<uint32_t>(chunks_.size()); }
  uint64_t chunk_bytes(uint32_t chunk) const {
    return uint64_t{chunks_[chunk].pages} << page_shift_;
  }
  uint64_t min_block_bytes() const { return uint64_t{1} << page_shift_; }

  // The free blocks, sorted by (chunk, offset): {where, bytes}. For tests and reports.
  std::vector<std::pair<PoolLocation, uint64_t>> free_blocks() const;
  // The longest run of adjacent free blocks: the largest request that fits now without
  // touching the sharing cache (stats().largest_free_bytes is the largest single free block,
  // which needs no walk). O(blocks in the pool): for reports.
  uint64_t largest_free_run_bytes() const;

 private:
  struct Chunk {
    uint32_t first_page = 0;
    uint32_t pages = 0;
  };
  struct OwnerState {
    uint32_t home_chunk = 0;
    uint32_t last_page = 0;  // first page of its latest allocation
    uint32_t live = 0;
  };
  static constexpr uint32_t kNone = UINT32_MAX;

  BuddyAllocator(BuddyOptions options, int page_shift, int max_order);

  AllocationResult do_allocate(uint64_t bytes, FunctionId owner,
                               const EvictablePredicate& evictable, EvictionAdvice advice) override;
  Status do_deallocate(const Allocation& allocation) noexcept override;
  uint64_t max_request_bytes() const override;

  // Free lists, one per (chunk, order), last in first out.
  uint32_t& head(uint32_t chunk, int order) { return heads_[chunk * orders() + order]; }
  uint32_t head(uint32_t chunk, int order) const { return heads_[chunk * orders() + order]; }
  void push_free(uint32_t chunk, uint32_t page, int order);
  void remove_free(uint32_t chunk, uint32_t page, int order);
  // Marks [page, page + pages) free or not in free_bits_.
  void mark_free(uint32_t page, uint32_t pages, bool free);
  // The first page in [page, end) that is free (want true) or not (false), else end.
  uint64_t next_page_with(uint64_t page, uint64_t end, bool want) const;
  // Frees the block of `order` at chunk-relative page `rel`, coalescing with free buddies.
  void free_block(uint32_t chunk, uint32_t rel, int order);
  // Frees [rel, rel + pages) of a chunk as aligned power-of-two pieces.
  void free_range(uint32_t chunk, uint32_t rel, uint32_t pages);
  // A chunk with a free block of exactly `order`, preferring the lowest; kNone if none.
  uint32_t chunk_with_free(int order) const;
  void set_nonempty(int order, uint32_t chunk, bool nonempty);

  int orders() const { return max_order_ + 1; }
  void raise_max_order(int order);
  int shared_index(uint32_t pages) const;
  // Records a new allocation at `page` for `owner`, whose entry in owners_ is `state`.
  void record_span(uint32_t page, uint32_t pages, FunctionId owner, OwnerState& state,
                   uint64_t requested);
  // Takes the free block of `found` order at `page`, splits it down to `order`, keeps its
  // first `pages` and frees the rest.
  Allocation take(uint32_t chunk, uint32_t page, int found, int order, uint32_t pages,
                  FunctionId owner, OwnerState& state, uint64_t requested);
  // The page right after the owner's latest allocation if the `pages` from there are free
  // (whatever free blocks they span), else kNone.
  uint32_t run_after_latest(const OwnerState& owner, FunctionId id, uint32_t pages) const;
  // Takes the free pages [page, page + pages), which free blocks cover; the last block's rest
  // is freed again.
  Allocation take_run(uint32_t chunk, uint32_t page, uint32_t pages, FunctionId owner,
                      OwnerState& state, uint64_t requested);
  // Calls visit(first page, pages) for every maximal run of adjacent free blocks of one chunk,
  // in page order. O(pages in the chunk / 64): a scan of free_bits_.
  template <typename Visit>
  void for_each_free_run(uint32_t chunk, Visit&& visit) const;
  // The first page of the shortest free run that holds `pages` (the lowest among equals), or
  // kNone: the slow path for a request no free block can hold alone. It reads the runs of each
  // chunk from runs_, walking again only the chunks whose free blocks changed since.
  uint32_t find_free_run(uint32_t pages);
  // No free run of the chunk is longer than this.
  uint64_t longest_run_bound(uint32_t chunk) const;
  // A free block of at least `order` among the free buddies of the owner's latest
  // allocation's ancestors (its region): {page, order}, or {kNone, -1}.
  std::pair<uint32_t, int> near_latest(const OwnerState& owner, FunctionId id, int order) const;
  // What a shortfall proposes: the cheapest aligned region of 2^order pages to empty (unless
  // the advice was skipped).
  Shortfall make_shortfall(uint64_t bytes, uint32_t pages, int order, FunctionId owner,
                           const EvictablePredicate& evictable, EvictionAdvice advice);
  // The costs of a chunk's aligned regions of 2^order pages: pages[r], the pages of the live
  // allocations overlapping region r, and first[r], where a walk over the chunk's blocks that
  // meets all of them starts.
  struct ChunkRegions {
    uint64_t version = UINT64_MAX;  // live_versions_[chunk] when computed
    std::vector<uint64_t> pages;
    std::vector<uint32_t> first;
  };
  const ChunkRegions& regions(uint32_t chunk, int order);
  // Calls visit(first page, pages) for the live allocations of a chunk that overlap the
  // chunk-relative pages [begin, end), walking from `from` (at or before the first of them);
  // stops early when visit returns false.
  template <typename Visit>
  void for_each_allocation_in(uint32_t chunk, uint32_t from, uint64_t begin, uint64_t end,
                              Visit&& visit) const;
  uint64_t largest_free_bytes() const;

  BuddyOptions options_;
  int page_shift_;
  int max_order_;
  uint64_t shared_cache_limit_ = 0;

  std::vector<Chunk> chunks_;
  std::vector<uint32_t> heads_;     // [chunk * orders + order]
  std::vector<uint64_t> nonempty_;  // [order * words + chunk / 64]: list non-empty
  size_t nonempty_words_ = 0;
  std::vector<uint64_t> free_count_;  // free blocks per order

  // Per page of the whole pool.
  std::vector<int8_t> free_order_;  // order if the page heads a free block, else -1
  std::vector<uint32_t> next_;
  std::vector<uint32_t> prev_;
  std::vector<uint32_t> page_chunk_;
  std::vector<uint32_t> span_pages_;  // pages of the allocation starting here, else 0
  std::vector<FunctionId> span_owner_;
  std::vector<uint64_t> span_requested_;
  std::vector<uint8_t> span_cached_;  // the allocation sits in the sharing cache
  // One bit per page of the pool: the page lies in a free block. Free runs are read from it a
  // word (64 pages) at a time, where walking the chunk's blocks cost a step per block.
  std::vector<uint64_t> free_bits_;

  // Under memory pressure most requests take the slow paths (find_free_run, make_shortfall),
  // and few chunks change between two of them: what those paths compute per chunk is kept
  // until the chunk's version moves. Per chunk: free_versions_ moves whenever a free block is
  // pushed or removed (free runs), live_versions_ whenever a live allocation comes or goes
  // (region costs; flushing the sharing cache leaves it).
  std::vector<uint64_t> free_versions_;
  std::vector<uint64_t> live_versions_;
  std::vector<uint32_t> free_pages_;  // per chunk, in free blocks
  // The free runs of each chunk, {first page, pages} in page order, and the longest.
  struct ChunkRuns {
    uint64_t version = UINT64_MAX;
    uint32_t longest = 0;
    std::vector<std::pair<uint32_t, uint32_t>> runs;
  };
  std::vector<ChunkRuns> runs_;
  std::vector<ChunkRegions> regions_;  // [chunk * orders + order]

  std::vector<uint32_t> shared_pages_;               // pages of each shared size
  std::vector<std::vector<uint32_t>> shared_cache_;  // cached allocations' first pages, per size
  std::unordered_map<FunctionId, OwnerState> owners_;

  uint64_t capacity_pages_ = 0;
  uint64_t allocated_pages_ = 0;  // live allocations (not cached)
  uint64_t cached_pages_ = 0;
  uint64_t requested_bytes_ = 0;
  uint64_t live_allocations_ = 0;
  PoolStats counters_;
};

}  // namespace hiber::memory
