#include "memory/block_table.h"

#include <bit>
#include <iterator>
#include <utility>

namespace hiber::memory {

namespace {

Status no_block_at(uint64_t va) {
  return error(ErrorCode::kInvalidValue, "block table: no block starts at ", hex(va));
}

}  // namespace

Result<BlockTable> BlockTable::create(uint64_t range_base, uint64_t range_bytes,
                                      uint64_t granularity, int gpu_count) {
  if (gpu_count < 1) {
    return error(ErrorCode::kInvalidValue, "block table: ", gpu_count, " GPUs");
  }
  if (granularity == 0 || !std::has_single_bit(granularity)) {
    return error(ErrorCode::kInvalidValue, "block table: granularity ", granularity,
                 " is not a power of two");
  }
  if (range_bytes == 0 || range_base % granularity != 0 || range_bytes % granularity != 0) {
    return error(ErrorCode::kInvalidValue, "block table: range [", hex(range_base), ", +",
                 range_bytes, ") is empty or not aligned to the granularity ", granularity);
  }
  if (range_bytes > UINT64_MAX - range_base) {
    return error(ErrorCode::kInvalidValue, "block table: range [", hex(range_base), ", +",
                 range_bytes, ") wraps around");
  }
  if (range_bytes / granularity > kMaxPages) {
    return error(ErrorCode::kInvalidValue, "block table: range of ", range_bytes / granularity,
                 " granules; the page map holds at most ", kMaxPages);
  }
  return BlockTable(range_base, range_bytes, std::countr_zero(granularity), gpu_count);
}

BlockTable::BlockTable(uint64_t range_base, uint64_t range_bytes, int page_shift, int gpu_count)
    : range_base_(range_base),
      range_bytes_(range_bytes),
      page_shift_(page_shift),
      page_mask_((uint64_t{1} << page_shift) - 1),
      pages_(range_bytes >> page_shift),
      gpu_count_(gpu_count),
      root_(((range_bytes >> page_shift) + (uint64_t{1} << kLeafBits) - 1) >> kLeafBits),
      residency_(gpu_count) {}

void BlockTable::set_pages(const VirtualBlock& block, const VirtualBlock* value) {
  const uint64_t first = (block.va - range_base_) >> page_shift_;
  const uint64_t last = (block.end() - range_base_) >> page_shift_;
  constexpr uint64_t kLeafSize = uint64_t{1} << kLeafBits;
  for (uint64_t page = first; page < last; ++page) {
    std::unique_ptr<Leaf>& leaf = root_[page >> kLeafBits];
    if (!leaf) leaf = std::make_unique<Leaf>(kLeafSize);
    leaf[page & (kLeafSize - 1)] = value;
  }
}

VirtualBlock* BlockTable::find_start(uint64_t va) {
  auto it = blocks_.find(va);
  return it == blocks_.end() ? nullptr : &it->second;
}

const VirtualBlock* BlockTable::block_at(uint64_t va) const {
  auto it = blocks_.find(va);
  return it == blocks_.end() ? nullptr : &it->second;
}

ResidencyCount& BlockTable::count(int gpu, Residency residency) {
  GpuResidency& summary = residency_[gpu];
  switch (residency) {
    case Residency::kEvicted: return summary.evicted;
    case Residency::kLoading: return summary.loading;
    case Residency::kResident: break;
  }
  return summary.resident;
}

Status BlockTable::check_gpu(int gpu) const {
  if (gpu < 0 || gpu >= gpu_count_) {
    return error(ErrorCode::kInvalidValue, "block table: GPU ", gpu, " of ", gpu_count_);
  }
  return Status();
}

Status BlockTable::add(uint64_t va, uint64_t bytes, BlockKind kind) {
  const uint64_t rel = va - range_base_;
  if (bytes == 0 || ((va | bytes) & page_mask_) != 0 || va < range_base_ || rel > range_bytes_ ||
      bytes > range_bytes_ - rel) {
    return error(ErrorCode::kInvalidValue, "block table: block [", hex(va), ", +", bytes,
                 ") is empty, not aligned to ", granularity(), " or outside the range [",
                 hex(range_base_), ", +", range_bytes_, ")");
  }
  auto next = blocks_.lower_bound(va);
  const VirtualBlock* clash = nullptr;
  if (next != blocks_.end() && next->first < va + bytes) clash = &next->second;
  if (next != blocks_.begin() && std::prev(next)->second.end() > va)
    clash = &std::prev(next)->second;
  if (clash != nullptr) {
    return error(ErrorCode::kInvalidValue, "block table: block [", hex(va), ", +", bytes,
                 ") overlaps the block [", hex(clash->va), ", +", clash->bytes, ")");
  }
  auto it = blocks_.emplace_hint(next, va, VirtualBlock{va, bytes, kind, false, {}});
  VirtualBlock& block = it->second;
  block.placements.resize(gpu_count_);
  set_pages(block, &block);
  (kind == BlockKind::kModel ? model_bytes_ : scratch_bytes_) += bytes;
  for (GpuResidency& summary : residency_) {
    ++summary.evicted.blocks;
    summary.evicted.bytes += bytes;
  }
  return Status();
}

Result<VirtualBlock> BlockTable::remove(uint64_t va) {
  auto it = blocks_.find(va);
  if (it == blocks_.end()) {
    return no_block_at(va);
  }
  const VirtualBlock& block = it->second;
  set_pages(block, nullptr);
  (block.kind == BlockKind::kModel ? model_bytes_ : scratch_bytes_) -= block.bytes;
  if (block.dirty) dirty_bytes_ -= block.bytes;
  for (int gpu = 0; gpu < gpu_count_; ++gpu) {
    ResidencyCount& counted = count(gpu, block.placements[gpu].residency);
    --counted.blocks;
    counted.bytes -= block.bytes;
  }
  return std::move(blocks_.extract(it).mapped());
}

Result<PointerTarget> BlockTable::resolve_range(uint64_t ptr, uint64_t bytes) const {
  const PointerTarget target = resolve(ptr);
  if (!target.found()) {
    return error(ErrorCode::kInvalidValue, "address ", hex(ptr), " is in no block of the function");
  }
  if (bytes > target.block->bytes - target.offset) {
    return error(ErrorCode::kInvalidValue, "range [", hex(ptr), ", +", bytes,
                 ") runs past the end of its block [", hex(target.block->va), ", +",
                 target.block->bytes, ")");
  }
  return target;
}

Status BlockTable::set_kind(uint64_t va, BlockKind kind) {
  VirtualBlock* block = find_start(va);
  if (block == nullptr) return no_block_at(va);
  if (block->kind != kind) {
    (block->kind == BlockKind::kModel ? model_bytes_ : scratch_bytes_) -= block->bytes;
    (kind == BlockKind::kModel ? model_bytes_ : scratch_bytes_) += block->bytes;
    block->kind = kind;
  }
  return Status();
}

Status BlockTable::set_dirty(uint64_t va, bool dirty) {
  VirtualBlock* block = find_start(va);
  if (block == nullptr) return no_block_at(va);
  if (block->dirty != dirty) {
    if (dirty) {
      dirty_bytes_ += block->bytes;
    } else {
      dirty_bytes_ -= block->bytes;
    }
    block->dirty = dirty;
  }
  return Status();
}

Status BlockTable::place(uint64_t va, int gpu, std::vector<Allocation> pieces) {
  HIBER_RETURN_IF_ERROR(check_gpu(gpu));
  VirtualBlock* block = find_start(va);
  if (block == nullptr) return no_block_at(va);
  Placement& placement = block->placements[gpu];
  if (placement.placed()) {
    return error(ErrorCode::kInvalidValue, "block table: block ", hex(va),
                 " is already placed on GPU ", gpu, " (in ", placement.pieces.size(), " pieces)");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i + 1 < pieces.size() && (pieces[i].bytes & page_mask_) != 0) {
      return error(ErrorCode::kInvalidValue, "block table: piece ", i, " of block ", hex(va),
                   " holds ", pieces[i].bytes, " bytes, not a multiple of the granularity");
    }
    total += pieces[i].bytes;
  }
  if (pieces.empty() || total < block->bytes) {
    return error(ErrorCode::kInvalidValue, "block table: ", pieces.size(), " allocations of ",
                 total, " bytes cannot hold block ", hex(va), " of ", block->bytes);
  }
  placement = Placement{Residency::kLoading, std::move(pieces)};
  --residency_[gpu].evicted.blocks;
  residency_[gpu].evicted.bytes -= block->bytes;
  ++residency_[gpu].loading.blocks;
  residency_[gpu].loading.bytes += block->bytes;
  return Status();
}

Status BlockTable::set_residency(uint64_t va, int gpu, Residency residency) {
  HIBER_RETURN_IF_ERROR(check_gpu(gpu));
  VirtualBlock* block = find_start(va);
  if (block == nullptr) return no_block_at(va);
  Placement& placement = block->placements[gpu];
  if (residency == Residency::kEvicted || !placement.placed()) {
    return error(ErrorCode::kInvalidValue, "block table: block ", hex(va), " on GPU ", gpu,
                 residency == Residency::kEvicted ? ": evict with unplace()" : " is not placed");
  }
  ResidencyCount& from = count(gpu, placement.residency);
  --from.blocks;
  from.bytes -= block->bytes;
  ResidencyCount& to = count(gpu, residency);
  ++to.blocks;
  to.bytes += block->bytes;
  placement.residency = residency;
  return Status();
}

Result<std::vector<Allocation>> BlockTable::unplace(uint64_t va, int gpu) {
  HIBER_RETURN_IF_ERROR(check_gpu(gpu));
  VirtualBlock* block = find_start(va);
  if (block == nullptr) return no_block_at(va);
  Placement& placement = block->placements[gpu];
  if (!placement.placed()) {
    return error(ErrorCode::kInvalidValue, "block table: block ", hex(va), " is not placed on GPU ",
                 gpu);
  }
  ResidencyCount& from = count(gpu, placement.residency);
  --from.blocks;
  from.bytes -= block->bytes;
  ++residency_[gpu].evicted.blocks;
  residency_[gpu].evicted.bytes += block->bytes;
  std::vector<Allocation> pieces = std::move(placement.pieces);
  placement = Placement{};
  return pieces;
}

Status BlockTable::check_invariants() const {
  uint64_t page = 0, model = 0, scratch = 0, dirty = 0;
  std::vector<GpuResidency> residency(gpu_count_);
  uint64_t previous_end = range_base_;
  for (const auto& [va, block] : blocks_) {
    if (va != block.va || block.bytes == 0 || ((va | block.bytes) & page_mask_) != 0 ||
        va < previous_end || block.end() > range_base_ + range_bytes_) {
      return error(ErrorCode::kIllegalState, "block table: block [", block.va, ", +", block.bytes,
                   ") (key ", va, ") is misaligned, overlapping or outside the range");
    }
    previous_end = block.end();
    const uint64_t first = (va - range_base_) >> page_shift_;
    const uint64_t last = (block.end() - range_base_) >> page_shift_;
    for (; page < last; ++page) {
      const VirtualBlock* expected = page < first ? nullptr : &block;
      if (entry(page) != expected) {
        return error(ErrorCode::kIllegalState, "block table: page ", page, " maps to ",
                     entry(page) == nullptr ? "nothing" : "the wrong block", " (block ", va, ")");
      }
    }
    (block.kind == BlockKind::kModel ? model : scratch) += block.bytes;
    if (block.dirty) dirty += block.bytes;
    if (block.placements.size() != static_cast<size_t>(gpu_count_)) {
      return error(ErrorCode::kIllegalState, "block table: block ", va, " has ",
                   block.placements.size(), " placements");
    }
    for (int gpu = 0; gpu < gpu_count_; ++gpu) {
      const Placement& placement = block.placements[gpu];
      if (placement.placed() ? placement.bytes() < block.bytes : !placement.pieces.empty()) {
        return error(ErrorCode::kIllegalState, "block table: block ", va, " on GPU ", gpu,
                     " is placed in ", placement.bytes(), " bytes");
      }
      GpuResidency& summary = residency[gpu];
      ResidencyCount& counted = placement.residency == Residency::kEvicted   ? summary.evicted
                                : placement.residency == Residency::kLoading ? summary.loading
                                                                             : summary.resident;
      ++counted.blocks;
      counted.bytes += block.bytes;
    }
  }
  for (; page < pages_; ++page) {
    if (entry(page) != nullptr) {
      return error(ErrorCode::kIllegalState, "block table: page ", page,
                   " outside every block maps to one");
    }
  }
  if (model != model_bytes_ || scratch != scratch_bytes_ || dirty != dirty_bytes_) {
    return error(ErrorCode::kIllegalState, "block table: model/scratch/dirty bytes ", model, "/",
                 scratch, "/", dirty, ", counted ", model_bytes_, "/", scratch_bytes_, "/",
                 dirty_bytes_);
  }
  for (int gpu = 0; gpu < gpu_count_; ++gpu) {
    if (!(residency[gpu] == residency_[gpu])) {
      return error(ErrorCode::kIllegalState, "block table: residency summary of GPU ", gpu,
                   " is off");
    }
  }
  return Status();
}

}  // namespace hiber::memory
