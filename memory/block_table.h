// One function's block table: the virtual blocks it allocated, and where each one is placed on
// each GPU (docs/design.md "Addresses"; the paper's §4.4 "memory address management").
//
// A virtual block is one allocation the function made: [va, va + bytes) inside the address
// range hiberd granted it at handshake, both multiples of the device's allocation granularity
// (2 MiB on every backend today; a parameter here). Per GPU a block has a Placement: the
// Allocations its GPU's pool gave it (each a chunk and an offset) and its Residency there. A
// block is one allocation of the pool when it fits the pool's largest block, and several
// (pieces, mapped back to back at the block's address) when it does not: a block is bounded by
// a GPU's memory, not by a chunk. Each block
// also carries its kind (model or scratch: what a swap copies) and a dirty bit (written on a GPU
// since its host copy was made; only stateful functions use it).
//
// Resolving pointers. Any pointer resolves to (block, offset):
//   - a pointer inside [va, va + bytes) resolves with offset = ptr - va (interior pointers and
//     views of a tensor are ordinary);
//   - a pointer exactly one past a block's end resolves to that block with offset == bytes, so
//     an end iterator or an empty view at the end of a tensor translates like its begin;
//   - a pointer equal to the start of block B belongs to B, even when block A ends there: the
//     one-past-the-end reading applies only where no block starts;
//   - anything else (outside the range, in a gap) is not found.
//
// The page map. Blocks are granule-aligned, so a page map indexed by
// (ptr - range_base) >> log2(granularity) finds a pointer's block in O(1): two dependent loads
// (root, leaf) and a third for the block, like tcmalloc's PageMap2. Bit budget: user addresses
// on x86-64 and CUDA's unified address space fit in 48 bits and the granule is 2 MiB (21 bits),
// so a page number within any range needs at most 48 - 21 = 27 bits. They split into
// kRootBits = 17 (the root: one pointer per leaf, allocated at construction for the range only:
// a 100 GiB grant needs 50 root entries) and kLeafBits = 10 (a leaf: 1024 block pointers, 8 KiB,
// covering 2 GiB of the range; allocated when a block first lands in it). A range of more than
// 2^27 granules is refused. Memory is 8 bytes per granule of the range that ever held a block.
//
// Thread safety: none. A session owns its table; const methods may run concurrently with each
// other but not with a mutation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <ranges>
#include <string>
#include <vector>

#include "common/status.h"
#include "memory/pool_allocator.h"
#include "memory/types.h"

namespace hiber::memory {

// A block's state on one GPU.
struct Placement {
  Residency residency = Residency::kEvicted;
  // From the GPU's pool, in address order: piece i backs the block from the sum of the bytes of
  // pieces 0..i-1 on (the last piece may hold more than the rest of the block). Empty when
  // residency == kEvicted.
  std::vector<Allocation> pieces;
  bool placed() const { return residency != Residency::kEvicted; }
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const Allocation& piece : pieces) total += piece.bytes;
    return total;
  }
};

struct VirtualBlock {
  uint64_t va = 0;
  uint64_t bytes = 0;
  BlockKind kind = BlockKind::kModel;
  bool dirty = false;
  std::vector<Placement> placements;  // by GPU ordinal
  uint64_t end() const { return va + bytes; }
  const Placement& on(int gpu) const { return placements[gpu]; }
};

// What a pointer resolved to. `block` is null when the pointer is in no block.
struct PointerTarget {
  const VirtualBlock* block = nullptr;
  uint64_t offset = 0;  // ptr - block->va; == block->bytes for a pointer one past the end
  bool found() const { return block != nullptr; }
};

struct ResidencyCount {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  friend bool operator==(const ResidencyCount&, const ResidencyCount&) = default;
};

// How much of the function is where on one GPU.
struct GpuResidency {
  ResidencyCount evicted;
  ResidencyCount loading;
  ResidencyCount resident;
  // Every block is resident: the function can run there without waiting.
  bool complete() const { return evicted.blocks == 0 && loading.blocks == 0; }
  friend bool operator==(const GpuResidency&, const GpuResidency&) = default;
};

class BlockTable {
 public:
  static constexpr int kLeafBits = 10;
  static constexpr int kRootBits = 17;
  static constexpr uint64_t kMaxPages = uint64_t{1} << (kRootBits + kLeafBits);

  // A table for the address range [range_base, range_base + range_bytes) on `gpu_count` GPUs.
  // kInvalidValue unless the granularity is a power of two, the range is a non-empty multiple
  // of it that neither wraps around nor exceeds kMaxPages granules, and gpu_count >= 1.
  static Result<BlockTable> create(uint64_t range_base, uint64_t range_bytes, uint64_t granularity,
                                   int gpu_count);

  BlockTable(BlockTable&&) = default;
  BlockTable& operator=(BlockTable&&) = default;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  uint64_t range_base() const { return range_base_; }
  uint64_t range_bytes() const { return range_bytes_; }
  uint64_t granularity() const { return uint64_t{1} << page_shift_; }
  int gpu_count() const { return gpu_count_; }

  // ---- Blocks ----
  // Records [va, va + bytes), evicted on every GPU, clean. kInvalidValue (and no change) for a
  // block that is empty, misaligned, outside the range or overlapping another.
  Status add(uint64_t va, uint64_t bytes, BlockKind kind);
  // Forgets the block that starts at `va` and returns it, so that the caller can give its
  // placements back to the pools. kInvalidValue if no block starts there.
  Result<VirtualBlock> remove(uint64_t va);
  // The block that starts exactly at `va`, or null.
  const VirtualBlock* block_at(uint64_t va) const;

  // ---- Pointers ----
  // The block and offset of `ptr` (the rules in the file comment).
  PointerTarget resolve(uint64_t ptr) const {
    const uint64_t rel = ptr - range_base_;
    if (rel > range_bytes_) return {};
    const uint64_t page = rel >> page_shift_;
    if (page < pages_) {
      if (const VirtualBlock* block = entry(page)) return {block, ptr - block->va};
    }
    // One past the end of the block before: only at a granule boundary, where nothing starts.
    if ((rel & page_mask_) == 0 && page > 0) {
      const VirtualBlock* before = entry(page - 1);
      if (before != nullptr && before->end() == ptr) return {before, before->bytes};
    }
    return {};
  }
  // [ptr, ptr + bytes) as the argument of a copy, memset or library call: it must lie inside
  // one block (bytes == 0 only needs `ptr` to resolve). kInvalidValue naming the range if not.
  Result<PointerTarget> resolve_range(uint64_t ptr, uint64_t bytes) const;

  // ---- Marks ----
  // kInvalidValue if no block starts at `va`.
  Status set_kind(uint64_t va, BlockKind kind);
  Status set_dirty(uint64_t va, bool dirty);

  // ---- Placements ----
  // Records that `gpu`'s pool placed the block in `pieces` (placement order, see Placement): it
  // is loading there until set_residency says it is resident. kInvalidValue for a bad GPU, an
  // unknown block, a block already placed there, no pieces, a piece (but the last) that is not
  // a multiple of the granularity, or pieces smaller than the block together.
  Status place(uint64_t va, int gpu, std::vector<Allocation> pieces);
  Status place(uint64_t va, int gpu, const Allocation& where) {
    return place(va, gpu, std::vector<Allocation>{where});
  }
  // kLoading or kResident for a placed block (its bytes are in flight again, or complete).
  // kInvalidValue otherwise; use unplace() to evict.
  Status set_residency(uint64_t va, int gpu, Residency residency);
  // Forgets the block's placement on `gpu` and returns its pieces, for the caller to give back
  // to the pool. kInvalidValue if it is not placed there.
  Result<std::vector<Allocation>> unplace(uint64_t va, int gpu);

  // ---- Iteration and summaries ----
  // Every block, in address order.
  auto blocks() const { return std::views::values(blocks_); }
  // The blocks of one kind, in address order.
  auto blocks(BlockKind kind) const {
    return blocks() | std::views::filter([kind](const VirtualBlock& b) { return b.kind == kind; });
  }
  size_t size() const { return blocks_.size(); }
  bool empty() const { return blocks_.empty(); }
  uint64_t total_bytes() const { return model_bytes_ + scratch_bytes_; }
  uint64_t model_bytes() const { return model_bytes_; }
  uint64_t scratch_bytes() const { return scratch_bytes_; }
  uint64_t dirty_bytes() const { return dirty_bytes_; }
  // kEvicted, kLoading and kResident blocks and bytes on `gpu`. REQUIRES: 0 <= gpu < gpu_count.
  const GpuResidency& residency(int gpu) const { return residency_[gpu]; }

  // Checks the page map, the counters and the summaries against the blocks; an error names the
  // first thing wrong. O(range pages + blocks): for tests.
  Status check_invariants() const;

 private:
  using Leaf = const VirtualBlock*[];
  BlockTable(uint64_t range_base, uint64_t range_bytes, int page_shift, int gpu_count);

  const VirtualBlock* entry(uint64_t page) const {
    const std::unique_ptr<Leaf>& leaf = root_[page >> kLeafBits];
    return leaf ? leaf[page & ((uint64_t{1} << kLeafBits) - 1)] : nullptr;
  }
  void set_pages(const VirtualBlock& block, const VirtualBlock* value);
  VirtualBlock* find_start(uint64_t va);
  ResidencyCount& count(int gpu, Residency residency);
  Status check_gpu(int gpu) const;

  uint64_t range_base_ = 0;
  uint64_t range_bytes_ = 0;
  int page_shift_ = 0;
  uint64_t page_mask_ = 0;
  uint64_t pages_ = 0;
  int gpu_count_ = 0;

  std::map<uint64_t, VirtualBlock>
      blocks_;  // by va; nodes stay put, so the page map points at them
  std::vector<std::unique_ptr<Leaf>> root_;
  uint64_t model_bytes_ = 0;
  uint64_t scratch_bytes_ = 0;
  uint64_t dirty_bytes_ = 0;
  std::vector<GpuResidency> residency_;
};

}  // namespace hiber::memory
