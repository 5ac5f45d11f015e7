// Streams and events of the simulated GPUs.
//
// Each GPU has a pool of worker threads. A stream is an ordered queue of operations, run by at
// most one worker at a time; among streams with work ready, the lower priority value goes first
// and equal priorities take turns, one operation each. Operations that need no worker run
// inline, under the lock, as soon as the stream reaches them: recording an event (a timestamp)
// and waiting for one (the stream parks until the awaited record completes, holding no worker).
//
// Contexts: every stream and event belongs to one. A kernel failing with a fault
// (is_context_fault: a fault caught in it, a refused access, a stop at its deadline) ends its
// context: the context's work not yet started fails with the fault without running, callbacks
// are told the fault, and every synchronisation and query of its streams and events answers it,
// for good. Streams of other contexts go on. (A failed copy fails its stream only: the simulated
// copies fail where hiberd itself unmapped memory under them, not where a program faulted.)
//
// Locking: one mutex guards all streams and events of the device, so an event recorded on one
// GPU can wake a stream of another without lock ordering. It is held only for bookkeeping, never
// while an operation or callback runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/device.h"

namespace hiber::device::sim {

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;
  // An operation's work: runs on a worker of the stream's GPU; an error becomes the stream's.
  using Work = std::function<Status()>;

  struct ContextState;
  struct EventState;
  struct StreamState;

  Scheduler(int gpus, int workers_per_gpu);
  // Finishes all enqueued work (so callbacks run and host memory is no longer used once the
  // device is gone), then stops the workers.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  std::shared_ptr<ContextState> create_context(int gpu, bool shared);
  std::shared_ptr<StreamState> create_stream(const std::shared_ptr<ContextState>& context,
                                             int priority);
  std::shared_ptr<EventState> create_event(const std::shared_ptr<ContextState>& context,
                                           bool timing);
  // kSuccess, or the fault that ended the context.
  Status fault(const ContextState& context);

  // `kernel`: the work is a kernel's (or a library call's), whose faults end the context.
  void enqueue_work(const std::shared_ptr<StreamState>& stream, Work work, bool kernel = false);
  void enqueue_callback(const std::shared_ptr<StreamState>& stream, StreamCallback callback);
  void enqueue_record(const std::shared_ptr<StreamState>& stream,
                      const std::shared_ptr<EventState>& event);
  // Later work on `stream` waits for the event's latest record as of now.
  void enqueue_wait(const std::shared_ptr<StreamState>& stream,
                    const std::shared_ptr<EventState>& event);

  // The stream's work operations not yet started will not run: each fails with `why` at once
  // (so the stream's error becomes `why`). Records, waits and callbacks stay, in order. Returns
  // how many were dropped.
  uint64_t cancel(StreamState& stream, const Status& why);

  // Waits for the work enqueued before the call; returns the stream's first error since the last
  // synchronize or successful query, and clears it.
  Status synchronize(StreamState& stream);
  // kNotReady while work is pending; otherwise as synchronize.
  Status query(StreamState& stream);
  // Waits for the event's latest record (an event never recorded is complete); returns the error
  // its stream had when the record was reached (see EventState::error).
  Status synchronize(EventState& event);
  // kNotReady while the latest record is pending; otherwise as synchronize.
  Status query(EventState& event);
  // kInvalidHandle if either event has timing disabled or was never recorded; kNotReady if either
  // latest record is pending.
  Result<float> elapsed_ms(EventState& start, EventState& end);

  struct Op {
    enum class Kind { kWork, kCallback, kRecord, kWait };
    Kind kind = Kind::kWork;
    Work work;
    bool kernel = false;  // kWork: a fault of it ends the context
    StreamCallback callback;
    std::shared_ptr<EventState> event;
    uint64_t generation = 0;  // of the event's record that kRecord completes or kWait awaits
    // kCallback: the status of the work before it, taken under the lock as that work finished
    // (a synchronize_stream may clear the stream's error before a worker runs the callback).
    Status status;
  };

  struct ContextState {
    ContextState(int gpu, bool shared) : gpu(gpu), shared(shared) {}
    const int gpu;
    const bool shared;  // the GPU's shared context, never destroyed
    // Set once `fault` is (under the scheduler's mutex), so enqueueing can check it unlocked.
    std::atomic<bool> faulted{false};
    std::atomic<bool> destroyed{false};
    Status fault;  // guarded by the scheduler's mutex
  };

  struct StreamState {
    StreamState(std::shared_ptr<ContextState> context, int priority)
        : gpu(context->gpu), priority(priority), context(std::move(context)) {}
    const int gpu;
    const int priority;
    const std::shared_ptr<ContextState> context;
    // Guarded by the scheduler's mutex.
    std::deque<Op> queue;
    uint64_t enqueued = 0;
    uint64_t completed = 0;
    uint64_t running_callbacks = 0;  // callbacks running now (done for query(), not for sync)
    bool active = false;             // ready, running on a worker, or parked on an event
    Status error;                    // first error since the last synchronize / query
  };

  struct EventState {
    EventState(std::shared_ptr<ContextState> context, bool timing)
        : gpu(context->gpu), timing(timing), context(std::move(context)) {}
    const int gpu;
    const bool timing;
    const std::shared_ptr<ContextState> context;
    // Guarded by the scheduler's mutex.
    uint64_t recorded = 0;       // generation of the latest record call; 0 = never recorded
    std::set<uint64_t> pending;  // generations recorded but not yet reached by their stream
    uint64_t stamped = 0;        // the latest completed generation, and when it completed
    Clock::time_point time;
    // The first error of the stream's work before the stamped record, since the stream's last
    // synchronize or successful query: synchronize_event and query_event report failed work as
    // the CUDA backend does. Stays until the event is recorded again.
    Status error;
    std::vector<std::pair<std::shared_ptr<StreamState>, uint64_t>> waiters;  // parked streams
  };

 private:
  void enqueue(const std::shared_ptr<StreamState>& stream, Op op) REQUIRES(mu_);
  // Runs what a stream can run inline and hands the rest to a worker or parks it; repeats for
  // every stream that this wakes. REQUIRES: stream not active.
  void advance(std::shared_ptr<StreamState> stream) REQUIRES(mu_);
  void finish_op(StreamState& stream) REQUIRES(mu_);
  // Ends `context` with `status` if it is the context's first fault.
  void record_fault(ContextState& context, const Status& status) REQUIRES(mu_);
  void worker(int gpu);

  // Also guards the streams' and events' states and each Gpu's ready map (their "Guarded by"
  // is a comment: the analysis cannot name another object's mutex).
  Mutex mu_;
  std::condition_variable done_cv_;  // an operation finished or an event completed
  struct Gpu {
    std::condition_variable work_cv;
    // Streams with work for a worker: (priority, ticket) keeps priority order, then FIFO.
    std::map<std::pair<int, uint64_t>, std::shared_ptr<StreamState>> ready;
  };
  std::vector<std::unique_ptr<Gpu>> gpus_;
  uint64_t ticket_ GUARDED_BY(mu_) = 0;
  uint64_t pending_ops_ GUARDED_BY(mu_) = 0;  // enqueued and not finished, over all streams
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace hiber::device::sim
