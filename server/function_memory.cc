#include "server/function_memory.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include <glog/logging.h>

namespace hiber::server {
namespace {

using memory::BlockKind;
using memory::Residency;
using memory::VirtualBlock;

// Bounds what one function may create, so a client cannot exhaust the server's memory.
constexpr size_t kMaxBlocks = 1 << 16;
// How often a placement asks for room before it gives up: eviction frees bytes, not always a
// region large enough in one piece, so it may take more than one round.
constexpr int kRoomAttempts = 8;

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Appends the map calls that show `block`'s placement on `gpu` at `at`.
void append_calls_for(const VirtualBlock& block, int gpu, uint64_t at,
                      std::vector<memory::MapCall>* calls) {
  for (const memory::MapCall& call : memory::block_map_calls(block, gpu, at)) {
    calls->push_back(call);
  }
}

}  // namespace

Result<std::shared_ptr<FunctionMemory>> FunctionMemory::create(
    device::Device& device, DevicePools& pools, ModelRepository& repository,
    memory::FunctionId owner, uint64_t va_bytes, uint64_t quota_bytes,
    const FunctionMemoryOptions& options, std::optional<device::DevicePtr> reserved) {
  const uint64_t granularity = device.allocation_granularity(0);
  const uint64_t bytes = round_up(std::max<uint64_t>(va_bytes, granularity), granularity);
  device::DevicePtr base = 0;
  if (reserved) {
    base = *reserved;
  } else {
    HIBER_ASSIGN_OR_RETURN(base, device.reserve_address_range(bytes, granularity));
  }
  Result<memory::BlockTable> table =
      memory::BlockTable::create(base, bytes, granularity, device.gpu_count());
  if (!table.ok()) {
    (void)device.free_address_range(base, bytes);
    return table.status();
  }
  return std::shared_ptr<FunctionMemory>(new FunctionMemory(
      device, pools, repository, owner, std::move(*table), quota_bytes, options));
}

FunctionMemory::FunctionMemory(device::Device& device, DevicePools& pools,
                               ModelRepository& repository, memory::FunctionId owner,
                               memory::BlockTable table, uint64_t quota_bytes,
                               const FunctionMemoryOptions& options)
    : device_(device),
      pools_(pools),
      repository_(repository),
      owner_(owner),
      va_base_(table.range_base()),
      va_bytes_(table.range_bytes()),
      granularity_(table.granularity()),
      quota_bytes_(quota_bytes),
      options_(options),
      gpu_count_(device.gpu_count()),
      table_(std::move(table)),
      swap_(device, device.gpu_count(), options.group_bytes) {}

uint64_t FunctionMemory::largest_allocation() const {
  uint64_t largest = 0;
  for (int gpu = 0; gpu < pools_.pools().gpu_count(); ++gpu) {
    const uint64_t here = pools_.pools().stats(gpu).capacity_bytes;
    largest = gpu == 0 ? here : std::min(largest, here);
  }
  return std::min(largest, quota_bytes_);
}

FunctionMemory::~FunctionMemory() {
  release_all();
  Status freed = device_.free_address_range(va_base_, va_bytes_);
  LOG_IF(ERROR, !freed.ok()) << "function memory " << owner_ << ": " << freed;
}

std::vector<uint64_t> FunctionMemory::block_starts() const {
  std::vector<uint64_t> starts;
  starts.reserve(table_.size());
  for (const VirtualBlock& block : table_.blocks()) starts.push_back(block.va);
  return starts;
}

// ---- Blocks ----

Status FunctionMemory::add_block(uint64_t va, uint64_t bytes, std::optional<GpuId> lease_gpu,
                                 const RoomMaker& room) {
  MutexLock lock(mutex_);
  if (bytes == 0) return error(ErrorCode::kInvalidValue, "an allocation of 0 bytes");
  if (bytes > va_bytes_) {
    return error(ErrorCode::kOutOfMemory, "an allocation of ", bytes,
                 " bytes is larger than the session's address range");
  }
  const uint64_t rounded = round_up(bytes, granularity_);
  if (table_.size() >= kMaxBlocks) {
    return error(ErrorCode::kOutOfMemory, "more than ", kMaxBlocks, " allocations");
  }
  const uint64_t in_use = table_.total_bytes();
  if (rounded > quota_bytes_ || in_use > quota_bytes_ - rounded) {
    return error(ErrorCode::kOutOfMemory, "an allocation of ", rounded,
                 " bytes exceeds the quota: ", in_use, " of ", quota_bytes_, " bytes in use");
  }
  // Before the first request every block is model (and dirty: its contents exist only on the
  // GPU); after it, only a stateful function's.
  const bool model = !model_fixed_ || options_.stateful;
  HIBER_RETURN_IF_ERROR(table_.add(va, rounded, model ? BlockKind::kModel : BlockKind::kScratch)
                            .with_context("allocation"));
  if (model) (void)table_.set_dirty(va, true);
  extra_[va] = Extra{};
  if (!lease_gpu) return Status();
  // Under a lease: placed and mapped on the lease's GPU at once.
  const int gpu = lease_gpu->value();
  Status placed = place(va, gpu, room);
  if (placed.ok()) {
    const VirtualBlock* block = table_.block_at(va);
    (void)table_.set_residency(va, gpu, Residency::kResident);
    extra_[va].fresh = false;
    std::vector<memory::MapCall> calls;
    append_calls_for(*block, gpu, va, &calls);
    placed = map_calls(calls, gpu, &mapped_);
  }
  if (!placed.ok() && table_.block_at(va) != nullptr) {
    for (int g = 0; g < gpu_count_; ++g) free_placement(va, g);
    (void)table_.remove(va);
    extra_.erase(va);
  }
  return placed;
}

bool FunctionMemory::is_block(uint64_t va) const {
  MutexLock lock(mutex_);
  return table_.block_at(va) != nullptr;
}

Status FunctionMemory::remove_block(uint64_t va) {
  MutexLock copies(copies_mutex_);
  MutexLock lock(mutex_);
  if (table_.block_at(va) == nullptr) {
    return error(ErrorCode::kInvalidValue, "free of ", hex(va), ": not the start of an allocation");
  }
  Status result;
  // Mapped at its own address under a lease: those mappings go first. A map call may hold
  // several blocks, and a block in pieces is several map calls: unmap every call that overlaps
  // the block whole, and map the other blocks in them back.
  const uint64_t end = table_.block_at(va)->end();
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  std::erase_if(mapped_, [&](const auto& m) {
    if (m.first >= end || m.first + m.second <= va) return false;
    runs.push_back(m);
    return true;
  });
  for (const auto& [run_va, run_bytes] : runs) {
    if (Status unmapped = device_.unmap(run_va, run_bytes); !unmapped.ok() && result.ok()) {
      result = unmapped;
    }
  }
  if (result.ok() && bound_gpu_ && !runs.empty()) {
    // A run is a union of whole pieces, so each piece of another block lies in it or not.
    std::vector<memory::MapCall> back;
    for (const VirtualBlock& b : table_.blocks()) {
      if (b.va == va || !b.on(*bound_gpu_).placed()) continue;
      for (const memory::MapCall& call : memory::block_map_calls(b, *bound_gpu_, b.va)) {
        for (const auto& [run_va, run_bytes] : runs) {
          if (call.va >= run_va && call.va + call.bytes <= run_va + run_bytes) {
            back.push_back(call);
          }
        }
      }
    }
    result = map_calls(back, *bound_gpu_, &mapped_);
  }
  for (int g = 0; g < gpu_count_; ++g) free_placement(va, g);
  repository_.release(extra_[va].host);
  extra_.erase(va);
  (void)table_.remove(va);
  std::erase(access_order_, va);
  std::erase(loading_, va);
  return result;
}

Status FunctionMemory::check_range(uint64_t ptr, uint64_t bytes, std::string_view what) const {
  MutexLock lock(mutex_);
  if (blocks_spanned(ptr, bytes, nullptr)) return Status();
  return error(ErrorCode::kInvalidValue, what, ": [", hex(ptr), ", +", bytes,
               ") is not inside the session's allocations (one, or several back to back)");
}

bool FunctionMemory::blocks_spanned(uint64_t ptr, uint64_t bytes,
                                    std::vector<const VirtualBlock*>* blocks) const {
  const memory::PointerTarget target = table_.resolve(ptr);
  if (!target.found() || target.offset >= target.block->bytes) return false;
  const VirtualBlock* block = target.block;
  uint64_t left = bytes;
  uint64_t offset = target.offset;
  while (true) {
    if (blocks) blocks->push_back(block);
    const uint64_t here = block->bytes - offset;
    if (left <= here) return true;
    // Mapped back to back (client virtual memory maps a range from several allocations): the
    // range may go on into the block that starts where this one ends.
    left -= here;
    block = table_.block_at(block->end());
    if (block == nullptr) return false;
    offset = 0;
  }
}

uint64_t FunctionMemory::allocated_bytes() const {
  MutexLock lock(mutex_);
  return table_.total_bytes();
}

// ---- Placement and mapping ----

Status FunctionMemory::place(uint64_t va, int gpu, const RoomMaker& room) {
  std::vector<memory::Allocation> pieces;
  auto give_back = [&]() REQUIRES(mutex_) {
    for (const memory::Allocation& piece : pieces) (void)pools_.pools().deallocate(gpu, piece);
  };
  int attempt = 0;
  while (true) {
    const VirtualBlock* block = table_.block_at(va);
    if (block == nullptr) {
      give_back();
      return error(ErrorCode::kInvalidValue, "the allocation at ", hex(va), " was freed");
    }
    if (block->on(gpu).placed()) {
      give_back();
      return Status();
    }
    uint64_t covered = 0;
    for (const memory::Allocation& piece : pieces) covered += piece.bytes;
    if (covered >= block->bytes) {
      Status recorded = table_.place(va, gpu, pieces);
      if (!recorded.ok()) give_back();
      return recorded;
    }
    // A block larger than the pool's largest block is placed in pieces of that size (granule
    // multiples: the pool's blocks are), mapped back to back.
    const uint64_t largest = pools_.pools().stats(gpu).max_block_bytes;
    const uint64_t remaining = block->bytes - covered;
    const uint64_t bytes = largest >= remaining || largest < granularity_
                               ? remaining
                               : largest / granularity_ * granularity_;
    memory::AllocationResult placed = pools_.pools().allocate(gpu, bytes, owner_);
    if (placed.ok()) {
      pieces.push_back(*placed);
      continue;
    }
    const memory::Shortfall shortfall = placed.shortfall();
    if (shortfall.never_fits || attempt == kRoomAttempts || !room) {
      give_back();
      return error(ErrorCode::kOutOfMemory, "GPU ", gpu, ": ", shortfall.describe());
    }
    ++attempt;
    Status made;
    {
      MutexUnlock unlocked(mutex_);
      made = room(GpuId{gpu}, shortfall);
    }
    if (!made.ok()) {
      give_back();
      return made.with_context(str_cat("placing ", bytes, " bytes on GPU ", gpu));
    }
  }
}

void FunctionMemory::free_placement(uint64_t va, int gpu) {
  const VirtualBlock* block = table_.block_at(va);
  if (block == nullptr || !block->on(gpu).placed()) return;
  Result<std::vector<memory::Allocation>> pieces = table_.unplace(va, gpu);
  if (!pieces.ok()) {
    LOG(ERROR) << "function memory " << owner_ << ": " << pieces.status();
    return;
  }
  for (const memory::Allocation& piece : *pieces) {
    // Before the range goes back: once it has, another function may own it.
    if (auto chunk = pools_.physical(gpu, piece.where.chunk); chunk.ok()) {
      device_.discard_physical(*chunk, piece.where.offset, piece.bytes);
    }
    Status freed = pools_.pools().deallocate(gpu, piece);
    LOG_IF(ERROR, !freed.ok()) << "function memory " << owner_ << ": " << freed;
  }
}

Status FunctionMemory::map_blocks(int gpu, const memory::BlockFilter& include) {
  HIBER_ASSIGN_OR_RETURN(memory::MapPlan plan, memory::plan_mapping(table_, gpu, include));
  return map_calls(plan.calls, gpu, &mapped_);
}

Status FunctionMemory::map_calls(const std::vector<memory::MapCall>& calls, int gpu,
                                 std::vector<std::pair<uint64_t, uint64_t>>* mapped) {
  const int gpus[] = {gpu};
  for (const memory::MapCall& call : calls) {
    HIBER_ASSIGN_OR_RETURN(device::PhysicalMemory memory, pools_.physical(gpu, call.chunk));
    HIBER_RETURN_IF_ERROR(device_.map(call.va, call.bytes, memory, call.chunk_offset));
    mapped->emplace_back(call.va, call.bytes);
    HIBER_RETURN_IF_ERROR(device_.set_access(call.va, call.bytes, gpus));
  }
  return Status();
}

void FunctionMemory::unmap_all(std::vector<std::pair<uint64_t, uint64_t>>& mapped) {
  for (const auto& [va, bytes] : mapped) {
    Status unmapped = device_.unmap(va, bytes);
    LOG_IF(ERROR, !unmapped.ok()) << "function memory " << owner_ << ": " << unmapped;
  }
  mapped.clear();
}

void FunctionMemory::retire(Window& window) {
  unmap_all(window.mapped);
  (void)device_.free_address_range(window.va, window.bytes);
}

void FunctionMemory::unmap_bound() {
  unmap_all(mapped_);
  bound_gpu_.reset();
}

Status FunctionMemory::make_host_copy(uint64_t va, uint64_t bytes) {
  Extra& extra = extra_[va];
  if (!extra.host) {
    HIBER_ASSIGN_OR_RETURN(extra.host, repository_.allocate(owner_, bytes));
  }
  return Status();
}

void FunctionMemory::wait_for_readers(int gpu) {
  const bool read_here = std::any_of(windows_.begin(), windows_.end(),
                                     [gpu](const Window& w) { return w.gpu == gpu; });
  if (!read_here || swap_.complete() || !loading_gpu_ || swap_.groups() == 0) return;
  Status waited = device_.synchronize_event(swap_.group_event(*loading_gpu_, swap_.groups() - 1));
  LOG_IF(WARNING, !waited.ok()) << "function memory " << owner_ << ": waiting for the peer copies "
                                << "from GPU " << gpu << ": " << waited;
}

void FunctionMemory::settle() {
  if (loading_.empty() || !swap_.complete() || !loading_gpu_) return;
  const int gpu = *loading_gpu_;
  if (swap_.failed()) {
    LOG(WARNING) << "function memory " << owner_ << ": a swap onto GPU " << gpu << " failed; its "
                 << loading_.size() << " blocks stay invalid there";
  } else {
    for (uint64_t va : loading_) {
      const VirtualBlock* block = table_.block_at(va);
      if (block != nullptr && block->on(gpu).placed()) {
        (void)table_.set_residency(va, gpu, Residency::kResident);
      }
    }
  }
  loading_.clear();
  loading_gpu_.reset();
}

// ---- Leases ----

Status FunctionMemory::bind(const Lease& lease, device::Stream swap_stream, SwapDone on_done,
                            const RoomMaker& room) {
  MutexLock lock(mutex_);
  if (lease.gpus.size() != 1) {
    return error(ErrorCode::kInvalidValue, "bind to GPUs ", lease.gpus,
                 ": a function's memory is bound to one GPU at a time");
  }
  const int gpu = lease.gpus.first().value();
  if (bound_gpu_) {
    return error(ErrorCode::kIllegalState, "bind to GPU ", gpu, " while bound to GPU ",
                 *bound_gpu_);
  }
  settle();
  // 1. Every block gets a place on the GPU (scratch too: re-placed, not copied), and scratch
  //    placed elsewhere goes (its contents mean nothing between requests).
  std::vector<uint64_t> vas = block_starts();
  for (uint64_t va : vas) {
    if (table_.block_at(va)->kind != BlockKind::kScratch) continue;
    for (int g = 0; g < gpu_count_; ++g) {
      if (g != gpu) free_placement(va, g);
    }
  }
  // Largest first: a buddy pool keeps a large block's region whole only if small ones have not
  // been scattered into it yet.
  std::stable_sort(vas.begin(), vas.end(), [this](uint64_t a, uint64_t b) REQUIRES(mutex_) {
    return table_.block_at(a)->bytes > table_.block_at(b)->bytes;
  });
  for (uint64_t va : vas) {
    Status placed = place(va, gpu, room);
    if (!placed.ok()) return placed.with_context("binding");
  }
  // place() drops the lock while room is made; a block freed meanwhile is simply gone (the
  // session serialises frees with binds, so this is defence only).
  for (uint64_t va : block_starts()) {
    const VirtualBlock& block = *table_.block_at(va);
    if (block.kind == BlockKind::kScratch && !resident(block, gpu)) {
      (void)table_.set_residency(va, gpu, Residency::kResident);
    }
  }
  // 2. Map them at their own addresses, accessible from this GPU only.
  Status mapped = map_blocks(gpu, {});
  if (!mapped.ok()) {
    unmap_all(mapped_);
    return mapped.with_context("mapping");
  }
  bound_gpu_ = gpu;

  // 3. What must travel: model blocks not resident here, in the order the function first used
  //    them (so early groups are what early kernels need), then the rest. Each comes from the
  //    lease's source GPU if it is resident there, else from its host copy, else (no clean host
  //    copy: state, or a model before its first request) from any GPU where it is resident.
  std::vector<uint64_t> order;
  for (uint64_t va : access_order_) {
    if (table_.block_at(va) != nullptr) order.push_back(va);
  }
  for (const VirtualBlock& block : table_.blocks(BlockKind::kModel)) {
    if (!extra_[block.va].ordered) {
      order.push_back(block.va);
    }
  }
  struct Move {
    uint64_t va = 0;
    int from = -1;        // a GPU, or -1 for the host copy
    uint64_t window = 0;  // where the source is mapped for the copy
  };
  std::vector<Move> moving;
  std::map<int, uint64_t> peer_bytes;  // per source GPU
  for (uint64_t va : order) {
    const VirtualBlock& block = *table_.block_at(va);
    Extra& extra = extra_[va];
    extra.group = -1;
    if (extra.fresh) {
      // Allocated between leases and never used: nothing to bring, its place is its home.
      extra.fresh = false;
      (void)table_.set_residency(va, gpu, Residency::kResident);
      continue;
    }
    if (block.kind != BlockKind::kModel || resident(block, gpu)) continue;
    int from = -1;
    auto resident_on = [&](int g) { return g >= 0 && g != gpu && resident(block, g); };
    if (lease.source == scheduler::Source::kPeer && lease.source_gpu &&
        resident_on(lease.source_gpu->value())) {
      from = lease.source_gpu->value();
    } else if (!extra.host || block.dirty) {
      for (int g = 0; g < gpu_count_ && from < 0; ++g) {
        if (resident_on(g)) from = g;
      }
      if (from < 0) {
        unmap_bound();
        return error(ErrorCode::kIllegalState, "the block at ", hex(va),
                     " has no valid copy on the host or on any GPU");
      }
    }
    if (from >= 0) peer_bytes[from] += block.bytes;
    moving.push_back(Move{va, from, 0});
  }

  // A peer copy reads its source through a window mapped for the copy only.
  for (const auto& [from, bytes] : peer_bytes) {
    Window window;
    window.gpu = from;
    auto reserved = device_.reserve_address_range(bytes, granularity_);
    if (!reserved.ok()) {
      unmap_bound();
      return reserved.status().with_context("a window for a peer copy");
    }
    window.va = *reserved;
    window.bytes = bytes;
    std::vector<memory::MapCall> pieces;
    uint64_t offset = 0;
    for (Move& m : moving) {
      if (m.from != from) continue;
      const VirtualBlock& block = *table_.block_at(m.va);
      m.window = window.va + offset;
      append_calls_for(block, from, m.window, &pieces);
      offset += block.bytes;
    }
    Status windowed = map_calls(pieces, from, &window.mapped);
    windows_.push_back(std::move(window));
    if (!windowed.ok()) {
      unmap_bound();
      return windowed.with_context("mapping a peer copy's source");
    }
  }

  // 4. The transfers, in groups of the elbow size, an event after each (server/swap_engine.h).
  //    The moved blocks are loading until the swap's callback says it ended (settle()).
  std::vector<SwapEngine::Transfer> transfers;
  transfers.reserve(moving.size());
  bound_swap_bytes_ = 0;
  for (const Move& m : moving) bound_swap_bytes_ += table_.block_at(m.va)->bytes;
  for (const Move& m : moving) {
    SwapEngine::Transfer t{.dst = m.va, .bytes = table_.block_at(m.va)->bytes};
    if (m.from >= 0) {
      t.from_gpu = m.from;
      t.from_va = m.window;
    } else {
      t.host = extra_[m.va].host.data;
    }
    transfers.push_back(t);
  }
  loading_.clear();
  loading_gpu_ = gpu;
  tracking_ = lease.first_request;
  Result<std::vector<int32_t>> groups = swap_.start(gpu, swap_stream, transfers);
  Status enqueued = groups.status();
  for (size_t i = 0; groups.ok() && i < moving.size(); ++i) {
    extra_[moving[i].va].group = (*groups)[i];
    loading_.push_back(moving[i].va);
  }

  // 5. The first request fixes the model: every block so far is model, and dirty ones get a
  //    host copy (read after the swap, on the same stream), so the host copy is authoritative
  //    from now on. The copies finish before the request runs (the session waits here): the
  //    request may write into its model blocks, and the host copy must be the model as it was.
  if (enqueued.ok() && lease.first_request && !model_fixed_) {
    model_fixed_ = true;
    for (const VirtualBlock& block : table_.blocks(BlockKind::kModel)) {
      if (!block.dirty) continue;
      enqueued = make_host_copy(block.va, block.bytes);
      if (enqueued.ok()) {
        enqueued = device_.copy_device_to_host(swap_stream, extra_[block.va].host.data, block.va,
                                               block.bytes);
      }
      if (!enqueued.ok()) break;
    }
    if (enqueued.ok()) enqueued = device_.synchronize_stream(swap_stream);
    // Clean now. From now on a plain function's model blocks are read-only to it (not swapped
    // back, not tracked dirty); a stateful function's blocks stay swapped both ways.
    if (enqueued.ok()) {
      for (uint64_t va : block_starts()) (void)table_.set_dirty(va, false);
    }
  }
  if (!enqueued.ok()) {
    // Nothing of this swap may be trusted: the moved blocks stay loading (invalid here), and
    // the session drains its stream and unbinds.
    loading_.clear();
    return enqueued.with_context("starting the swap");
  }
  // Without pipelining every use waits for the last group.
  if (!options_.pipelined && swap_.groups() > 0) {
    for (auto& [va, extra] : extra_) extra.group = swap_.groups() - 1;
  }
  if (moving.empty() && !lease.first_request) {
    lock.unlock();
    on_done(Status(), SwapReport{});
    return Status();
  }
  // The end of the swap, reported from the device's callback thread.
  return swap_.report_end(swap_stream, std::move(on_done));
}

uint64_t FunctionMemory::bound_swap_bytes() const {
  MutexLock lock(mutex_);
  return bound_swap_bytes_;
}

Status FunctionMemory::unbind() {
  MutexLock lock(mutex_);
  settle();
  tracking_ = false;
  for (auto& [va, extra] : extra_) extra.group = -1;
  unmap_bound();
  for (Window& w : windows_) retire(w);
  windows_.clear();
  return Status();
}

void FunctionMemory::retire_windows() {
  MutexLock lock(mutex_);
  if (!swap_.complete()) return;
  for (Window& w : windows_) retire(w);
  windows_.clear();
}

void FunctionMemory::note(const VirtualBlock& block, bool write,
                          std::vector<device::Event>* waits) {
  Extra& extra = extra_[block.va];
  if (tracking_ && block.kind == BlockKind::kModel && !extra.ordered) {
    extra.ordered = true;
    access_order_.push_back(block.va);
  }
  // Writes matter only where the GPU copy may be newer than the host's: state, and everything
  // of a function before its first request. A plain function's host copy of its model is
  // authoritative whatever the function writes.
  const bool tracked = block.kind == BlockKind::kModel && (options_.stateful || !model_fixed_);
  if (write && tracked && bound_gpu_) {
    if (!block.dirty) (void)table_.set_dirty(block.va, true);
    // Written here: copies on other GPUs are stale now.
    for (int g = 0; g < gpu_count_; ++g) {
      if (g != *bound_gpu_ && resident(block, g)) {
        (void)table_.set_residency(block.va, g, Residency::kLoading);
      }
    }
  }
  // Through a pointer table a kernel may reach any block: wait for the last group, hence all.
  const int32_t group =
      extra.pointer_table && swap_.groups() > 0 ? swap_.groups() - 1 : extra.group;
  if (group < 0 || swap_.complete() || !bound_gpu_) return;
  const device::Event e = swap_.group_event(*bound_gpu_, group);
  for (const device::Event& w : *waits) {
    if (w.id == e.id) return;
  }
  waits->push_back(e);
}

void FunctionMemory::forget_context(int gpu) {
  MutexLock lock(mutex_);
  swap_.forget_gpu(gpu);
}

void FunctionMemory::access(uint64_t ptr, uint64_t bytes, bool write,
                            std::vector<device::Event>* waits) {
  MutexLock lock(mutex_);
  if (bytes == 0) return;
  std::vector<const VirtualBlock*> blocks;
  (void)blocks_spanned(ptr, bytes, &blocks);
  for (const VirtualBlock* block : blocks) note(*block, write, waits);
}

void FunctionMemory::kernel_access(std::span<const std::byte> params, const KernelInfo& info,
                                   std::vector<device::Event>* waits) {
  MutexLock lock(mutex_);
  Result<uint64_t> scanned = memory::scan_kernel_params(table_, params, info, found_);
  // The session checked the buffer against the layout before; nothing to wait for otherwise.
  if (!scanned.ok()) return;
  for (const memory::ArgumentPointer& pointer : found_) {
    // A kernel may write through any pointer it is given.
    note(*pointer.target.block, /*write=*/true, waits);
  }
}

void FunctionMemory::access_all(std::vector<device::Event>* waits) {
  MutexLock lock(mutex_);
  std::vector<uint64_t> vas;
  for (const memory::VirtualBlock& block : table_.blocks()) vas.push_back(block.va);
  // note() may mark blocks dirty: not while iterating the table.
  for (uint64_t va : vas) note(*table_.block_at(va), /*write=*/true, waits);
}

void FunctionMemory::storing(uint64_t dst, std::span<const std::byte> data) {
  if (!options_.pipelined) return;  // everything waits for the whole swap anyway
  MutexLock lock(mutex_);
  const memory::PointerTarget target = table_.resolve(dst);
  if (!target.found() || extra_[target.block->va].pointer_table) return;
  if (memory::holds_block_pointers(table_, dst, data))
    extra_[target.block->va].pointer_table = true;
}

void FunctionMemory::copying(uint64_t dst, uint64_t src) {
  if (!options_.pipelined) return;
  MutexLock lock(mutex_);
  const memory::PointerTarget from = table_.resolve(src);
  const memory::PointerTarget to = table_.resolve(dst);
  if (!from.found() || !to.found() || !extra_[from.block->va].pointer_table) return;
  extra_[to.block->va].pointer_table = true;
}

// ---- The controller ----

uint64_t FunctionMemory::model_bytes() const {
  MutexLock lock(mutex_);
  return table_.model_bytes();
}

uint64_t FunctionMemory::placed_bytes(GpuId on) const {
  const int gpu = on.value();
  MutexLock lock(mutex_);
  uint64_t bytes = 0;
  for (const VirtualBlock& block : table_.blocks()) {
    bytes += block.on(gpu).bytes();
  }
  return bytes;
}

bool FunctionMemory::model_fixed() const {
  MutexLock lock(mutex_);
  return model_fixed_;
}

uint64_t FunctionMemory::host_bytes() const {
  MutexLock lock(mutex_);
  uint64_t bytes = 0;
  for (const auto& [va, extra] : extra_) bytes += extra.host.bytes;
  return bytes;
}

Result<uint64_t> FunctionMemory::evict(GpuId from, device::Stream stream) {
  const int gpu = from.value();
  MutexLock lock(mutex_);
  if (bound_gpu_ == gpu) {
    return error(ErrorCode::kIllegalState, "evicting function ", owner_, " from GPU ", gpu,
                 " where it runs");
  }
  wait_for_readers(gpu);
  settle();
  // Dirty blocks whose only valid copy is here go back to the host first (state, and
  // everything of a function before its first request), through a window mapped for the copy.
  std::vector<uint64_t> back;
  uint64_t back_bytes = 0;
  for (const VirtualBlock& block : table_.blocks(BlockKind::kModel)) {
    if (!block.dirty || !resident(block, gpu)) continue;
    bool elsewhere = false;
    for (int g = 0; g < gpu_count_; ++g) elsewhere |= g != gpu && resident(block, g);
    if (elsewhere) continue;
    back.push_back(block.va);
    back_bytes += block.bytes;
  }
  if (!back.empty()) {
    Window window;
    HIBER_ASSIGN_OR_RETURN(window.va, device_.reserve_address_range(back_bytes, granularity_));
    window.bytes = back_bytes;
    std::vector<memory::MapCall> pieces;
    std::vector<uint64_t> window_at;  // each block's address in the window
    uint64_t offset = 0;
    for (uint64_t va : back) {
      window_at.push_back(window.va + offset);
      append_calls_for(*table_.block_at(va), gpu, window_at.back(), &pieces);
      offset += table_.block_at(va)->bytes;
    }
    Status copied = map_calls(pieces, gpu, &window.mapped);
    for (size_t i = 0; i < back.size() && copied.ok(); ++i) {
      const uint64_t bytes = table_.block_at(back[i])->bytes;
      copied = make_host_copy(back[i], bytes);
      if (copied.ok()) {
        copied =
            device_.copy_device_to_host(stream, extra_[back[i]].host.data, window_at[i], bytes);
      }
    }
    if (copied.ok()) copied = device_.synchronize_stream(stream);
    retire(window);
    if (!copied.ok()) return copied.with_context("writing dirty blocks back to the host");
    for (uint64_t va : back) (void)table_.set_dirty(va, false);
  }
  uint64_t freed = 0;
  for (uint64_t va : block_starts()) {
    const memory::Placement& placement = table_.block_at(va)->on(gpu);
    freed += placement.bytes();
    free_placement(va, gpu);
  }
  return freed;
}

void FunctionMemory::forget(GpuId from) {
  const int gpu = from.value();
  MutexLock lock(mutex_);
  if (bound_gpu_ == gpu) return;
  wait_for_readers(gpu);
  for (uint64_t va : block_starts()) free_placement(va, gpu);
}

void FunctionMemory::release_all() {
  MutexLock copies(copies_mutex_);
  MutexLock lock(mutex_);
  unmap_bound();
  for (Window& w : windows_) retire(w);
  windows_.clear();
  for (uint64_t va : block_starts()) {
    for (int g = 0; g < gpu_count_; ++g) free_placement(va, g);
    (void)table_.remove(va);
  }
  for (auto& [va, extra] : extra_) repository_.release(extra.host);
  extra_.clear();
  access_order_.clear();
  loading_.clear();
  swap_.release();
}

Result<std::vector<FunctionMemory::KeptBlock>> FunctionMemory::kept_model(
    const std::map<uint64_t, Sha256>* known) {
  MutexLock copies(copies_mutex_);
  std::vector<KeptBlock> kept;
  std::vector<std::span<const std::byte>> bytes;
  {
    MutexLock lock(mutex_);
    if (!model_fixed_ || options_.stateful) {
      return Status(ErrorCode::kIllegalState,
                    options_.stateful ? "a stateful function's blocks live on the GPU"
                                      : "the model is not fixed yet (no request has started)");
    }
    for (const VirtualBlock& block : table_.blocks(BlockKind::kModel)) {
      const HostCopy& host = extra_[block.va].host;
      if (!host) continue;  // never written before the first request: nothing to keep
      std::optional<HostCopyFile> file = repository_.file_of(host);
      if (!file) {
        return Status(ErrorCode::kNotSupported, "the model repository keeps no files");
      }
      kept.push_back(KeptBlock{block.va, host.bytes, std::move(*file), {}});
      bytes.emplace_back(host.data, host.bytes);
    }
  }
  // The copies cannot go meanwhile (copies_mutex_), and nothing writes them once fixed.
  for (size_t i = 0; i < kept.size(); ++i) {
    if (known != nullptr) {
      if (auto it = known->find(kept[i].va); it != known->end()) {
        kept[i].digest = it->second;
        continue;
      }
    }
    kept[i].digest = sha256(bytes[i]);
  }
  return kept;
}

void FunctionMemory::mark_model_fixed() {
  MutexLock lock(mutex_);
  model_fixed_ = true;
}

Status FunctionMemory::restore_block(uint64_t va, std::span<const std::byte> contents) {
  {
    // add_block makes a model block only while the model is not fixed.
    MutexLock lock(mutex_);
    model_fixed_ = false;
  }
  Status added = add_block(va, contents.size(), std::nullopt, RoomMaker());
  MutexLock lock(mutex_);
  model_fixed_ = true;
  HIBER_RETURN_IF_ERROR(added);
  (void)table_.set_dirty(va, false);
  Status made = make_host_copy(va, contents.size());
  if (!made.ok()) {
    (void)table_.remove(va);
    extra_.erase(va);
    return made;
  }
  std::memcpy(extra_[va].host.data, contents.data(), contents.size());
  extra_[va].fresh = false;
  return Status();
}

}  // namespace hiber::server
