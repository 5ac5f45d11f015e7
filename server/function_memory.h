// One function's device memory under late binding: its blocks, where each is placed on each GPU,
// its host copies, and the map that makes the blocks appear at the function's own addresses on
// the GPU that runs it.
//
// Blocks. A block is one allocation the function made (memAllocate): [va, va + bytes) inside its
// address range, granule-aligned. memory::BlockTable keeps them and resolves any pointer to its
// block. A block may be placed on several GPUs at once (a replica of the model per GPU), each
// placement one memory::Allocation in that GPU's pool (server/device_pools.h), or several for a
// block larger than the pool's largest block. A placement is
// resident when its contents are valid there. A placed block that is not resident holds nothing
// valid yet: its bytes are in flight (the last swap; settle() marks them resident when it ends),
// a swap failed, or the copy went stale because the function wrote another GPU's copy of a
// tracked block. A swap onto that GPU refills it.
//
// Which blocks are swapped. Blocks filled before the function's first request are its model;
// their contents travel with every swap, and their host copy (server/model_repository.h) is
// authoritative, so evicting a GPU copy copies nothing back. Blocks allocated while serving
// requests are scratch: a swap re-places them on the new GPU without copying. Until its first
// request (and always, for a function registered stateful) every block counts as model and is
// tracked dirty: a block written on a GPU is copied back to its host copy before that GPU copy is
// dropped, and copied to the next GPU with the rest. fix_model() marks the first request.
//
// Mapping (the preferred translation mechanism, memory/translation.h). While the function holds
// a lease on GPU g, every block is placed on g and mapped at its own address, accessible from g
// only; contiguous runs map in one call. Nothing is rewritten, so pointers the function stored in
// device memory stay valid. Between leases nothing of the function is mapped, so no other
// function's kernel can reach it.
//
// Swapping onto a GPU (bind). Blocks whose contents must be there and are not come from the host
// copies (pinned) or from another GPU's replica (a peer copy, through a transient mapping of the
// source). bind decides what travels and from where; the swap engine (server/swap_engine.h) moves
// it in groups of `group_bytes` (the elbow hiberd measured), and each group's completion is an
// event; with pipelining, a kernel or copy waits only for the groups of the blocks its arguments
// point into (access()/kernel_access()), or for the whole swap when one of those blocks is a
// pointer table (data copied in from the host held pointers to the function's blocks: storing()).
// Without it, everything waits for the whole model. What pipelining cannot see: pointers a
// kernel computes and stores in device memory; --pipelined=false is the answer for such code.
//
// Thread safety: every method may be called from any thread; one mutex guards the state. The
// session thread binds, unbinds and executes; the controller evicts replicas on GPUs the function
// is not running on. No method calls out (to `room` callbacks) while holding the mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/ids.h"
#include "common/kernel_info.h"
#include "common/mutex.h"
#include "common/status.h"
#include "memory/block_table.h"
#include "memory/translation.h"
#include "server/device/device.h"
#include "server/device_pools.h"
#include "server/lease.h"
#include "server/model_repository.h"
#include "server/module_cache.h"
#include "server/swap_engine.h"

namespace hiber::server {

struct FunctionMemoryOptions {
  // Every block is swapped both ways for ever (a KV cache, say), not only until the first request.
  bool stateful = false;
  // Kernels wait only for the groups they touch; off: every use waits for the whole swap.
  bool pipelined = true;
  // Bytes per transfer group (the elbow). 0: one group per block (the per-parameter ablation).
  uint64_t group_bytes = 2ull << 20;
};

// Makes room on `gpu` for what `shortfall` says did not fit (GpuLessor::make_room);
// kOutOfMemory if it cannot.
using RoomMaker = std::function<Status(GpuId gpu, const memory::Shortfall& shortfall)>;

class FunctionMemory {
 public:
  // Reserves the function's address range of `va_bytes` (rounded to the granularity), or
  // takes over [*reserved, + va_bytes), reserved already (a resumed session's: the range it had).
  // `owner` names the function in the pools' accounting.
  static Result<std::shared_ptr<FunctionMemory>> create(
      device::Device& device, DevicePools& pools, ModelRepository& repository,
      memory::FunctionId owner, uint64_t va_bytes, uint64_t quota_bytes,
      const FunctionMemoryOptions& options, std::optional<device::DevicePtr> reserved = {});
  // release_all(), then frees the address range.
  ~FunctionMemory();

  FunctionMemory(const FunctionMemory&) = delete;
  FunctionMemory& operator=(const FunctionMemory&) = delete;

  device::DevicePtr va_base() const { return va_base_; }
  uint64_t va_bytes() const { return va_bytes_; }
  uint64_t granularity() const { return granularity_; }
  memory::FunctionId owner() const { return owner_; }
  // The largest allocation the function can make: its quota, and no more than the smallest
  // GPU's pool holds (a larger one could not run everywhere). A block larger than a pool's
  // largest block is placed there in pieces, mapped back to back at its address.
  uint64_t largest_allocation() const;

  // ---- Blocks (the session thread) ----
  // Records [va, va + bytes). With a GPU (a lease) it is placed and mapped there at once,
  // asking `room` for space if the pool is full. kInvalidValue for a range outside the grant,
  // misaligned or overlapping; kOutOfMemory over the quota or when no room can be made.
  Status add_block(uint64_t va, uint64_t bytes, std::optional<GpuId> gpu, const RoomMaker& room);
  bool is_block(uint64_t va) const;
  // Unmaps and frees the block everywhere. REQUIRES: no work uses it (the session quiesced).
  Status remove_block(uint64_t va);
  // [ptr, ptr + bytes) lies inside one block, or in blocks back to back without a gap (client
  // virtual memory maps one range from several); kInvalidValue naming `what` otherwise.
  Status check_range(uint64_t ptr, uint64_t bytes, std::string_view what) const;
  uint64_t allocated_bytes() const;

  // ---- Leases (the session thread) ----
  // Places every block on the lease's GPU (kInvalidValue for a lease of several), maps them there,
  // and starts bringing what must be there (from lease.source); `on_done` reports the end of the
  // swap (at once when nothing moves). A first request fixes the model first. On an error nothing
  // stays mapped.
  Status bind(const Lease& lease, device::Stream swap_stream, SwapDone on_done,
              const RoomMaker& room);
  // The bytes the last successful bind() copies in (0: every block was in place already).
  uint64_t bound_swap_bytes() const;
  // Unmaps everything. REQUIRES: the function's work on the GPU has drained.
  Status unbind();
  // The events a use of [ptr, ptr + bytes) must wait for (groups of a swap still in flight), and
  // a write noted for dirty tracking.
  void access(uint64_t ptr, uint64_t bytes, bool write, std::vector<device::Event>* waits);
  // The same for every block a kernel's arguments point into (memory/translation.h's scan).
  void kernel_access(std::span<const std::byte> params, const KernelInfo& info,
                     std::vector<device::Event>* waits);
  // The same for every block: a call that reaches memory through pointers stored in device
  // memory (a batched GEMM's pointer arrays) may read or write any of them.
  void access_all(std::vector<device::Event>* waits);
  // Host data about to be copied to `dst`, and a device-to-device copy: a block that receives
  // pointers to the function's blocks (memory::holds_block_pointers), or a copy of such a block,
  // is a pointer table, and every later use of it waits for the whole swap, since a kernel given
  // the table may reach any block through it.
  void storing(uint64_t dst, std::span<const std::byte> data);
  void copying(uint64_t dst, uint64_t src);

  // ---- The controller ----
  // Bytes that travel with a swap (the model): what the scheduler places.
  uint64_t model_bytes() const;
  // Bytes placed on `gpu` now.
  uint64_t placed_bytes(GpuId gpu) const;
  // The first request came: blocks allocated from now on are scratch (unless stateful).
  bool model_fixed() const;
  // Drops the function's copy on `gpu`: dirty blocks are first written back to their host
  // copies (on `stream`, a stream of `gpu`, waited for), then every placement there is freed.
  // REQUIRES: the function does not run on `gpu`. Bytes freed.
  Result<uint64_t> evict(GpuId gpu, device::Stream stream);
  // Frees every placement on `gpu` without copying anything back: the GPU failed, or the
  // function's bytes there were moved to another GPU.
  void forget(GpuId gpu);
  // `gpu`'s shared context is being reset: the swap's events there went with it (forgotten,
  // not destroyed). REQUIRES: the function is not bound to `gpu`.
  void forget_context(int gpu);
  // Waits until no copy of the swap in flight reads the function's placements on `gpu` (a peer
  // copy's source), so they may be freed: their pool memory is another function's next.
  void wait_for_readers(int gpu) REQUIRES(mutex_);
  // Unmaps the source windows of finished peer copies (device callbacks cannot).
  void retire_windows();
  // Unmaps and frees everything everywhere, host copies included (the session ended).
  void release_all();
  // Bytes of host copies.
  uint64_t host_bytes() const;

  // ---- Restart without loss (server/session_store.h) ----
  // A model block's host copy: where its bytes lie in the repository's files, and their digest.
  struct KeptBlock {
    uint64_t va = 0;
    uint64_t bytes = 0;
    HostCopyFile file;
    Sha256 digest{};
  };
  // Every model block's kept host copy, once the model is fixed (from then on a plain
  // function's copies never change). kIllegalState before that or for a stateful function (its
  // contents live on the GPU), kNotSupported without a repository directory. The digests are
  // computed holding the copies: release_all() and remove_block() wait meanwhile.
  // Blocks whose va is in `known` take that digest instead (copies of verified bytes).
  Result<std::vector<KeptBlock>> kept_model(const std::map<uint64_t, Sha256>* known = nullptr);
  // A model block whose contents an earlier hiberd kept (`contents`, the block's bytes): it
  // gets a host copy holding them and travels with the model from the next swap on. The model
  // counts as fixed. kInvalidValue, kOutOfMemory as add_block.
  Status restore_block(uint64_t va, std::span<const std::byte> contents);
  // The model was fixed before hiberd restarted (a resumed session, with or without blocks).
  void mark_model_fixed();

 private:
  // What the block table does not keep about a block.
  struct Extra {
    HostCopy host;               // its host copy, once made
    bool fresh = true;           // never placed: it has no contents anywhere yet
    int32_t group = -1;          // the swap group that completes it under the current lease
    bool ordered = false;        // in access_order_
    bool pointer_table = false;  // holds pointers to the function's blocks: see storing()
  };
  struct Window {  // a source of peer copies, mapped for the copy only
    int gpu = -1;  // whose memory it shows
    uint64_t va = 0;
    uint64_t bytes = 0;
    std::vector<std::pair<uint64_t, uint64_t>> mapped;
  };

  FunctionMemory(device::Device& device, DevicePools& pools, ModelRepository& repository,
                 memory::FunctionId owner, memory::BlockTable table, uint64_t quota_bytes,
                 const FunctionMemoryOptions& options);

  // Blocks still loading from the last swap become resident once it has finished well; after a
  // failed swap they stay loading, i.e. without valid contents, and the next swap refills them.
  void settle() REQUIRES(mutex_);
  // The start address of every block, so that loops may change the table.
  std::vector<uint64_t> block_starts() const REQUIRES(mutex_);
  // Places the block at `va` on `gpu` if it is not, asking `room` for space (the lock is dropped
  // while it runs). kOutOfMemory when no room can be made.
  Status place(uint64_t va, int gpu, const RoomMaker& room) REQUIRES(mutex_);
  // Whether [ptr, ptr + bytes) lies in blocks back to back (check_range); each one it touches
  // is appended to `blocks` when given.
  bool blocks_spanned(uint64_t ptr, uint64_t bytes,
                      std::vector<const memory::VirtualBlock*>* blocks) const REQUIRES(mutex_);
  // Frees the block's placement on `gpu`, if any.
  void free_placement(uint64_t va, int gpu) REQUIRES(mutex_);
  // Maps the chosen blocks placed on `gpu` at their own addresses, accessible from `gpu` only.
  Status map_blocks(int gpu, const memory::BlockFilter& include) REQUIRES(mutex_);
  // Maps `calls` (for a window: at window addresses) with access for `gpu`.
  Status map_calls(const std::vector<memory::MapCall>& calls, int gpu,
                   std::vector<std::pair<uint64_t, uint64_t>>* mapped) REQUIRES(mutex_);
  void unmap_all(std::vector<std::pair<uint64_t, uint64_t>>& mapped) REQUIRES(mutex_);
  void retire(Window& window) REQUIRES(mutex_);
  void unmap_bound() REQUIRES(mutex_);
  // A use of `block` (a write, or not) under the lease: pipelining waits, dirty tracking, and
  // the order of first uses.
  void note(const memory::VirtualBlock& block, bool write, std::vector<device::Event>* waits)
      REQUIRES(mutex_);
  Status make_host_copy(uint64_t va, uint64_t bytes) REQUIRES(mutex_);
  bool resident(const memory::VirtualBlock& block, int gpu) const {
    return block.on(gpu).residency == memory::Residency::kResident;
  }

  device::Device& device_;
  DevicePools& pools_;
  ModelRepository& repository_;
  const memory::FunctionId owner_;
  const device::DevicePtr va_base_;
  const uint64_t va_bytes_;
  const uint64_t granularity_;
  const uint64_t quota_bytes_;
  const FunctionMemoryOptions options_;
  const int gpu_count_;

  // Held while kept_model() reads host copies, and by whatever releases them; taken before
  // mutex_.
  Mutex copies_mutex_;
  mutable Mutex mutex_;
  memory::BlockTable table_ GUARDED_BY(mutex_);
  std::unordered_map<uint64_t, Extra> extra_ GUARDED_BY(mutex_);  // by va
  bool model_fixed_ GUARDED_BY(mutex_) = false;
  uint64_t bound_swap_bytes_ GUARDED_BY(mutex_) = 0;  // what the last bind() copies in
  std::optional<int> bound_gpu_ GUARDED_BY(mutex_);
  // (va, bytes) at own addresses
  std::vector<std::pair<uint64_t, uint64_t>> mapped_ GUARDED_BY(mutex_);
  std::vector<uint64_t> access_order_ GUARDED_BY(mutex_);  // model blocks, first use first
  bool tracking_ GUARDED_BY(mutex_) = false;               // recording access_order_
  std::vector<uint64_t> loading_ GUARDED_BY(mutex_);       // blocks the last swap brings ...
  std::optional<int> loading_gpu_ GUARDED_BY(mutex_);      // ... onto this GPU
  SwapEngine swap_ GUARDED_BY(mutex_);  // the transfers of the current (or last) swap
  std::vector<Window> windows_ GUARDED_BY(mutex_);
  std::vector<memory::ArgumentPointer> found_ GUARDED_BY(mutex_);  // kernel_access's scratch
};

}  // namespace hiber::server
