// Late binding between a session and the controller: which GPU a function's calls execute on.
//
// A session holds no GPU of its own. The controller (server/controller.h) grants it one lease at
// a time, for a request the router announced or, when the function makes calls outside any
// request (its start-up, a clean-up after answering, a program run without a router), for an
// implicit request the session asks for itself. While a lease lasts the function's blocks are
// mapped at its own addresses on the lease's GPU and its calls execute there; when the lease
// ends the session drains its work, unmaps, and hands the GPU back. The next lease may be on
// another GPU: the function never notices.
//
// The session talks to the controller through GpuLessor; the controller talks to the session
// through Session::grant(), Session::end_lease() and Session::fail(). Neither side ever waits
// for the other while holding its own locks, so they cannot deadlock: everything except
// make_room() is a message.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "memory/pool_allocator.h"
#include "scheduler/types.h"

namespace hiber::server {

// One grant of a GPU to a session.
struct Lease {
  uint64_t id = 0;                 // the scheduler's RequestId
  int gpu = -1;
  bool implicit = false;           // asked for by the session, not announced by the router
  scheduler::Source source = scheduler::Source::kHost;  // where the model's bytes come from
  int source_gpu = -1;             // Source::kPeer: the GPU holding the replica to copy
  bool release_source = false;     // Source::kPeer: free the source replica once copied
  bool first_request = false;      // the function's first router request: the model is fixed
};

// What a swap moved, for the scheduler's heaviness measurements and the status report.
struct SwapReport {
  uint64_t bytes = 0;
  uint32_t groups = 0;
  int64_t duration_ns = 0;         // from the first copy enqueued to the last group done
};

// The controller's side, as a session sees it. Thread-safe; called from session threads and
// device callbacks.
class GpuLessor {
 public:
  virtual ~GpuLessor() = default;
  // The session has calls that need a GPU and holds no lease: queue an implicit request.
  virtual void need_gpu(uint64_t session) = 0;
  // The lease's swap has been enqueued (the model is streaming or resident), or it failed.
  virtual void streaming(uint64_t session, uint64_t lease, const Status& status) = 0;
  // The lease's swap finished: every group is on the GPU (or the transfer failed).
  virtual void swap_done(uint64_t session, uint64_t lease, const Status& status,
                         const SwapReport& report) = 0;
  // The session drained its work on the lease's GPU and unmapped; the GPU is free.
  virtual void released(uint64_t session, uint64_t lease, const Status& status) = 0;
  // A block does not fit `gpu`'s pool, as `shortfall` says: evict other functions' models there
  // so that it does (by the eviction policy when bytes are short; the owners of the cheapest
  // region the pool names when the free bytes are there but in pieces). Synchronous;
  // kOutOfMemory when nothing evictable makes room.
  virtual Status make_room(uint64_t session, int gpu, const memory::Shortfall& shortfall) = 0;
};

}  // namespace hiber::server
