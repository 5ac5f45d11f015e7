// Remoted libraries (cuBLAS, cuBLASLt, cuDNN) on a device: what each backend runs.
//
// The session checks a library call first (server/library_calls.h: its handle is the session's,
// its values are in range, its operands lie inside the session's memory, and their swap groups
// are waited for), then hands it to the device's backend for the library:
//   - CUDA: the real libraries, with a library handle per owner, client handle, GPU and
//     context, so a function moved to another GPU gets fresh handles there, made in its own
//     context;
//   - simulated: host implementations, run in stream order like kernels.
// A backend answers kNotSupported, naming what, for anything it cannot run exactly.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "library_ops/dispatch.h"
#include "server/device/device.h"

namespace hiber::device {

// A library call as the session hands it over.
struct LibraryCall {
  uint64_t owner = 0;  // the session: backends keep handles and plans per owner
  library_ops::LibraryHandle handle;
  library_ops::LibraryOp op{};
  std::span<const std::byte> args;  // the operation's argument struct; valid during the call only
};

class LibraryBackend {
 public:
  virtual ~LibraryBackend() = default;
  // Whether handles can be served at all, asked when a client creates one: kNotSupported naming
  // what is missing (the CUDA backend opens the real library here, the first time).
  virtual Status check_available() { return Status(); }
  // Enqueues a compute call on `stream`; its failure after enqueueing is the stream's error. A
  // call that only defines the session's state (library_ops::defines_session_state) gets no
  // stream (Stream{}) and must not use it.
  virtual Status run(Stream stream, const LibraryCall& call) = 0;
  // Answers a query (heuristics, finalizing a plan) for work that will run in `context`.
  virtual Result<std::vector<std::byte>> answer(Context context, const LibraryCall& call) = 0;
  // Forgets what was kept for `owner`'s `handle` (every handle if none). Work already enqueued
  // still runs.
  virtual void release(uint64_t owner, std::optional<library_ops::LibraryHandle> handle) = 0;
  // `context` was reset (Device::reset_shared_context): whatever was kept in it (handles,
  // plans) went with it. Forgets it all without destroying anything.
  virtual void forget_context(Context context) = 0;
};

}  // namespace hiber::device
