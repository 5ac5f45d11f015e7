// Late binding between a session and the controller: which GPU a function's calls execute on.
//
// A session holds no GPU of its own. The controller (server/controller.h) grants it one lease at
// a time, for a request the router announced or, when the function makes calls outside any
// request (its start-up, a clean-up after answering, a program run without a router), for an
// implicit request the session asks for itself. While a lease lasts the function's blocks are
// mapped at its own addresses on the lease's GPU and its calls execute there; when the lease
// ends the session drains its work, unmaps, and hands the GPU back. The next lease may be on
// another GPU: the function never notices. The controller ends an implicit lease itself
// (end_lease) once it has held its GPU for a slice while other functions wait (--lease_slice_ms).
//
// The session talks to the controller through GpuLessor; the controller talks to the session
// through LeaseHolder (grant(), end_lease() and fail()), which Session implements. Neither side
// ever waits for the other while holding its own locks, so they cannot deadlock: everything except
// make_room() is a message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/gpu_set.h"
#include "common/ids.h"
#include "common/status.h"
#include "memory/pool_allocator.h"
#include "scheduler/types.h"

namespace hiber::server {

class FunctionMemory;

// One grant of GPUs to a session: one GPU for every lease today (the node core places a request
// on one GPU, and a session refuses a lease of more), so that a function spanning GPUs widens
// what a lease holds and nothing that passes one around.
struct Lease {
  RequestId id;  // the request it serves
  GpuSet gpus;
  bool implicit = false;  // asked for by the session, not announced by the router
  scheduler::Source source = scheduler::Source::kHost;  // where the model's bytes come from
  std::optional<GpuId> source_gpu;  // Source::kPeer: the GPU holding the replica to copy
  bool release_source = false;      // Source::kPeer: free the source replica once copied
  bool first_request = false;       // the function's first router request: the model is fixed
};

// What a swap moved, for the scheduler's heaviness measurements and the status report.
struct SwapReport {
  uint64_t bytes = 0;
  uint32_t groups = 0;
  int64_t duration_ns = 0;  // from the first copy enqueued to the last group done
};

// The controller's side, as a session sees it. Thread-safe; called from session threads and
// device callbacks.
class GpuLessor {
 public:
  virtual ~GpuLessor() = default;
  // The session has calls that need a GPU and holds no lease: queue an implicit request.
  virtual void need_gpu(SessionId session) = 0;
  // The lease's swap has been enqueued (the model is streaming or resident), or it failed.
  // `moves_nothing`: every byte of the model was in place (nothing is copied in).
  virtual void streaming(SessionId session, RequestId lease, const Status& status,
                         bool moves_nothing) = 0;
  // The lease's swap finished: every group is on the GPU (or the transfer failed).
  virtual void swap_done(SessionId session, RequestId lease, const Status& status,
                         const SwapReport& report) = 0;
  // The session drained its work on the lease's GPU and unmapped; the GPU is free.
  virtual void released(SessionId session, RequestId lease, const Status& status) = 0;
  // A block does not fit `gpu`'s pool, as `shortfall` says: evict other functions' models there
  // so that it does (by the eviction policy when bytes are short; the owners of the cheapest
  // region the pool names when the free bytes are there but in pieces). Synchronous;
  // kOutOfMemory when nothing evictable makes room.
  virtual Status make_room(SessionId session, GpuId gpu, const memory::Shortfall& shortfall) = 0;
  // The session forgot its objects in `gpu`'s shared context (LeaseHolder::forget_shared_context):
  // it will not pass them to the device again.
  virtual void context_forgotten(SessionId session, GpuId gpu) = 0;
};

// The session's side, as the controller sees it: a function's instance that can hold a lease.
// Thread-safe; the controller calls it on its own thread, and it acts asynchronously, reporting
// through GpuLessor.
class LeaseHolder {
 public:
  virtual ~LeaseHolder() = default;
  virtual SessionId id() const = 0;
  // The instance it is, as the controller numbered it when it admitted the session.
  virtual InstanceId instance() const = 0;
  // The function id the instance connected as.
  virtual const std::string& function_id() const = 0;
  // The key its Hello gave (which of the function's instances it is); "" for none.
  virtual const std::string& instance_key() const = 0;
  // The instance's memory, shared with the controller, which evicts its replicas from GPUs it
  // does not run on.
  virtual const std::shared_ptr<FunctionMemory>& memory() const = 0;
  // The instance may run on the lease's GPU: it places and maps its blocks there, starts the
  // swap, and reports GpuLessor::streaming (then swap_done).
  virtual void grant(const Lease& lease) = 0;
  // The lease is over: drain, unmap, report GpuLessor::released.
  virtual void end_lease(RequestId lease) = 0;
  // The lease's GPU failed: the function's work there is lost. The client sees `why` as a
  // sticky error at its next synchronisation; the lease ends as end_lease() would.
  virtual void fail(RequestId lease, const Status& why) = 0;
  // `gpu`'s shared context is about to be reset (shared isolation, after a fault there): the
  // instance forgets its streams, events and swap events in it, without destroying them (the
  // reset ends them), and reports GpuLessor::context_forgotten. It holds no lease on `gpu`.
  virtual void forget_shared_context(GpuId gpu) = 0;
};

}  // namespace hiber::server
