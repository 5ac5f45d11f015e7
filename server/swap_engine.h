// The swap engine: the transfers that bring a function's blocks onto the GPU that will run it.
//
// FunctionMemory (server/function_memory.h) decides what must travel and from where: a block's
// host copy (pinned, server/model_repository.h) or another GPU's replica, read through a window
// mapped for the copy. The engine moves those bytes on the lease's swap stream in groups of
// `group_bytes`, the elbow hiberd measured (server/elbow.h): large blocks go in group-sized
// pieces so the link stays busy, and an event is recorded after each group. A kernel or copy of
// the function that touches a block waits only for the event of the group holding the block's
// last byte (pipelined execution), not for the whole model. The end of a swap is reported from
// the device's callback thread with what it moved (SwapReport), for the scheduler's heaviness.
//
// Thread safety: none, except complete() and failed(), which read what the device's callback
// thread sets. The owner (FunctionMemory) calls it under its lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "server/device/device.h"
#include "server/lease.h"

namespace hiber::server {

// Reports the end of a swap (on a device callback thread).
using SwapDone = std::function<void(const Status&, const SwapReport&)>;

class SwapEngine {
 public:
  // One block's bytes: from a host copy, or from another GPU through a window.
  struct Transfer {
    uint64_t dst = 0;  // the block's own address on the target GPU
    uint64_t bytes = 0;
    const std::byte* host = nullptr;  // the host copy, or ...
    std::optional<int> from_gpu;      // ... the GPU holding the replica ...
    uint64_t from_va = 0;             // ... mapped here for the copy
  };

  // `group_bytes` 0: one group per block (the per-parameter ablation).
  SwapEngine(device::Device& device, int gpu_count, uint64_t group_bytes);
  ~SwapEngine();
  SwapEngine(const SwapEngine&) = delete;
  SwapEngine& operator=(const SwapEngine&) = delete;

  // Starts a swap onto `gpu`: enqueues `transfers` on `stream`, in order, an event after each
  // group. Returns, for each transfer, the group that completes it. On an error the swap is
  // over (complete() and failed()), and what was enqueued must not be trusted.
  Result<std::vector<int32_t>> start(int gpu, device::Stream stream,
                                     std::span<const Transfer> transfers);
  // Calls `on_done` on the device's callback thread once everything now queued on `stream` is
  // done: the swap's transfers and whatever the owner queued after them.
  Status report_end(device::Stream stream, SwapDone on_done);

  // Groups of the current (or last) swap.
  int32_t groups() const { return groups_; }
  // The event that ends group `group` of the current swap onto `gpu`.
  device::Event group_event(int gpu, int32_t group) const;
  // The current swap ended (true when none was started, or it moved nothing), and whether it
  // failed.
  bool complete() const { return flags_->complete.load(); }
  bool failed() const { return flags_->failed.load(); }

  // Destroys the group events (the function's session ended).
  void release();
  // Forgets the group events on `gpu` without destroying them: the context they were made in
  // was reset, which ended them. REQUIRES: no swap onto `gpu` is running.
  void forget_gpu(int gpu);

 private:
  // Set by a swap's completion callback; one per swap, so that a late callback of an earlier
  // swap cannot mark a later one complete.
  struct Flags {
    std::atomic<bool> complete{true};
    std::atomic<bool> failed{false};
  };

  // The event that ends group `index` on `stream`'s GPU, made on first use in the stream's
  // context (an event is recorded only in its own context) and reused by later swaps there.
  Result<device::Event> event(device::Stream stream, size_t index);

  device::Device& device_;
  const uint64_t group_bytes_;
  std::vector<std::vector<device::Event>> events_;  // per GPU
  std::shared_ptr<Flags> flags_ = std::make_shared<Flags>();
  int32_t groups_ = 0;
  uint64_t moved_ = 0;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace hiber::server
