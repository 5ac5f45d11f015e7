// One client's session: executes the calls it sends on the device, on a thread of its own.
//
// A session owns everything the client made: its address range (the grant), the device memory
// backing its allocations, its streams, events, functions, and its channel; its modules are
// references to images in the daemon's ModuleCache, shared with every other session that loaded
// the same bytes (server/module_cache.h), and it gives them back when it ends. It
// checks every value the client sends: handles must be its own, device ranges must lie inside
// its own allocations, arena ranges inside its arena, sizes inside the limits. A call that fails
// gets an error completion with the CUDA error code and a message; the session keeps going. The
// session ends when the client goes away (the daemon calls close()), when the server shuts down,
// or when the client corrupts its request ring; it then waits for its device work to finish and
// releases everything, so nothing outlives it.
//
// Synchronous calls (stream, event and device synchronisation) do not block the session thread:
// device callbacks queue their completions when the work is done and interrupt the session
// thread, which is the only one that writes the completion ring, and never blocks doing so. A
// client that stops reading its completions therefore delays only itself: what does not fit
// waits and is retried, and a client that lets too many pile up is disconnected. (Device worker
// threads are shared by every session on a GPU; they must never wait on a client.)
//
// Thread safety: create() and the destructor on the daemon's thread; the call stream runs on the
// session's thread; close(), snapshot() and the callbacks may run on any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "server/auth.h"
#include "server/device/device.h"
#include "server/module_cache.h"
#include "server/staging_tracker.h"
#include "wire/handshake.h"
#include "wire/message.h"
#include "wire/schema/calls.capnp.h"
#include "wire/server_channel.h"

namespace hiber::server {

struct SessionConfig {
  int gpu = 0;                  // the GPU this session's work runs on
  uint64_t quota_bytes = 0;     // device memory the client may allocate
  uint64_t va_bytes = 0;        // size of its address range
  wire::ChannelConfig channel;
};

struct SessionIdentity {
  uint64_t id = 0;
  std::string function_id;
  PeerCredentials peer;
};

// A point-in-time view for status reports.
struct SessionSnapshot {
  SessionIdentity identity;
  int gpu = 0;
  uint64_t allocated_bytes = 0;
  uint64_t quota_bytes = 0;
  uint64_t batches = 0;
  uint64_t calls = 0;
  uint64_t failed_calls = 0;
  uint64_t malformed_messages = 0;
  double connected_seconds = 0;
};

class Session {
 public:
  // Reserves the address range, creates the channel and the default stream. `device` and
  // `modules` (the daemon's, shared by every session) must outlive the session.
  static Result<std::unique_ptr<Session>> create(device::Device& device, ModuleCache& modules,
                                                 SessionIdentity identity,
                                                 const SessionConfig& config);
  // Releases whatever is still held. REQUIRES: the thread, if started, has been joined.
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // What the Welcome tells the client.
  wire::SessionInfo welcome() const;
  int memfd() const { return channel_->memfd(); }
  uint64_t id() const { return identity_.id; }

  // Starts serving. `on_exit` runs on the session thread after everything is released.
  void start(std::function<void()> on_exit);
  // Ends the session: wakes the thread, which tears down. Any thread; idempotent.
  void close(std::string_view reason);
  void join();

  SessionSnapshot snapshot() const;

 private:
  struct Allocation {
    uint64_t bytes;
    device::PhysicalMemory memory;
  };
  struct FunctionEntry {
    device::Function function;
    uint64_t module;  // the client's module handle
    KernelInfo info;
  };
  // What a call produced, if anything is sent back.
  using CallResult = std::variant<std::monostate, uint64_t, float, KernelInfo>;
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

  Session(device::Device& device, ModuleCache& modules, SessionIdentity identity,
          const SessionConfig& config, std::unique_ptr<wire::ServerChannel> channel,
          device::DevicePtr va_base);

  void run();
  void handle_message(const wire::Message& message);
  void execute(wire::proto::Call::Reader call, uint64_t seq);
  Outcome dispatch(wire::proto::Call::Reader call, uint64_t seq);

  // Call handlers.
  Outcome mem_allocate(uint64_t va, uint64_t bytes);
  Outcome mem_free(uint64_t va);
  Outcome memcpy_htod(wire::proto::Call::MemcpyHtoD::Reader c);
  Outcome memcpy_dtoh(wire::proto::Call::MemcpyDtoH::Reader c);
  Outcome memcpy_dtod(wire::proto::Call::MemcpyDtoD::Reader c);
  Outcome memset(wire::proto::Call::Memset::Reader c);
  Outcome stream_create(uint64_t handle, int32_t priority);
  Outcome stream_destroy(uint64_t handle);
  Outcome stream_synchronize(uint64_t handle, uint64_t seq, bool reply);
  Outcome event_create(uint64_t handle, bool disable_timing);
  Outcome event_destroy(uint64_t handle);
  Outcome event_synchronize(uint64_t handle, uint64_t seq, bool reply);
  Outcome device_synchronize(uint64_t seq, bool reply);
  Outcome module_load(wire::proto::Call::ModuleLoad::Reader c);
  Outcome module_load_cached(wire::proto::Call::ModuleLoadCached::Reader c);
  Outcome module_unload(uint64_t handle);
  Outcome function_get(wire::proto::Call::FunctionGet::Reader c);
  Outcome launch_kernel(wire::proto::Call::LaunchKernel::Reader c);

  // Lookups and checks on client-supplied values.
  Result<device::Stream> stream(uint64_t handle) const;
  Result<device::Event> event(uint64_t handle) const;
  Status check_device_range(uint64_t ptr, uint64_t bytes, std::string_view what) const;
  Status check_arena_range(uint64_t offset, uint64_t bytes, std::string_view what) const;

  // Tracks staging used by an operation enqueued on `stream`; released when it completes.
  Status track_staging(uint64_t staging_end, device::Stream stream);
  // Releases staging of a call that will not run.
  void release_staging_now(uint64_t staging_end);
  // The stagingEnd a call names, or 0.
  static uint64_t staging_end_of(wire::proto::Call::Reader call);
  // Runs `fn(status)` when all work before it on `stream` is done; counted for quiesce().
  Status after(device::Stream stream, std::function<void(Status)> fn);
  // Waits until every stream is idle and every callback has run.
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
  const SessionIdentity identity_;
  const SessionConfig config_;
  const std::chrono::steady_clock::time_point started_;
  std::unique_ptr<wire::ServerChannel> channel_;
  const device::DevicePtr va_base_;
  const uint64_t granularity_;
  StagingTracker staging_;
  std::thread thread_;
  std::function<void()> on_exit_;

  // Owned by the session thread (and by create()/the destructor when it is not running).
  uint64_t next_seq_ = 1;
  std::optional<device::Stream> default_stream_;  // the client's stream 0
  std::optional<device::Stream> sync_stream_;     // where event synchronisations wait
  std::map<uint64_t, Allocation> allocations_;  // by va
  std::unordered_map<uint64_t, device::Stream> streams_;
  std::unordered_map<uint64_t, device::Event> events_;
  std::unordered_map<uint64_t, ModuleCache::Ref> modules_;  // each holds one cache reference
  std::unordered_map<uint64_t, FunctionEntry> functions_;
  std::deque<CompletionRecord> unsent_;  // completions not yet written to the completion ring

  // Completions posted by device callbacks, waiting for the session thread.
  std::mutex posted_mutex_;
  std::vector<CompletionRecord> posted_;  // guarded by posted_mutex_

  // Device callbacks not yet run; teardown and memFree wait for zero.
  std::mutex callbacks_mutex_;
  std::condition_variable callbacks_done_;
  uint64_t pending_callbacks_ = 0;  // guarded by callbacks_mutex_

  std::atomic<uint64_t> allocated_bytes_{0};
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failed_calls_{0};
  std::atomic<uint64_t> malformed_messages_{0};
  std::atomic<bool> torn_down_{false};
  bool arena_registered_ = false;
};

}  // namespace hiber::server
