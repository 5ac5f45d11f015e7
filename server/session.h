// One client's session: executes the calls it sends on the device, on a thread of its own.
//
// A session owns everything the client made: its memory (FunctionMemory: its address range, its
// blocks and where each is placed on each GPU), its streams, events, functions, and its channel;
// its modules are references to images in the daemon's ModuleCache, shared with every other
// session that loaded the same bytes (server/module_cache.h), and it gives them back when it ends.
// It checks every value the client sends: handles must be its own, device ranges must lie inside
// its own blocks, arena ranges inside its arena, sizes inside the limits. A call that fails gets
// an error completion with the CUDA error code and a message; the session keeps going. The
// session ends when the client goes away (the daemon calls close()), when the server shuts down,
// or when the client corrupts its request ring; it then waits for its device work to finish and
// releases everything, so nothing outlives it.
//
// Late binding (server/lease.h). The session holds no GPU of its own: the controller leases it
// one at a time. Calls that put work on a GPU (copies, memsets, launches, event records, stream
// waits) execute on the lease's GPU; when the session has such a call and no lease, it holds the
// call (and everything after it) and asks the controller for an implicit lease. Calls that need
// no GPU (allocation bookkeeping, code loading, handle creation, synchronisation on work already
// queued) run at once. Device streams and events exist per GPU and are made the first time a
// lease puts the client's handle to work on that GPU; synchronisation waits on the GPU where the
// handle last had work. When a lease ends (the router's done, an implicit lease idle for
// --implicit_lease_idle_us, or one past its slice while others wait: the controller's end_lease),
// the session drains its work, unmaps its blocks and hands the GPU
// back, so another function can never see its memory, and its next lease may be elsewhere.
//
// Contexts and faults. The session's device streams and events on a GPU live in the instance's
// context there, from the ContextPool: its own (--isolation=context) or the GPU's shared one.
// A fault of its work (device::is_context_fault: an illegal address, a trap, a kernel past
// SessionConfig::kernel_deadline, which the device stops) ends that context, and the session
// loses its context as a CUDA program would: its lease ends (the GPU goes back to the pool;
// in context mode nothing else of the node is touched) and every later call of the function
// fails with the sticky error, until it disconnects. Its contexts go back to the pool, to be
// destroyed, when the session ends. In shared mode, before the controller resets a GPU's shared
// context after a fault, every session forgets (never destroys) its objects there
// (forget_shared_context) and makes new ones in the fresh context when it next runs there.
//
// Synchronous calls (stream, event and device synchronisation) do not block the session thread:
// device callbacks queue their completions when the work is done and interrupt the session
// thread, which is the only one that writes the completion ring, and never blocks doing so. A
// client that stops reading its completions therefore delays only itself: what does not fit
// waits and is retried, and a client that lets too many pile up is disconnected. (Device worker
// threads are shared by every session on a GPU; they must never wait on a client.)
//
// Thread safety: create() and the destructor on the daemon's thread; the call stream runs on the
// session's thread; close(), snapshot(), grant(), end_lease(), fail() and the callbacks may run
// on any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <capnp/message.h>

#include "common/histogram.h"
#include "common/ids.h"
#include "common/mailbox.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "server/auth.h"
#include "server/context_pool.h"
#include "server/device/device.h"
#include "server/function_memory.h"
#include "server/handle_table.h"
#include "server/lease.h"
#include "server/library_calls.h"
#include "server/module_cache.h"
#include "server/queue_meter.h"
#include "server/session_types.h"
#include "server/staging_tracker.h"
#include "wire/call_table.h"
#include "wire/handshake.h"
#include "wire/library.h"
#include "wire/message.h"
#include "wire/schema/calls.capnp.h"
#include "wire/server_channel.h"

namespace hiber::server {

// What one session may make hiberd hold; 0 for any of them: no limit.
struct SessionLimits {
  // Bytes of copies and memsets queued on the GPU and not finished (server/queue_meter.h).
  uint64_t max_queued_bytes = uint64_t{16} << 30;
  // How long ago the oldest unfinished GPU work may have been queued.
  std::chrono::nanoseconds max_queue_age = std::chrono::minutes(2);
  // Bytes of code images the session's module handles hold (each handle counts its image).
  uint64_t max_module_bytes = uint64_t{4} << 30;
};

struct SessionConfig {
  InstanceId instance{0};    // the controller's SessionPlan; its blocks' owner in the pools
  uint64_t quota_bytes = 0;  // device memory the client may allocate
  uint64_t va_bytes = 0;     // size of its address range
  wire::ChannelConfig channel;
  // An implicit lease ends after this long without a call that needs the GPU.
  std::chrono::microseconds implicit_lease_idle{5000};
  // How FunctionMemory swaps and places this session's blocks.
  FunctionMemoryOptions memory;
  SessionLimits limits;
  // The longest one of its kernels may run; 0: no limit (the controller's SessionPlan).
  std::chrono::nanoseconds kernel_deadline{0};
  // The address range [*reserved_va, + va_bytes) is reserved already and the session takes it
  // over (a resumed session's old range).
  std::optional<uint64_t> reserved_va;
  // Called on the session thread when the function's first request has fixed its model.
  std::function<void(const std::shared_ptr<FunctionMemory>&)> model_fixed;
};

class Session final : public LeaseHolder {
 public:
  // Creates the session's memory (its address range), the channel and registers the arena.
  // `device`, `modules`, `contexts`, `pools`, `repository` and `lessor` must outlive the
  // session.
  static Result<std::unique_ptr<Session>> create(device::Device& device, ModuleCache& modules,
                                                 ContextPool& contexts, DevicePools& pools,
                                                 ModelRepository& repository, GpuLessor& lessor,
                                                 SessionIdentity identity,
                                                 const SessionConfig& config);
  // Releases whatever is still held. REQUIRES: the thread, if started, has been joined.
  ~Session() override;

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // What the Welcome tells the client.
  wire::SessionInfo welcome() const;
  int memfd() const { return channel_->memfd(); }
  SessionId id() const override { return identity_.id; }
  InstanceId instance() const override { return config_.instance; }
  const std::string& function_id() const override { return identity_.function_id; }
  const std::string& instance_key() const override { return identity_.instance; }
  const SessionIdentity& identity() const { return identity_; }
  // Shared with the controller, which evicts the session's replicas from GPUs it does not run on.
  const std::shared_ptr<FunctionMemory>& memory() const override { return memory_; }

  // Starts serving. `on_exit` runs on the session thread after everything is released.
  void start(std::function<void()> on_exit);
  // Ends the session: wakes the thread, which tears down. Any thread; idempotent.
  void close(std::string_view reason);
  // The client is gone, so nothing its queued work produces will be read: ends the session as
  // close() does, but executes none of the calls still waiting and cancels the work queued on
  // the GPU where the device can (Device::cancel_stream), so its GPU and memory go back at once.
  void abandon(std::string_view reason);
  void join();

  // ---- From the controller (any thread; acted on by the session thread) ----
  // The session may run on the lease's GPU: it places and maps its blocks there, starts the swap,
  // and reports GpuLessor::streaming (then swap_done).
  void grant(const Lease& lease) override;
  // The lease is over: drain, unmap, report GpuLessor::released.
  void end_lease(RequestId lease) override;
  // The lease's GPU failed: the function's work there is lost. The client sees `why` as a
  // sticky error at its next synchronisation; the lease ends as end_lease() would.
  void fail(RequestId lease, const Status& why) override;
  void forget_shared_context(GpuId gpu) override;

  SessionSnapshot snapshot() const;

 private:
  struct FunctionEntry {
    device::Function function;
    wire::ModuleHandle module;
    KernelInfo info;
  };
  // What a call produced, if anything is sent back.
  using CallResult = std::variant<std::monostate, uint64_t, float, KernelInfo, wire::LibraryAnswer>;
  struct Outcome {
    Status status;
    CallResult result;
    bool deferred = false;  // a device callback will post the completion
    // Set by work enqueued on a stream: a reply waits until that work is done, so a client
    // waiting on a copy sees its bytes.
    std::optional<device::Stream> completes_on;
  };
  struct CompletionRecord {
    uint64_t seq;
    Status status;
    CallResult result;
  };
  // Messages from the controller.
  struct GrantCommand {
    Lease lease;
  };
  struct EndCommand {
    RequestId lease;
    Status failure;  // ok: an ordinary end
  };
  // Work of the session faulted, ending its context (a device thread or callback says so: a
  // kernel past its deadline, an illegal address reported at a synchronisation).
  struct FaultCommand {
    Status why;
  };
  // The GPU's shared context is about to be reset: forget what the session made in it.
  struct ForgetContextCommand {
    GpuId gpu;
  };
  using Command = std::variant<GrantCommand, EndCommand, FaultCommand, ForgetContextCommand>;
  // What other threads hand the session thread: the controller's commands, the device's
  // faults, and completions from device callbacks.
  using Mail =
      std::variant<GrantCommand, EndCommand, FaultCommand, ForgetContextCommand, CompletionRecord>;

  Session(device::Device& device, ModuleCache& modules, ContextPool& contexts, GpuLessor& lessor,
          SessionIdentity identity, const SessionConfig& config,
          std::unique_ptr<wire::ServerChannel> channel, std::shared_ptr<FunctionMemory> memory);

  void run();
  // Executes request_ from call `first` on, noting in held_ where a call waits for a lease.
  void run_request(uint32_t first);
  // With calls held: runs them under a lease, fails them if the lease could not be granted, or
  // asks for a lease and waits up to `wait` for it.
  void resume_held(std::chrono::nanoseconds wait);
  // Executes the calls of `message` from call `first` on. Returns the index of the first call
  // not executed because it needs a GPU and the session holds no lease; nothing when every
  // call ran or the message was refused.
  std::optional<uint32_t> handle_message(const wire::Message& message, uint32_t first);
  void execute(wire::proto::Call::Reader call, uint64_t seq);
  // Runs the call's handler (the call table, wire/call_table.h).
  Outcome dispatch(wire::proto::Call::Reader call, uint64_t seq);
  // Fails the calls of `message` from `first` on (they waited for a lease that could not be
  // granted): each gets `why`, and the session reports it once as a sticky error.
  void fail_held(const wire::Message& message, uint32_t first, const Status& why);

  // Session thread: files the mail waiting (completions join unsent_) and returns the commands.
  std::vector<Command> take_mail();
  // Leases (session thread).
  void run_commands(std::vector<Command> commands);
  void begin_lease(const Lease& lease);
  void finish_lease(const Status& failure);
  // Work faulted (`why`, device::is_context_fault): the function's context is lost. Its GPU
  // goes back, and every later call fails with `why`'s code (CUDA's sticky errors).
  void lose_context(const Status& why);
  // Forgets the session's device objects on `gpu` (their context is being reset) and says so.
  void forget_context(GpuId gpu);
  // The instance's context on `gpu`, taken from the pool on first use.
  Result<device::Context> context_on(int gpu);
  // Queues mail for the session thread and wakes it (any thread).
  void post(Mail mail);

  // Call handlers, one per call of the table: a synchronisation also gets its sequence number
  // and whether the client waits for its reply.
#define HIBER_SESSION_HANDLER_kAsync(Name, handler) Outcome handler(const wire::calls::Name& call);
#define HIBER_SESSION_HANDLER_kSync(Name, handler) \
  Outcome handler(const wire::calls::Name& call, uint64_t seq, bool reply);
#define HIBER_SESSION_HANDLER(Name, name, WHICH, where, timing, shape, handler, fields) \
  HIBER_SESSION_HANDLER_##timing(Name, handler)
  HIBER_CALLS(HIBER_SESSION_HANDLER, HIBER_CALL_IGNORED)
#undef HIBER_SESSION_HANDLER
#undef HIBER_SESSION_HANDLER_kSync
#undef HIBER_SESSION_HANDLER_kAsync

  // The device stream of a client handle on the lease's GPU, made on first use. REQUIRES: a
  // lease. kInvalidHandle for a handle the client never made.
  Result<device::Stream> work_stream(wire::StreamHandle handle);
  // Makes `stream` wait for the swap groups that [ptr, ptr + bytes) needs (pipelined execution)
  // and notes a write for dirty tracking.
  Status before_access(device::Stream stream, uint64_t ptr, uint64_t bytes, bool write);
  Status check_arena_range(uint64_t offset, uint64_t bytes, std::string_view what) const;
  // kOutOfMemory when `bytes` more of code images would pass the session's module budget.
  Status check_module_budget(std::string_view call, uint64_t bytes) const;

  // Tracks staging used by an operation enqueued on `stream`; released when it completes.
  Status track_staging(uint64_t staging_end, device::Stream stream);
  // Releases staging of a call that will not run.
  void release_staging_now(uint64_t staging_end);
  // Runs `fn(status)` when all work before it on `stream` is done; counted for quiesce().
  Status after(device::Stream stream, std::function<void(Status)> fn);
  // Checks the queue limits before a GPU call (see QueueMeter), placing the markers they need.
  Status admit_gpu_call(wire::proto::Call::Reader call);
  // Notes GPU work the call queued on `stream`, placing a marker if the stream has none.
  void meter(wire::proto::Call::Reader call, device::Stream stream);
  void place_marker(device::Stream stream);
  // Some stream of the session still has work queued or running.
  bool work_pending();
  // Waits until every stream is idle and every callback has run; keeps each client stream's
  // first failure for its next synchronisation.
  void quiesce();

  // Queues a completion from any thread and wakes the session thread to send it.
  void post_completion(uint64_t seq, Status status, CallResult result = {});
  // Session thread: sends queued completions as far as the completion ring has room. Returns
  // an error if the session must end (the client corrupted the ring or stopped reading).
  Status deliver();
  static void build_completions(capnp::MessageBuilder& message,
                                std::deque<CompletionRecord>::const_iterator first, size_t count);
  void send_closing(const Status& why);
  void teardown();

  device::Device& device_;
  ModuleCache& module_cache_;
  ContextPool& context_pool_;
  GpuLessor& lessor_;
  const SessionIdentity identity_;
  const SessionConfig config_;
  const int gpu_count_;
  const std::chrono::steady_clock::time_point started_;
  std::unique_ptr<wire::ServerChannel> channel_;
  const std::shared_ptr<FunctionMemory> memory_;
  StagingTracker staging_;
  QueueMeter queue_;
  std::thread thread_;
  std::function<void()> on_exit_;

  // Owned by the session thread (and by create()/the destructor when it is not running).
  uint64_t next_seq_ = 1;
  wire::Message request_;         // the latest message from the request ring
  std::optional<uint32_t> held_;  // request_'s calls from this one wait for a lease
  std::optional<Lease> lease_;    // the GPU the calls execute on, if any
  bool asked_for_gpu_ = false;    // an implicit lease is on its way
  Status lease_failure_;          // the last grant could not be used
  Status lost_context_;           // set by lose_context(): every call fails with it
  // Set by the device thread that saw a kernel time out, so that the session's kernels queued
  // behind it do not run (each could hold the GPU for a whole deadline).
  const std::shared_ptr<std::atomic<bool>> context_lost_ = std::make_shared<std::atomic<bool>>();
  std::chrono::steady_clock::time_point last_gpu_call_;
  std::vector<std::optional<device::Context>> contexts_;  // per GPU, once used there
  HandleTable handles_;  // client streams and events, per GPU, in contexts_
  // Each module holds one cache reference.
  std::unordered_map<wire::ModuleHandle, ModuleCache::Ref> modules_;
  uint64_t module_bytes_ = 0;             // the images of modules_, each handle counted
  std::vector<device::Stream> unmarked_;  // scratch for admit_gpu_call
  std::unordered_map<wire::FunctionHandle, FunctionEntry> functions_;
  std::deque<CompletionRecord> unsent_;  // completions not yet written to the completion ring
  std::vector<device::Event> waits_;     // scratch for before_access
  LibraryCalls libraries_;               // library handles, and the checks of library calls
  // Graphs (server/session_graphs.cc): each a list of kept calls, replayed in order by
  // graphLaunch; the one being defined between graphBegin and graphEnd.
  struct Graph {
    std::vector<std::unique_ptr<capnp::MallocMessageBuilder>> calls;
    uint64_t bytes = 0;  // their encoded size, against kMaxGraphBytes
  };
  std::unordered_map<wire::GraphHandle, Graph> graphs_;
  uint64_t graph_bytes_ = 0;  // of every graph, defined or being defined
  std::optional<wire::GraphHandle> defining_;
  Graph defined_;          // the calls kept so far for defining_
  Status defining_error_;  // the first call refused while defining_
  // Keeps `call` in the graph being defined, or refuses it (and the graph).
  Status keep_for_graph(wire::proto::Call::Reader call);
  // One kept call, run on `stream` instead of its own.
  Outcome replay(wire::proto::Call::Reader call, wire::StreamHandle stream);

  // For the session thread; closed when the session ends.
  Mailbox<Mail> mail_;

  // Device callbacks not yet run; teardown and memFree wait for zero.
  Mutex callbacks_mutex_;
  std::condition_variable callbacks_done_;
  uint64_t pending_callbacks_ GUARDED_BY(callbacks_mutex_) = 0;

  std::atomic<std::optional<GpuId>> bound_gpu_{};  // the lease's, for snapshots
  std::atomic<uint64_t> batches_{0};
  // Calls per accepted batch, in batch_size_bounds()'s buckets, and their sum.
  const std::vector<double> batch_bounds_ = batch_size_bounds();
  std::vector<std::atomic<uint64_t>> batch_size_counts_ =
      std::vector<std::atomic<uint64_t>>(batch_bounds_.size() + 1);
  std::atomic<uint64_t> batched_calls_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failed_calls_{0};
  std::atomic<uint64_t> malformed_messages_{0};
  std::atomic<uint64_t> leases_{0};
  std::atomic<bool> torn_down_{false};
  std::atomic<bool> abandoned_{false};
  bool arena_registered_ = false;
};

}  // namespace hiber::server
