// The session, the flush policy, errors, streams and events. Memory is in client_memory.cc,
// code (fatbins, modules, launches) in client_code.cc.
#include "client_shim/client.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <glog/logging.h>

#include "client_shim/entry_support.h"
#include "common/paths.h"

namespace hiber::shim {
namespace {

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  if (end == nullptr || *end != '\0') {
    LOG(WARNING) << "hibercuda: ignoring " << name << "=" << value << " (not a number)";
    return fallback;
  }
  return parsed;
}

// Where the handle values programs see come from: never 0, 1 or 2 (the default streams).
constexpr uint64_t kFirstHandle = 0x100;

std::string program_name() {
  char path[256];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "unknown";
  path[n] = '\0';
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// The staging FIFO takes this share of the arena; the rest is the pinned host heap. Pageable
// copies go through staging in chunks (bench/wire_bench: 1 MiB chunks, a few MiB in flight
// reach memcpy speed), so half of the default 64 MiB arena is plenty.
constexpr uint64_t kStagingShareDivisor = 2;
constexpr uint64_t kHostHeapAlignment = 256;

// HIBER_CONNECT_TIMEOUT_MS is capped at a day, so the deadline it makes cannot overflow.
constexpr uint64_t kMaxConnectTimeoutMs = 24ull * 3600 * 1000;

}  // namespace

ShimConfig ShimConfig::from_environment() {
  ShimConfig c;
  c.batching = env_u64("HIBER_BATCH", 1) != 0;
  c.batch_calls =
      static_cast<uint32_t>(std::max<uint64_t>(1, env_u64("HIBER_BATCH_CALLS", c.batch_calls)));
  c.batch_bytes = env_u64("HIBER_BATCH_BYTES", c.batch_bytes);
  c.quiet_us = static_cast<uint32_t>(env_u64("HIBER_BATCH_QUIET_US", c.quiet_us));
  c.trace = trace_mode() == TraceMode::kCalls;
  c.stats = env_u64("HIBER_STATS", 0) != 0 || trace_mode() == TraceMode::kSummary;
  c.reply_timeout_ms = std::max<uint64_t>(1, env_u64("HIBER_REPLY_TIMEOUT_MS", c.reply_timeout_ms));
  c.connect_timeout_ms = std::clamp<uint64_t>(
      env_u64("HIBER_CONNECT_TIMEOUT_MS", c.connect_timeout_ms), 1, kMaxConnectTimeoutMs);
  if (!c.batching) c.batch_calls = 1;
  return c;
}

int& thread_last_error() {
  thread_local int last_error = 0;
  return last_error;
}

std::string& thread_last_error_message() {
  thread_local std::string message;
  return message;
}

std::vector<Client::CallConfiguration>& Client::call_configurations() {
  thread_local std::vector<CallConfiguration> stack;
  return stack;
}

Client& Client::get() {
  // Never destroyed: programs call CUDA from static destructors and atexit handlers, and the
  // flusher thread may still run while the process exits.
  static Client* client = [] {
    auto* c = new Client();
    pthread_atfork([] { Client::get().mu_.lock(); }, [] { Client::get().mu_.unlock(); },
                   [] {
                     Client& self = Client::get();
                     self.forked_child_ = true;
                     self.mu_.unlock();
                   });
    // Batched calls must not be stranded when the program exits without synchronising.
    std::atexit([] { Client::get().finish_at_exit(); });
    return c;
  }();
  return *client;
}

Client::Client() : config_(ShimConfig::from_environment()), next_handle_(kFirstHandle) {}

Client::~Client() = default;

void Client::open_locked() {
  opened_ = true;
  const char* run_dir_env = std::getenv("HIBER_RUN_DIR");
  const std::string run_dir = run_dir_env && *run_dir_env ? run_dir_env : default_run_dir();
  const char* socket_env = std::getenv("HIBER_SOCKET");
  wire::ClientOptions options;
  options.socket_path = socket_env && *socket_env ? socket_env : function_socket_path(run_dir);
  const char* function_env = std::getenv("HIBER_FUNCTION_ID");
  options.function_id = function_env && *function_env
                            ? function_env
                            : program_name() + "-" + std::to_string(getpid());
  auto token = client_auth_token(client_auth_token_file(run_dir));
  if (!token.ok()) {
    // Without the socket either, hiberd is not running there: the likelier reason, said first.
    struct stat st {};
    open_status_ = ::stat(options.socket_path.c_str(), &st) != 0 && errno == ENOENT
                       ? token.status().with_context(
                             str_cat("hibercuda: hiberd is not running at ", options.socket_path,
                                     " (no socket there; HIBER_RUN_DIR or "
                                     "HIBER_SOCKET name another), and no auth token"))
                       : token.status().with_context("hibercuda: no auth token");
    LOG(ERROR) << open_status_.message();
    return;
  }
  options.auth_token = *token;
  options.requested_quota_bytes = env_u64("HIBER_QUOTA_MIB", 0) << 20;
  // The router's worker number: hiberd gives this session the leases of the requests the router
  // sends this process.
  if (const char* instance = std::getenv("HIBER_INSTANCE_ID"); instance != nullptr) {
    options.instance = instance;
  }
  options.handshake_timeout = std::chrono::milliseconds(config_.connect_timeout_ms);

  wire::CallClientOptions call_options;
  call_options.max_batch_calls = config_.batch_calls;
  call_options.reply_timeout = std::chrono::milliseconds(config_.reply_timeout_ms);
  // The staging share is fixed when the channel is known; connect first with defaults.
  connect_options_ = options;
  auto channel = wire::ClientChannel::connect(options);
  if (!channel.ok()) {
    // A time-out's message names the socket and the limit already; say where the limit is set.
    open_status_ = channel.status().with_context(
        channel.status().code() == ErrorCode::kTimeout
            ? str_cat("hibercuda: cannot open a session (HIBER_CONNECT_TIMEOUT_MS=",
                      config_.connect_timeout_ms, ")")
            : str_cat("hibercuda: cannot open a session with hiberd at ", options.socket_path));
    LOG(ERROR) << open_status_.message();
    return;
  }
  const uint64_t arena_bytes = (*channel)->arena().size();
  call_options.staging_bytes = arena_bytes / kStagingShareDivisor / 64 * 64;
  call_options_ = call_options;
  calls_ = std::make_unique<wire::CallClient>(std::move(channel).value(), call_options);

  const wire::SessionInfo& s = calls_->session();
  segments_ = RangeAllocator(s.grant.va_base, s.grant.va_bytes, s.grant.allocation_granularity);
  reserve_grant_locked();
  arena_heap_ = RangeAllocator(call_options.staging_bytes, arena_bytes - call_options.staging_bytes,
                               kHostHeapAlignment);
  if (config_.trace) {
    LOG(INFO) << "hibercuda: session " << s.session_id << " with hiberd " << s.server_version.major
              << "." << s.server_version.minor << ": " << s.devices.size() << " device(s), quota "
              << (s.grant.quota_bytes >> 20) << " MiB, batching "
              << (config_.batching ? "on" : "off");
  }
  flusher_ = std::thread([this] { flusher_main(); });
  flusher_.detach();
  if (!s.resume_token.empty()) {
    // A session that can be resumed is, as soon as hiberd is back, whether or not the program
    // is making calls then: a router waits for the instance before it sends the next request.
    std::thread([this] { watcher_main(); }).detach();
  }
}

// Device addresses are hiberd's, and nothing stops this process from mapping host memory at
// the same addresses, which would make a host pointer look like a device one. So the grant is
// reserved here (PROT_NONE, no memory behind it). Whatever was mapped there already (the
// channel itself, say) is kept out of the device allocator instead.
void Client::reserve_grant_locked() {
  const wire::Grant& grant = calls_->session().grant;
  void* want = reinterpret_cast<void*>(grant.va_base);
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE;
  void* got = mmap(want, grant.va_bytes, PROT_NONE, kFlags, -1, 0);
  if (got == want) return;
  if (got != MAP_FAILED) munmap(got, grant.va_bytes);  // a kernel without FIXED_NOREPLACE
  // Walk the existing mappings: reserve the gaps, keep the device allocator off the rest.
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) {
    LOG(WARNING) << "hibercuda: cannot reserve the device address range; host and device "
                    "pointers may be confused";
    return;
  }
  const uint64_t end = grant.va_base + grant.va_bytes;
  uint64_t cursor = grant.va_base;
  auto reserve_gap = [&](uint64_t from, uint64_t to) {
    if (to <= from) return;
    void* at = reinterpret_cast<void*>(from);
    void* r = mmap(at, to - from, PROT_NONE, kFlags, -1, 0);
    if (r != at) {
      if (r != MAP_FAILED) munmap(r, to - from);
      segments_.reserve(from, to - from);
    }
  };
  unsigned long long lo = 0, hi = 0;
  char line[512];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    if (std::sscanf(line, "%llx-%llx", &lo, &hi) != 2 || hi <= cursor || lo >= end) continue;
    reserve_gap(cursor, std::min<uint64_t>(lo, end));
    segments_.reserve(std::max<uint64_t>(lo, grant.va_base),
                      std::min<uint64_t>(hi, end) - std::max<uint64_t>(lo, grant.va_base));
    cursor = std::min<uint64_t>(hi, end);
  }
  std::fclose(maps);
  reserve_gap(cursor, end);
}

Status Client::ensure_open_locked() {
  if (forked_child_) {
    return Status(ErrorCode::kNotInitialized,
                  "hibercuda: CUDA cannot be used in a child process after fork()");
  }
  if (!opened_) open_locked();
  if (!calls_) return open_status_;
  if (!resume_failed_.ok()) return resume_failed_;
  if (session_lost_) return resume_locked();
  return Status();
}

Status Client::ready() {
  std::lock_guard lock(mu_);
  return ensure_open_locked();
}

const wire::SessionInfo* Client::session() {
  std::lock_guard lock(mu_);
  if (!ensure_open_locked().ok()) return nullptr;
  return &calls_->session();
}

int Client::device_count() {
  const wire::SessionInfo* s = session();
  return s ? static_cast<int>(s->devices.size()) : 0;
}

Status Client::sync_point_locked(Status call_status) {
  Status sticky = calls_->take_error();
  if (sticky.code() == ErrorCode::kDeinitialized) sticky = lost_session_locked(sticky);
  return !sticky.ok() ? sticky : call_status;
}

// The flusher sleeps until the batch's quiet time is due, or without a deadline while there
// is no batch. A caller wakes it only when it would otherwise wake too late: not during bursts
// of calls, nor in a loop of synchronous calls that each find it still waiting out a deadline.
void Client::flusher_main() {
  const auto quiet = std::chrono::microseconds(config_.quiet_us);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (forked_child_) return;
    if (calls_->batched_calls() == 0) {
      flusher_wakes_at_ = std::chrono::steady_clock::time_point::max();
      flusher_cv_.wait(lock);
      continue;
    }
    const auto due = last_enqueue_ + quiet;
    if (std::chrono::steady_clock::now() < due) {
      flusher_wakes_at_ = due;
      flusher_cv_.wait_until(lock, due);
      continue;
    }
    // A failure is kept as the sticky error; a lost session is resumed by the next call.
    (void)lost_session_locked(calls_->flush());
  }
}

Status Client::flush() {
  std::lock_guard lock(mu_);
  if (!calls_ || forked_child_) return Status();
  return lost_session_locked(calls_->flush());
}

void Client::finish_at_exit() {
  std::lock_guard lock(mu_);
  if (!calls_ || forked_child_ || session_lost_ || !resume_failed_.ok()) return;
  (void)calls_->flush();
  if (config_.stats) {
    // Plain stderr, not glog: the line is for the operator and for tests that parse it.
    const wire::CallClient::Stats& s = calls_->stats();
    std::fprintf(stderr, "hiber-shim stats: %llu calls in %llu batches, %llu round trips\n",
                 static_cast<unsigned long long>(s.calls),
                 static_cast<unsigned long long>(s.batches),
                 static_cast<unsigned long long>(s.waits));
  }
}

Status Client::peek_async_error() {
  std::lock_guard lock(mu_);
  if (!calls_ || forked_child_) return Status();
  if (!resume_failed_.ok()) return resume_failed_;
  Status error = calls_->peek_error();
  if (error.code() != ErrorCode::kDeinitialized) return error;
  // The session is gone: what that costs the program is the loss of its work in flight.
  return unsynced_streams_.empty() ? Status() : Status(ErrorCode::kDeviceUnavailable,
                                                       "hiberd restarted (its session was lost)");
}

Status Client::take_async_error() {
  std::lock_guard lock(mu_);
  if (!calls_ || forked_child_) return Status();
  if (!resume_failed_.ok()) return resume_failed_;
  Status error = calls_->take_error();
  return error.code() == ErrorCode::kDeinitialized ? lost_session_locked(error) : error;
}

// ---- Legacy default stream ----
//
// Work on the legacy default stream waits for all earlier work on blocking streams, and work
// on a blocking stream waits for earlier work on the legacy stream. hiberd keeps streams
// independent, so the client expresses these edges as internal events and stream waits, all
// asynchronous, and only where work actually happened since the last edge.
Status Client::order_for_work_locked(StreamObj* stream, bool hold_for_host_calls) {
  // Captured work runs when its graph is launched, ordered then.
  if (capture_of_locked(stream) != nullptr) return Status();
  HIBER_RETURN_IF_ERROR(check_session_locked());
  // Work submitted after a host function must not run before it has returned (see
  // launch_host_function): hold it here until then.
  if (hold_for_host_calls) wait_host_calls_locked(stream, /*all=*/false);
  if (stream == nullptr) {
    for (auto& [key, s] : streams_) {
      if (!s->blocking() || !s->has_unjoined_work) continue;
      if (s->join_event.is_zero()) {
        HIBER_ASSIGN_OR_RETURN(s->join_event, create_wire_event_locked(/*disable_timing=*/true));
      }
      HIBER_RETURN_IF_ERROR(
          enqueue_locked(wire::calls::EventRecord{.stream = s->wire, .event = s->join_event}));
      HIBER_RETURN_IF_ERROR(enqueue_locked(
          wire::calls::StreamWaitEvent{.stream = wire::StreamHandle(), .event = s->join_event}));
      s->has_unjoined_work = false;
    }
    ++legacy_generation_;
    return Status();
  }
  if (!stream->blocking()) return Status();
  stream->has_unjoined_work = true;
  if (stream->legacy_generation_seen == legacy_generation_) return Status();
  stream->legacy_generation_seen = legacy_generation_;
  if (legacy_join_event_.is_zero()) {
    HIBER_ASSIGN_OR_RETURN(legacy_join_event_, create_wire_event_locked(/*disable_timing=*/true));
  }
  HIBER_RETURN_IF_ERROR(enqueue_locked(
      wire::calls::EventRecord{.stream = wire::StreamHandle(), .event = legacy_join_event_}));
  return enqueue_locked(
      wire::calls::StreamWaitEvent{.stream = stream->wire, .event = legacy_join_event_});
}

Result<wire::EventHandle> Client::create_wire_event_locked(bool disable_timing) {
  const auto handle = new_handle_locked<wire::EventHandle>();
  HIBER_RETURN_IF_ERROR(
      enqueue_locked(wire::calls::EventCreate{.event = handle, .disable_timing = disable_timing}));
  return handle;
}

// ---- Streams ----

Result<StreamObj*> Client::stream(const void* handle) {
  const auto value = reinterpret_cast<uintptr_t>(handle);
  if (value <= 2) return static_cast<StreamObj*>(nullptr);  // 0, cudaStreamLegacy, PerThread
  std::lock_guard lock(mu_);
  auto it = streams_.find(handle);
  if (it == streams_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown stream ", handle);
  }
  return it->second.get();
}

Result<StreamObj*> Client::create_stream(unsigned flags, int priority) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto s = std::make_unique<StreamObj>();
  s->wire = new_handle_locked<wire::StreamHandle>();
  s->flags = flags;
  // As CUDA does, priorities outside [greatest, least] are clamped.
  const auto [least, greatest] = stream_priority_range();
  s->priority = std::min(least, std::max(greatest, priority));
  s->legacy_generation_seen = legacy_generation_;
  HIBER_RETURN_IF_ERROR(
      enqueue_locked(wire::calls::StreamCreate{.stream = s->wire, .priority = s->priority}));
  StreamObj* raw = s.get();
  streams_.emplace(raw, std::move(s));
  return raw;
}

Status Client::destroy_stream(StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (stream == nullptr)
    return Status(ErrorCode::kInvalidHandle, "the default stream cannot be destroyed");
  auto it = streams_.find(stream);
  if (it == streams_.end()) return error(ErrorCode::kInvalidHandle, "unknown stream ", stream);
  if (CaptureObj* capture = capture_of_locked(stream)) {
    return refuse_in_capture_locked(*capture, "cudaStreamDestroy");
  }
  // CUDA lets pending work finish after cudaStreamDestroy; hiberd does the same.
  if (!stream->join_event.is_zero()) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::EventDestroy{.event = stream->join_event}));
  }
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::StreamDestroy{.stream = stream->wire}));
  streams_.erase(it);
  return Status();
}

Status Client::synchronize_stream(StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (CaptureObj* capture = capture_of_locked(stream)) {
    return refuse_in_capture_locked(*capture, "cudaStreamSynchronize");
  }
  HIBER_RETURN_IF_ERROR(check_unsafe_in_capture_locked("cudaStreamSynchronize"));
  Status waited;
  if (!known_idle_locked(stream)) {
    auto reply = call_locked(wire::calls::StreamSynchronize{.stream = stream_wire(stream)});
    waited = reply.status();
    if (waited.ok()) note_idle_locked(stream);
  }
  // The stream's host functions are part of its work.
  wait_host_calls_locked(stream, /*all=*/false);
  (void)trim_pools_locked(/*all=*/false);  // as CUDA trims pools above their threshold here
  return sync_point_locked(waited);
}

Status Client::query_stream(StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (CaptureObj* capture = capture_of_locked(stream)) {
    return refuse_in_capture_locked(*capture, "cudaStreamQuery");
  }
  auto reply = call_locked(wire::calls::StreamQuery{.stream = stream_wire(stream)});
  if (reply.status().code() == ErrorCode::kNotReady) return reply.status();
  return sync_point_locked(reply.status());
}

Status Client::wait_event(StreamObj* stream, EventObj* event) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (event->captured_in) {
    // An event recorded in a capture: the waiting stream joins that capture (its later work is
    // captured after what the event follows).
    CaptureObj* capture = captures_.at(*event->captured_in).get();
    CaptureObj* mine = capture_of_locked(stream);
    if (mine == capture) return Status();
    if (stream == nullptr || mine != nullptr) {
      return refuse_in_capture_locked(*capture,
                                      "a wait joining two captures, or the legacy "
                                      "stream, to a capture");
    }
    stream->capture = capture;
    capture->streams.push_back(stream);
    capturing_[stream->wire] = capture;
    return Status();
  }
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  return enqueue_locked(
      wire::calls::StreamWaitEvent{.stream = stream_wire(stream), .event = event->wire});
}

// ---- Events ----

Result<EventObj*> Client::event(const void* handle) {
  std::lock_guard lock(mu_);
  auto it = events_.find(handle);
  if (it == events_.end()) return error(ErrorCode::kInvalidHandle, "unknown event ", handle);
  return it->second.get();
}

Result<EventObj*> Client::create_event(unsigned flags) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto e = std::make_unique<EventObj>();
  HIBER_ASSIGN_OR_RETURN(e->wire, create_wire_event_locked((flags & 2) != 0));  // DisableTiming
  e->flags = flags;
  EventObj* raw = e.get();
  events_.emplace(raw, std::move(e));
  return raw;
}

Status Client::destroy_event(EventObj* event) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto it = events_.find(event);
  if (it == events_.end()) return error(ErrorCode::kInvalidHandle, "unknown event ", event);
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::EventDestroy{.event = event->wire}));
  events_.erase(it);
  return Status();
}

Status Client::record_event(EventObj* event, StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (CaptureObj* capture = capture_of_locked(stream)) {
    event->captured_in = capture->id;  // a join point of the capture, not a record
    return Status();
  }
  event->captured_in.reset();
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  return enqueue_locked(
      wire::calls::EventRecord{.stream = stream_wire(stream), .event = event->wire});
}

Status Client::synchronize_event(EventObj* event) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(check_unsafe_in_capture_locked("cudaEventSynchronize"));
  auto reply = call_locked(wire::calls::EventSynchronize{.event = event->wire});
  (void)trim_pools_locked(/*all=*/false);
  return sync_point_locked(reply.status());
}

Status Client::query_event(EventObj* event) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto reply = call_locked(wire::calls::EventQuery{.event = event->wire});
  if (reply.status().code() == ErrorCode::kNotReady) return reply.status();
  return sync_point_locked(reply.status());
}

Result<float> Client::elapsed_ms(EventObj* start, EventObj* end) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto reply = call_locked(wire::calls::EventElapsedTime{.start = start->wire, .end = end->wire});
  if (!reply.ok()) {
    if (reply.status().code() == ErrorCode::kNotReady) return reply.status();
    return sync_point_locked(reply.status());
  }
  const float* ms = std::get_if<float>(&*reply);
  if (ms == nullptr) return Status(ErrorCode::kUnknown, "eventElapsedTime: reply without a time");
  return *ms;
}

Status Client::synchronize_device() {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(check_unsafe_in_capture_locked("cudaDeviceSynchronize"));
  auto reply = call_locked(wire::calls::DeviceSynchronize{});
  wait_host_calls_locked(nullptr, /*all=*/true);
  (void)trim_pools_locked(/*all=*/false);
  return sync_point_locked(reply.status());
}

// ---- Host functions ----
//
// hiberd cannot call into the client, and a stream in hiberd cannot wait for the client without
// a protocol of its own, so the order is kept here: a marker event is recorded on the stream
// (asynchronously), the host-call thread waits for it in hiberd (polling eventQuery, so it never
// holds the client's mutex while the GPU works) and then runs the function; meanwhile any later
// work for that stream waits in order_for_work_locked. The thread that submits the host function
// itself does not wait.

bool Client::host_calls_pending_locked(const StreamObj* stream, bool all) const {
  if (host_calls_pending_.empty()) return false;
  if (all) return true;
  auto pending = [&](wire::StreamHandle s) { return host_calls_pending_.count(s) != 0; };
  if (pending(stream_wire(const_cast<StreamObj*>(stream)))) return true;
  if (stream == nullptr) {
    // Legacy default stream: it follows every blocking stream's earlier work.
    for (const auto& [key, s] : streams_) {
      if (s->blocking() && pending(s->wire)) return true;
    }
    return false;
  }
  // A blocking stream follows the legacy default stream's earlier work.
  return stream->blocking() && pending(wire::StreamHandle());
}

void Client::wait_host_calls_locked(const StreamObj* stream, bool all) {
  // A host function that itself submitted work to its own stream would wait for itself forever;
  // CUDA forbids CUDA calls in host functions, so refuse to wait on the host-call thread.
  if (std::this_thread::get_id() == host_caller_id_) return;
  host_calls_cv_.wait(mu_, [&] { return !host_calls_pending_locked(stream, all); });
}

Status Client::launch_host_function(StreamObj* stream, HostCall run) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (CaptureObj* capture = capture_of_locked(stream)) {
    if (!capture->invalidated.ok()) return capture->invalidated;
    auto node = std::make_unique<GraphNodeObj>();
    node->kind = GraphNodeObj::Kind::kHost;
    node->host = std::move(run);
    return add_captured_node_locked(*capture, std::move(node));
  }
  return launch_host_function_locked(stream, std::move(run));
}

Status Client::launch_host_function_locked(StreamObj* stream, HostCall run) {
  // Ordered like any work on the stream, but not held behind earlier host functions: the
  // host-call thread runs them in submission order anyway.
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream, /*hold_for_host_calls=*/false));
  HIBER_ASSIGN_OR_RETURN(const wire::EventHandle marker,
                         create_wire_event_locked(/*disable_timing=*/true));
  HIBER_RETURN_IF_ERROR(
      enqueue_locked(wire::calls::EventRecord{.stream = stream_wire(stream), .event = marker}));
  ++host_calls_pending_[stream_wire(stream)];
  host_calls_.push_back(PendingHostCall{stream_wire(stream), marker, std::move(run)});
  if (!host_caller_started_) {
    host_caller_started_ = true;
    std::thread([this] { host_caller_main(); }).detach();
  }
  host_calls_cv_.notify_all();
  return Status();
}

void Client::host_caller_main() {
  std::unique_lock lock(mu_);
  host_caller_id_ = std::this_thread::get_id();
  constexpr auto kMaxPoll = std::chrono::milliseconds(1);
  for (;;) {
    host_calls_cv_.wait(lock, [&] { return !host_calls_.empty() || forked_child_; });
    if (forked_child_) return;
    PendingHostCall call = std::move(host_calls_.front());
    host_calls_.pop_front();
    Status status;
    for (auto poll = std::chrono::microseconds(20);;) {
      // Not sticky: an error here is the stream's, already the session's sticky error.
      auto reply = calls_->call(wire::calls::EventQuery{.event = call.marker}, /*sticky=*/false);
      if (reply.ok()) break;
      if (reply.status().code() != ErrorCode::kNotReady) {
        status = reply.status();
        break;
      }
      lock.unlock();
      std::this_thread::sleep_for(poll);
      lock.lock();
      poll = std::min<std::chrono::microseconds>(poll * 2, kMaxPoll);
    }
    (void)enqueue_locked(wire::calls::EventDestroy{.event = call.marker});
    if (status.ok()) status = calls_->peek_error();
    lock.unlock();
    call.run(status);
    lock.lock();
    auto it = host_calls_pending_.find(call.stream);
    if (it != host_calls_pending_.end() && --it->second <= 0) host_calls_pending_.erase(it);
    host_calls_cv_.notify_all();
  }
}

}  // namespace hiber::shim
