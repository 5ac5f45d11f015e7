#include "server/device/sim/scheduler.h"

#include <utility>

namespace hiber::device::sim {

Scheduler::Scheduler(int gpus, int workers_per_gpu) {
  for (int g = 0; g < gpus; ++g) gpus_.push_back(std::make_unique<Gpu>());
  for (int g = 0; g < gpus; ++g)
    for (int w = 0; w < workers_per_gpu; ++w) workers_.emplace_back([this, g] { worker(g); });
}

Scheduler::~Scheduler() {
  {
    MutexLock lock(mu_);
    // Every enqueued operation can finish: a wait only ever awaits a record enqueued before it.
    lock.wait(done_cv_, [&]() REQUIRES(mu_) { return pending_ops_ == 0; });
    stopping_ = true;
  }
  for (auto& gpu : gpus_) gpu->work_cv.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::shared_ptr<Scheduler::ContextState> Scheduler::create_context(int gpu, bool shared) {
  return std::make_shared<ContextState>(gpu, shared);
}

std::shared_ptr<Scheduler::StreamState> Scheduler::create_stream(
    const std::shared_ptr<ContextState>& context, int priority) {
  return std::make_shared<StreamState>(context, priority);
}

std::shared_ptr<Scheduler::EventState> Scheduler::create_event(
    const std::shared_ptr<ContextState>& context, bool timing) {
  return std::make_shared<EventState>(context, timing);
}

Status Scheduler::fault(const ContextState& context) {
  if (!context.faulted.load(std::memory_order_acquire)) return Status();
  MutexLock lock(mu_);
  return context.fault;
}

void Scheduler::record_fault(ContextState& context, const Status& status) {
  if (!is_context_fault(status.code()) || !context.fault.ok()) return;
  context.fault = status;
  context.faulted.store(true, std::memory_order_release);
}

void Scheduler::enqueue(const std::shared_ptr<StreamState>& stream, Op op) {
  stream->queue.push_back(std::move(op));
  ++stream->enqueued;
  ++pending_ops_;
  if (!stream->active) advance(stream);
}

void Scheduler::enqueue_work(const std::shared_ptr<StreamState>& stream, Work work, bool kernel) {
  Op op;
  op.kind = Op::Kind::kWork;
  op.work = std::move(work);
  op.kernel = kernel;
  MutexLock lock(mu_);
  enqueue(stream, std::move(op));
}

void Scheduler::enqueue_callback(const std::shared_ptr<StreamState>& stream,
                                 StreamCallback callback) {
  Op op;
  op.kind = Op::Kind::kCallback;
  op.callback = std::move(callback);
  MutexLock lock(mu_);
  enqueue(stream, std::move(op));
}

void Scheduler::enqueue_record(const std::shared_ptr<StreamState>& stream,
                               const std::shared_ptr<EventState>& event) {
  Op op;
  op.kind = Op::Kind::kRecord;
  op.event = event;
  MutexLock lock(mu_);
  op.generation = ++event->recorded;
  event->pending.insert(op.generation);
  enqueue(stream, std::move(op));
}

void Scheduler::enqueue_wait(const std::shared_ptr<StreamState>& stream,
                             const std::shared_ptr<EventState>& event) {
  MutexLock lock(mu_);
  const uint64_t generation = event->recorded;
  if (!event->pending.contains(generation)) return;  // never recorded, or already complete
  Op op;
  op.kind = Op::Kind::kWait;
  op.event = event;
  op.generation = generation;
  enqueue(stream, std::move(op));
}

void Scheduler::finish_op(StreamState& stream) {
  ++stream.completed;
  --pending_ops_;
  done_cv_.notify_all();
}

void Scheduler::advance(std::shared_ptr<StreamState> first) {
  std::vector<std::shared_ptr<StreamState>> todo{std::move(first)};
  while (!todo.empty()) {
    std::shared_ptr<StreamState> stream = std::move(todo.back());
    todo.pop_back();
    while (!stream->queue.empty()) {
      Op& op = stream->queue.front();
      if (op.kind == Op::Kind::kRecord) {
        std::shared_ptr<EventState> event = std::move(op.event);
        const uint64_t generation = op.generation;
        stream->queue.pop_front();
        finish_op(*stream);
        event->pending.erase(generation);
        if (generation >= event->stamped) {
          event->stamped = generation;
          event->time = Clock::now();
          event->error = stream->error;
        }
        auto& waiters = event->waiters;
        for (auto it = waiters.begin(); it != waiters.end();) {
          if (event->pending.contains(it->second)) {
            ++it;
            continue;
          }
          it->first->active = false;
          todo.push_back(std::move(it->first));
          it = waiters.erase(it);
        }
        continue;
      }
      if (op.kind == Op::Kind::kWait) {
        if (!op.event->pending.contains(op.generation)) {
          stream->queue.pop_front();
          finish_op(*stream);
          continue;
        }
        stream->active = true;  // parked: the record's completion re-advances it
        op.event->waiters.emplace_back(stream, op.generation);
        break;
      }
      if (op.kind == Op::Kind::kCallback) op.status = stream->error;
      stream->active = true;
      Gpu& gpu = *gpus_[stream->gpu];
      gpu.ready.emplace(std::make_pair(stream->priority, ticket_++), stream);
      gpu.work_cv.notify_one();
      break;
    }
  }
}

void Scheduler::worker(int g) {
  Gpu& gpu = *gpus_[g];
  MutexLock lock(mu_);
  while (true) {
    lock.wait(gpu.work_cv, [&]() REQUIRES(mu_) { return stopping_ || !gpu.ready.empty(); });
    if (gpu.ready.empty()) return;  // stopping, and nothing left
    std::shared_ptr<StreamState> stream = std::move(gpu.ready.extract(gpu.ready.begin()).mapped());
    Op op = std::move(stream->queue.front());
    stream->queue.pop_front();
    // A running callback is notification, not work: a query made in answer to it (a client
    // that the callback woke) finds the stream idle. Synchronisation still waits for it.
    const bool is_callback = op.kind == Op::Kind::kCallback;
    const bool is_kernel = op.kernel;
    if (is_callback) ++stream->running_callbacks;
    // After a fault of its context, work does not run and callbacks are told the fault.
    const Status context_fault = stream->context->fault;
    if (is_callback && !context_fault.ok()) op.status = context_fault;
    lock.unlock();

    Status status;
    if (op.kind == Op::Kind::kWork) {
      status = context_fault.ok() ? op.work() : context_fault;
    } else {
      op.callback(std::move(op.status));
    }
    op = Op();  // release what the operation captured outside the lock

    lock.lock();
    if (is_kernel) record_fault(*stream->context, status);
    if (!status.ok() && stream->error.ok()) stream->error = std::move(status);
    if (is_callback) --stream->running_callbacks;
    finish_op(*stream);
    stream->active = false;
    advance(std::move(stream));
  }
}

uint64_t Scheduler::cancel(StreamState& stream, const Status& why) {
  // What the dropped operations captured is released outside the lock, as a worker does.
  std::vector<Work> dropped;
  {
    MutexLock lock(mu_);
    // Every queued operation is one no worker has taken yet (a worker pops before it runs).
    for (Op& op : stream.queue) {
      if (op.kind != Op::Kind::kWork) continue;
      dropped.push_back(std::exchange(op.work, [why] { return why; }));
    }
  }
  return dropped.size();
}

Status Scheduler::synchronize(StreamState& stream) {
  MutexLock lock(mu_);
  const uint64_t target = stream.enqueued;
  lock.wait(done_cv_, [&] { return stream.completed >= target; });
  if (!stream.context->fault.ok()) return stream.context->fault;
  return std::exchange(stream.error, Status());
}

Status Scheduler::query(StreamState& stream) {
  MutexLock lock(mu_);
  if (!stream.context->fault.ok()) return stream.context->fault;
  if (stream.completed + stream.running_callbacks < stream.enqueued)
    return error(ErrorCode::kNotReady, stream.enqueued - stream.completed,
                 " operations pending on the stream");
  return std::exchange(stream.error, Status());
}

Status Scheduler::synchronize(EventState& event) {
  MutexLock lock(mu_);
  const uint64_t generation = event.recorded;
  lock.wait(done_cv_, [&] { return !event.pending.contains(generation); });
  if (!event.context->fault.ok()) return event.context->fault;
  return event.error;
}

Status Scheduler::query(EventState& event) {
  MutexLock lock(mu_);
  if (!event.context->fault.ok()) return event.context->fault;
  if (event.pending.contains(event.recorded))
    return error(ErrorCode::kNotReady, "the event's latest record is pending");
  return event.error;
}

Result<float> Scheduler::elapsed_ms(EventState& start, EventState& end) {
  MutexLock lock(mu_);
  for (EventState* e : {&start, &end}) {
    if (!e->timing)
      return error(ErrorCode::kInvalidHandle,
                   "elapsed_ms: an event was created with timing disabled");
  }
  for (EventState* e : {&start, &end}) {
    if (e->recorded == 0)
      return error(ErrorCode::kInvalidHandle, "elapsed_ms: an event was never recorded");
    if (e->pending.contains(e->recorded))
      return error(ErrorCode::kNotReady, "elapsed_ms: an event's latest record has not completed");
  }
  return std::chrono::duration<float, std::milli>(end.time - start.time).count();
}

}  // namespace hiber::device::sim
