#include "server/session.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include <glog/logging.h>

#include "wire/limits.h"

namespace hiber::server {
namespace proto = wire::proto;
using device::DevicePtr;

namespace {

// Bounds on what one session may create, so a client cannot exhaust the server's memory.
constexpr size_t kMaxStreams = 4096;
constexpr size_t kMaxEvents = 1 << 16;
constexpr size_t kMaxModules = 4096;
constexpr size_t kMaxFunctions = 1 << 16;
constexpr size_t kMaxAllocations = 1 << 16;

// Completions per completion message, at most; fewer when they would not fit one ring record.
constexpr size_t kCompletionsPerMessage = 128;
// A client that lets this many completions pile up unread is disconnected.
constexpr size_t kMaxUnsentCompletions = 1 << 14;
// Error messages sent back are cut to this length (they can quote client-chosen names).
constexpr size_t kMaxErrorMessageBytes = 1024;

Status limited(Status status) {
  if (status.message().size() <= kMaxErrorMessageBytes) return status;
  return Status(status.code(), status.message().substr(0, kMaxErrorMessageBytes - 3) + "...");
}
// How long the session thread waits before retrying completions the client had no room for.
constexpr auto kMinRetry = std::chrono::milliseconds(1);
constexpr auto kMaxRetry = std::chrono::milliseconds(50);
// A request buffer larger than this is freed after use rather than kept.
constexpr size_t kKeptMessageBytes = 1 << 20;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

Status invalid(const std::string& message) { return Status(ErrorCode::kInvalidValue, message); }

// Checks that a client-chosen handle can name a new object of `table`: not zero (reserved),
// not in use, and the session under its limit for that kind of object.
template <typename Table>
Status check_new_handle(const Table& table, uint64_t handle, size_t limit, std::string_view call) {
  if (handle == 0) return invalid(str_cat(call, ": handle 0 is reserved"));
  if (table.count(handle) != 0) {
    return invalid(str_cat(call, ": handle ", hex(handle), " is already in use"));
  }
  if (table.size() >= limit) {
    return error(ErrorCode::kOutOfMemory, call, ": the session already holds ", limit);
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Session>> Session::create(device::Device& device, ModuleCache& modules,
                                                 SessionIdentity identity,
                                                 const SessionConfig& config) {
  if (config.gpu < 0 || config.gpu >= device.gpu_count()) {
    return error(ErrorCode::kInvalidDevice, "session GPU ", config.gpu, " does not exist");
  }
  const uint64_t granularity = device.allocation_granularity(config.gpu);
  auto channel = wire::ServerChannel::create(config.channel);
  if (!channel.ok()) return channel.status().with_context("creating the session channel");
  auto va = device.reserve_address_range(round_up(config.va_bytes, granularity), granularity);
  if (!va.ok()) return va.status().with_context("reserving the session's address range");
  std::unique_ptr<Session> session(new Session(device, modules, std::move(identity), config,
                                              std::move(channel).value(), *va));
  // From here the destructor releases what exists.
  // Copies read and write the arena directly; registered, the CUDA backend DMAs from it.
  const std::span<std::byte> arena = session->channel_->arena();
  Status registered = device.register_host_memory(arena.data(), arena.size());
  if (registered.ok()) {
    session->arena_registered_ = true;
  } else {
    // Copies still work from unregistered memory, only without DMA straight from the arena.
    LOG(WARNING) << "session " << session->identity_.id
                 << ": arena not registered with the device, copies will stage: " << registered;
  }
  auto default_stream = device.create_stream(config.gpu, 0);
  if (!default_stream.ok()) return default_stream.status().with_context("default stream");
  session->default_stream_ = *default_stream;
  auto sync_stream = device.create_stream(config.gpu, 0);
  if (!sync_stream.ok()) return sync_stream.status().with_context("synchronisation stream");
  session->sync_stream_ = *sync_stream;
  return session;
}

Session::Session(device::Device& device, ModuleCache& modules, SessionIdentity identity,
                 const SessionConfig& config, std::unique_ptr<wire::ServerChannel> channel,
                 DevicePtr va_base)
    : device_(device),
      module_cache_(modules),
      identity_(std::move(identity)),
      config_(config),
      started_(std::chrono::steady_clock::now()),
      channel_(std::move(channel)),
      va_base_(va_base),
      granularity_(device.allocation_granularity(config.gpu)),
      staging_([this](uint64_t end) { channel_->release_staging(end); }) {}

Session::~Session() {
  CHECK(!thread_.joinable()) << "session " << identity_.id << " destroyed while running";
  teardown();
}

wire::SessionInfo Session::welcome() const {
  wire::SessionInfo info;
  info.session_id = identity_.id;
  info.server_version = wire::current_protocol_version();
  info.grant.va_base = va_base_;
  info.grant.va_bytes = round_up(config_.va_bytes, granularity_);
  info.grant.quota_bytes = config_.quota_bytes;
  info.grant.allocation_granularity = granularity_;
  info.layout = channel_->layout();
  // The function sees one device: the GPU its work runs on, as ordinal 0.
  const device::DeviceProperties& props = device_.properties(config_.gpu);
  wire::DeviceInfo dev;
  dev.ordinal = 0;
  dev.name = props.name;
  dev.uuid.assign(props.uuid.begin(), props.uuid.end());
  dev.pci_bus_id = props.pci_bus_id;
  dev.total_memory_bytes = props.total_memory_bytes;
  dev.attributes = props.attributes;
  info.devices.push_back(std::move(dev));
  info.node = device_.topology();
  return info;
}

void Session::start(std::function<void()> on_exit) {
  on_exit_ = std::move(on_exit);
  thread_ = std::thread([this] { run(); });
}

void Session::close(std::string_view reason) {
  if (!channel_->closed()) {
    VLOG(1) << "session " << identity_.id << " (" << identity_.function_id
            << ") closing: " << reason;
  }
  channel_->close();
}

void Session::join() {
  if (thread_.joinable()) thread_.join();
}

SessionSnapshot Session::snapshot() const {
  SessionSnapshot s;
  s.identity = identity_;
  s.gpu = config_.gpu;
  s.allocated_bytes = allocated_bytes_.load();
  s.quota_bytes = config_.quota_bytes;
  s.batches = batches_.load();
  s.calls = calls_.load();
  s.failed_calls = failed_calls_.load();
  s.malformed_messages = malformed_messages_.load();
  s.connected_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return s;
}

void Session::run() {
  wire::Message message;
  std::chrono::milliseconds retry = kMinRetry;
  while (true) {
    const size_t unsent_before = unsent_.size();
    Status delivered = deliver();
    if (!delivered.ok()) {
      LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id << ", pid "
                   << identity_.peer.pid << "): " << delivered << "; ending the session";
      send_closing(delivered);
      channel_->close();
      break;
    }
    // Wait for requests; if completions are stuck behind a full ring, come back to them.
    retry = unsent_.size() < unsent_before ? kMinRetry : std::min(retry * 2, kMaxRetry);
    const auto timeout = unsent_.empty() ? std::chrono::nanoseconds(std::chrono::hours(1))
                                         : std::chrono::nanoseconds(retry);
    Status received = channel_->receive(message, timeout);
    // kNotReady: a device callback posted a completion; kTimeout: time to retry.
    if (received.code() == ErrorCode::kTimeout || received.code() == ErrorCode::kNotReady) continue;
    if (received.code() == ErrorCode::kDeinitialized) break;
    if (!received.ok()) {
      // The ring itself is broken: nothing after this point can be trusted to be in order.
      LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id << ", pid "
                   << identity_.peer.pid << "): " << received << "; ending the session";
      malformed_messages_.fetch_add(1);
      send_closing(received);
      channel_->close();
      break;
    }
    handle_message(message);
    // Keep the buffer for the next message, unless a rare huge one made it big.
    if (message.size() > kKeptMessageBytes) message = wire::Message();
  }
  teardown();
  if (on_exit_) on_exit_();
}

void Session::handle_message(const wire::Message& message) {
  batches_.fetch_add(1, std::memory_order_relaxed);
  Status read = wire::read_message<proto::Batch>(
      message, "batch", [&](proto::Batch::Reader batch) -> Status {
        auto calls = batch.getCalls();
        Status refused;
        if (calls.size() > wire::kMaxCallsPerBatch) {
          refused = invalid(str_cat("batch of ", calls.size(), " calls; the limit is ",
                                    wire::kMaxCallsPerBatch));
        } else if (batch.getFirstSeq() != next_seq_) {
          // Calls were lost or duplicated on the client side; execute nothing of this batch.
          refused = invalid(str_cat("batch starts at call ", batch.getFirstSeq(), " but call ",
                                    next_seq_, " is next"));
        }
        if (!refused.ok()) {
          // None of its copies will run: give their staging back.
          uint64_t last_end = 0;
          for (auto call : calls) last_end = std::max(last_end, staging_end_of(call));
          release_staging_now(last_end);
          return refused;
        }
        for (uint32_t i = 0; i < calls.size(); ++i) execute(calls[i], next_seq_ + i);
        next_seq_ += calls.size();
        return Status();
      });
  if (!read.ok()) {
    malformed_messages_.fetch_add(1, std::memory_order_relaxed);
    LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id
                 << "): rejected a message: " << read;
    // Sequence 0: an error of the session, not of one call. The client makes it sticky.
    unsent_.push_back({0, limited(read), {}});
  }
}

void Session::execute(proto::Call::Reader call, uint64_t seq) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  Outcome outcome;
  // A field the client encoded wrongly throws when read; that fails this call only.
  kj::Maybe<kj::Exception> thrown = kj::runCatchingExceptions([&] { outcome = dispatch(call, seq); });
  KJ_IF_MAYBE(e, thrown) {
    outcome = Outcome{invalid(str_cat("malformed call: ", e->getDescription().cStr()))};
  }
  // Not ready answers a query; it is not a failure (and, as in CUDA, not a sticky error).
  const bool failed = !outcome.status.ok() && outcome.status.code() != ErrorCode::kNotReady;
  if (failed) {
    failed_calls_.fetch_add(1, std::memory_order_relaxed);
    // A copy that never ran must still give its staging back, or the client's FIFO stalls.
    kj::runCatchingExceptions([&] { release_staging_now(staging_end_of(call)); });
  }
  if (outcome.status.ok() && outcome.completes_on && call.getReply()) {
    outcome.status = after(*outcome.completes_on,
                           [this, seq](Status done) { post_completion(seq, std::move(done)); });
    outcome.deferred = outcome.status.ok();
  }
  if (outcome.deferred) return;
  if (failed || call.getReply()) {
    unsent_.push_back({seq, limited(std::move(outcome.status)), std::move(outcome.result)});
  }
}

Session::Outcome Session::dispatch(proto::Call::Reader call, uint64_t seq) {
  const bool reply = call.getReply();
  switch (call.which()) {
    case proto::Call::PING:
      return {Status(), call.getPing().getValue()};
    case proto::Call::MEM_ALLOCATE:
      return mem_allocate(call.getMemAllocate().getVa(), call.getMemAllocate().getBytes());
    case proto::Call::MEM_FREE:
      return mem_free(call.getMemFree().getVa());
    case proto::Call::MEMCPY_HTO_D:
      return memcpy_htod(call.getMemcpyHtoD());
    case proto::Call::MEMCPY_DTO_H:
      return memcpy_dtoh(call.getMemcpyDtoH());
    case proto::Call::MEMCPY_DTO_D:
      return memcpy_dtod(call.getMemcpyDtoD());
    case proto::Call::MEMSET:
      return memset(call.getMemset());
    case proto::Call::STREAM_CREATE:
      return stream_create(call.getStreamCreate().getStream(),
                           call.getStreamCreate().getPriority());
    case proto::Call::STREAM_DESTROY:
      return stream_destroy(call.getStreamDestroy().getStream());
    case proto::Call::STREAM_SYNCHRONIZE:
      return stream_synchronize(call.getStreamSynchronize().getStream(), seq, reply);
    case proto::Call::STREAM_QUERY: {
      auto s = stream(call.getStreamQuery().getStream());
      if (!s.ok()) return {s.status()};
      return {device_.query_stream(*s)};
    }
    case proto::Call::STREAM_WAIT_EVENT: {
      auto s = stream(call.getStreamWaitEvent().getStream());
      if (!s.ok()) return {s.status()};
      auto e = event(call.getStreamWaitEvent().getEvent());
      if (!e.ok()) return {e.status()};
      return {device_.wait_event(*s, *e), {}, false, *s};
    }
    case proto::Call::EVENT_CREATE:
      return event_create(call.getEventCreate().getEvent(),
                          call.getEventCreate().getDisableTiming());
    case proto::Call::EVENT_DESTROY:
      return event_destroy(call.getEventDestroy().getEvent());
    case proto::Call::EVENT_RECORD: {
      auto e = event(call.getEventRecord().getEvent());
      if (!e.ok()) return {e.status()};
      auto s = stream(call.getEventRecord().getStream());
      if (!s.ok()) return {s.status()};
      return {device_.record_event(*e, *s), {}, false, *s};
    }
    case proto::Call::EVENT_SYNCHRONIZE:
      return event_synchronize(call.getEventSynchronize().getEvent(), seq, reply);
    case proto::Call::EVENT_QUERY: {
      auto e = event(call.getEventQuery().getEvent());
      if (!e.ok()) return {e.status()};
      return {device_.query_event(*e)};
    }
    case proto::Call::EVENT_ELAPSED_TIME: {
      auto start = event(call.getEventElapsedTime().getStart());
      if (!start.ok()) return {start.status()};
      auto end = event(call.getEventElapsedTime().getEnd());
      if (!end.ok()) return {end.status()};
      auto ms = device_.elapsed_ms(*start, *end);
      if (!ms.ok()) return {ms.status()};
      return {Status(), *ms};
    }
    case proto::Call::DEVICE_SYNCHRONIZE:
      return device_synchronize(seq, reply);
    case proto::Call::MODULE_LOAD:
      return module_load(call.getModuleLoad());
    case proto::Call::MODULE_LOAD_CACHED:
      return module_load_cached(call.getModuleLoadCached());
    case proto::Call::MODULE_UNLOAD:
      return module_unload(call.getModuleUnload().getModule());
    case proto::Call::FUNCTION_GET:
      return function_get(call.getFunctionGet());
    case proto::Call::LAUNCH_KERNEL:
      return launch_kernel(call.getLaunchKernel());
  }
  const auto version = wire::current_protocol_version();
  return {error(ErrorCode::kNotSupported, "call type ", static_cast<unsigned>(call.which()),
                " is not known to this hiberd (protocol ", version.major, ".", version.minor,
                "); the client speaks a newer protocol")};
}

// ---- Memory ----

Session::Outcome Session::mem_allocate(uint64_t va, uint64_t bytes) {
  const uint64_t va_end = va_base_ + round_up(config_.va_bytes, granularity_);
  if (bytes == 0) return {invalid("memAllocate of 0 bytes")};
  if (va % granularity_ != 0) {
    return {invalid(str_cat("memAllocate at ", hex(va), ": not aligned to the allocation "
                            "granularity ", granularity_))};
  }
  if (bytes > va_end - va_base_) {
    return {error(ErrorCode::kOutOfMemory, "memAllocate of ", bytes,
                  " bytes is larger than the session's address range")};
  }
  const uint64_t rounded = round_up(bytes, granularity_);
  if (va < va_base_ || va > va_end - rounded) {
    return {invalid(str_cat("memAllocate [", hex(va), ", +", rounded,
                            ") is outside the session's grant [", hex(va_base_), ", ",
                            hex(va_end), ")"))};
  }
  auto next = allocations_.lower_bound(va);
  if (next != allocations_.end() && next->first < va + rounded) {
    return {invalid(str_cat("memAllocate [", hex(va), ", +", rounded, ") overlaps the allocation at ",
                            hex(next->first)))};
  }
  if (next != allocations_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > va) {
      return {invalid(str_cat("memAllocate [", hex(va), ", +", rounded,
                              ") overlaps the allocation at ", hex(prev->first)))};
    }
  }
  if (allocations_.size() >= kMaxAllocations) {
    return {error(ErrorCode::kOutOfMemory, "more than ", kMaxAllocations, " allocations")};
  }
  const uint64_t used = allocated_bytes_.load();
  if (rounded > config_.quota_bytes || used > config_.quota_bytes - rounded) {
    return {error(ErrorCode::kOutOfMemory, "memAllocate of ", rounded, " bytes exceeds the quota: ",
                  used, " of ", config_.quota_bytes, " bytes in use")};
  }
  auto memory = device_.create_physical(config_.gpu, rounded);
  if (!memory.ok()) return {memory.status().with_context("memAllocate")};
  Status mapped = device_.map(va, rounded, *memory, 0);
  if (mapped.ok()) {
    const int gpus[] = {config_.gpu};
    mapped = device_.set_access(va, rounded, gpus);
    if (!mapped.ok()) (void)device_.unmap(va, rounded);
  }
  if (!mapped.ok()) {
    (void)device_.release_physical(*memory);
    return {mapped.with_context("memAllocate")};
  }
  allocations_.emplace(va, Allocation{rounded, *memory});
  allocated_bytes_.fetch_add(rounded);
  return {};
}

Session::Outcome Session::mem_free(uint64_t va) {
  auto it = allocations_.find(va);
  if (it == allocations_.end()) {
    return {invalid(str_cat("memFree of ", hex(va), ": not the start of an allocation"))};
  }
  // As cudaFree: work already enqueued may still use the memory; wait for it.
  quiesce();
  Status unmapped = device_.unmap(va, it->second.bytes);
  Status released = device_.release_physical(it->second.memory);
  allocated_bytes_.fetch_sub(it->second.bytes);
  allocations_.erase(it);
  if (!unmapped.ok()) return {unmapped.with_context("memFree")};
  return {released.with_context("memFree")};
}

Status Session::check_device_range(uint64_t ptr, uint64_t bytes, std::string_view what) const {
  auto it = allocations_.upper_bound(ptr);
  if (it != allocations_.begin()) {
    --it;
    const uint64_t offset = ptr - it->first;
    if (offset < it->second.bytes && bytes <= it->second.bytes - offset) return Status();
  }
  return invalid(str_cat(what, ": [", hex(ptr), ", +", bytes,
                         ") is not inside one allocation of this session"));
}

Status Session::check_arena_range(uint64_t offset, uint64_t bytes, std::string_view what) const {
  if (wire::arena_range_ok(offset, bytes, channel_->arena().size())) return Status();
  return invalid(str_cat(what, ": arena range [", offset, ", +", bytes,
                         ") is outside the arena of ", channel_->arena().size(), " bytes"));
}

Status Session::track_staging(uint64_t staging_end, device::Stream s) {
  if (staging_end == 0) return Status();
  auto ticket = staging_.begin(staging_end);
  if (!ticket.ok()) return ticket.status();
  Status queued = after(s, [this, t = *ticket](Status) { staging_.finish(t); });
  if (!queued.ok()) staging_.finish(*ticket);
  return queued;
}

void Session::release_staging_now(uint64_t staging_end) {
  if (staging_end == 0) return;
  auto ticket = staging_.begin(staging_end);
  if (ticket.ok()) staging_.finish(*ticket);
}

uint64_t Session::staging_end_of(proto::Call::Reader call) {
  switch (call.which()) {
    case proto::Call::MEMCPY_HTO_D:
      return call.getMemcpyHtoD().getStagingEnd();
    case proto::Call::MEMCPY_DTO_H:
      return call.getMemcpyDtoH().getStagingEnd();
    case proto::Call::MODULE_LOAD:
      return call.getModuleLoad().getStagingEnd();
    default:
      return 0;
  }
}

Session::Outcome Session::memcpy_htod(proto::Call::MemcpyHtoD::Reader c) {
  const uint64_t bytes = c.getBytes();
  auto s = stream(c.getStream());
  if (!s.ok()) return {s.status()};
  if (bytes == 0) return {track_staging(c.getStagingEnd(), *s), {}, false, *s};
  Status checked = check_arena_range(c.getSrcOffset(), bytes, "memcpyHtoD source");
  if (checked.ok()) checked = check_device_range(c.getDst(), bytes, "memcpyHtoD destination");
  if (!checked.ok()) return {checked};
  Status copied =
      device_.copy_host_to_device(*s, c.getDst(), channel_->arena().data() + c.getSrcOffset(), bytes);
  if (!copied.ok()) return {copied};
  return {track_staging(c.getStagingEnd(), *s), {}, false, *s};
}

Session::Outcome Session::memcpy_dtoh(proto::Call::MemcpyDtoH::Reader c) {
  const uint64_t bytes = c.getBytes();
  auto s = stream(c.getStream());
  if (!s.ok()) return {s.status()};
  if (bytes == 0) return {track_staging(c.getStagingEnd(), *s), {}, false, *s};
  Status checked = check_arena_range(c.getDstOffset(), bytes, "memcpyDtoH destination");
  if (checked.ok()) checked = check_device_range(c.getSrc(), bytes, "memcpyDtoH source");
  if (!checked.ok()) return {checked};
  Status copied =
      device_.copy_device_to_host(*s, channel_->arena().data() + c.getDstOffset(), c.getSrc(), bytes);
  if (!copied.ok()) return {copied};
  return {track_staging(c.getStagingEnd(), *s), {}, false, *s};
}

Session::Outcome Session::memcpy_dtod(proto::Call::MemcpyDtoD::Reader c) {
  const uint64_t bytes = c.getBytes();
  auto s = stream(c.getStream());
  if (!s.ok()) return {s.status()};
  if (bytes == 0) return {Status(), {}, false, *s};
  Status checked = check_device_range(c.getSrc(), bytes, "memcpyDtoD source");
  if (checked.ok()) checked = check_device_range(c.getDst(), bytes, "memcpyDtoD destination");
  if (!checked.ok()) return {checked};
  return {device_.copy_device_to_device(*s, c.getDst(), c.getSrc(), bytes), {}, false, *s};
}

Session::Outcome Session::memset(proto::Call::Memset::Reader c) {
  const int element = c.getElementBytes();
  if (element != 1 && element != 2 && element != 4) {
    return {invalid(str_cat("memset element size ", element, " (must be 1, 2 or 4)"))};
  }
  auto s = stream(c.getStream());
  if (!s.ok()) return {s.status()};
  const uint64_t count = c.getCount();
  if (count == 0) return {Status(), {}, false, *s};
  if (count > UINT64_MAX / static_cast<uint64_t>(element)) return {invalid("memset size overflows")};
  Status checked = check_device_range(c.getDst(), count * element, "memset destination");
  if (!checked.ok()) return {checked};
  if (c.getDst() % static_cast<uint64_t>(element) != 0) {
    return {invalid(str_cat("memset destination ", hex(c.getDst()), " is not aligned to ", element,
                            " bytes"))};
  }
  return {device_.memset(*s, c.getDst(), c.getValue(), element, count), {}, false, *s};
}

// ---- Streams and events ----

Result<device::Stream> Session::stream(uint64_t handle) const {
  if (handle == 0) return *default_stream_;
  auto it = streams_.find(handle);
  if (it == streams_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown stream handle ", hex(handle));
  }
  return it->second;
}

Result<device::Event> Session::event(uint64_t handle) const {
  auto it = events_.find(handle);
  if (it == events_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown event handle ", hex(handle));
  }
  return it->second;
}

Session::Outcome Session::stream_create(uint64_t handle, int32_t priority) {
  Status usable = check_new_handle(streams_, handle, kMaxStreams, "streamCreate");
  if (!usable.ok()) return {usable};
  auto created = device_.create_stream(config_.gpu, priority);
  if (!created.ok()) return {created.status()};
  streams_.emplace(handle, *created);
  return {};
}

Session::Outcome Session::stream_destroy(uint64_t handle) {
  if (handle == 0) return {invalid("streamDestroy: the default stream cannot be destroyed")};
  auto it = streams_.find(handle);
  if (it == streams_.end()) {
    return {error(ErrorCode::kInvalidHandle, "streamDestroy: unknown stream handle ", hex(handle))};
  }
  device::Stream s = it->second;
  streams_.erase(it);
  // Work already on the stream still runs; this callback lets teardown know when it is done.
  Status tracked = after(s, [](Status) {});
  Status destroyed = device_.destroy_stream(s);
  return {tracked.ok() ? destroyed : tracked};
}

Session::Outcome Session::stream_synchronize(uint64_t handle, uint64_t seq, bool reply) {
  auto s = stream(handle);
  if (!s.ok()) return {s.status()};
  if (!reply) return {};
  Status queued = after(*s, [this, seq](Status done) { post_completion(seq, std::move(done)); });
  if (!queued.ok()) return {queued};
  return {Status(), {}, /*deferred=*/true};
}

Session::Outcome Session::event_create(uint64_t handle, bool disable_timing) {
  Status usable = check_new_handle(events_, handle, kMaxEvents, "eventCreate");
  if (!usable.ok()) return {usable};
  auto created = device_.create_event(config_.gpu, disable_timing);
  if (!created.ok()) return {created.status()};
  events_.emplace(handle, *created);
  return {};
}

Session::Outcome Session::event_destroy(uint64_t handle) {
  auto it = events_.find(handle);
  if (it == events_.end()) {
    return {error(ErrorCode::kInvalidHandle, "eventDestroy: unknown event handle ", hex(handle))};
  }
  device::Event e = it->second;
  events_.erase(it);
  return {device_.destroy_event(e)};
}

Session::Outcome Session::event_synchronize(uint64_t handle, uint64_t seq, bool reply) {
  auto e = event(handle);
  if (!e.ok()) return {e.status()};
  if (!reply) return {};
  // The synchronisation stream waits for the event's latest record, then reports.
  Status waited = device_.wait_event(*sync_stream_, *e);
  if (!waited.ok()) return {waited};
  Status queued =
      after(*sync_stream_, [this, seq](Status done) { post_completion(seq, std::move(done)); });
  if (!queued.ok()) return {queued};
  return {Status(), {}, true};
}

Session::Outcome Session::device_synchronize(uint64_t seq, bool reply) {
  if (!reply) return {};
  struct Countdown {
    std::mutex mutex;
    size_t remaining;
    Status first_error;
  };
  std::vector<device::Stream> all = {*default_stream_, *sync_stream_};
  for (const auto& [handle, s] : streams_) all.push_back(s);
  auto countdown = std::make_shared<Countdown>();
  countdown->remaining = all.size();
  for (const device::Stream& s : all) {
    Status queued = after(s, [this, seq, countdown](Status done) {
      bool last = false;
      Status result;
      {
        std::lock_guard<std::mutex> lock(countdown->mutex);
        if (!done.ok() && countdown->first_error.ok()) countdown->first_error = done;
        last = --countdown->remaining == 0;
        result = countdown->first_error;
      }
      if (last) post_completion(seq, std::move(result));
    });
    if (!queued.ok()) {
      // Account for the callbacks that will never come, so the last one still reports.
      std::lock_guard<std::mutex> lock(countdown->mutex);
      if (countdown->first_error.ok()) countdown->first_error = queued;
      if (--countdown->remaining == 0) return {countdown->first_error};
    }
  }
  return {Status(), {}, true};
}

// ---- Code ----

Session::Outcome Session::module_load(proto::Call::ModuleLoad::Reader c) {
  const uint64_t handle = c.getModule();
  const uint64_t bytes = c.getImageBytes();
  Status checked = check_arena_range(c.getImageOffset(), bytes, "moduleLoad image");
  if (checked.ok()) checked = check_new_handle(modules_, handle, kMaxModules, "moduleLoad");
  if (checked.ok() && bytes == 0) checked = Status(ErrorCode::kInvalidImage, "empty module image");
  // Hash and parse a private copy: the client can write its arena while we read, and the bytes
  // the cache keys an image by must be the bytes it loaded. A local, so that a large image's
  // memory goes back as soon as it is loaded.
  std::vector<std::byte> image;
  if (checked.ok()) {
    const std::byte* src = channel_->arena().data() + c.getImageOffset();
    image.assign(src, src + bytes);
  }
  // The image bytes are no longer needed whatever happens next. (On failure, execute()
  // releases the staging too; releasing an end twice is harmless.)
  release_staging_now(c.getStagingEnd());
  if (!checked.ok()) return {checked};
  // The image already loaded for any session if these bytes were; loaded now otherwise.
  auto module = module_cache_.acquire_by_image(image);
  if (!module.ok()) return {module.status().with_context("moduleLoad")};
  modules_.emplace(handle, *module);
  return {};
}

Session::Outcome Session::module_load_cached(proto::Call::ModuleLoadCached::Reader c) {
  const uint64_t handle = c.getModule();
  Status usable = check_new_handle(modules_, handle, kMaxModules, "moduleLoadCached");
  if (!usable.ok()) return {usable};
  auto digest = c.getSha256();
  if (digest.size() != std::tuple_size_v<Sha256>) {
    return {invalid(str_cat("moduleLoadCached: a SHA-256 of ", digest.size(), " bytes (it has ",
                            std::tuple_size_v<Sha256>, ")"))};
  }
  auto module = module_cache_.acquire_by_hash(
      std::span<const std::byte, 32>(reinterpret_cast<const std::byte*>(digest.begin()), 32));
  if (!module.ok()) return {module.status().with_context("moduleLoadCached")};
  modules_.emplace(handle, *module);
  return {};
}

Session::Outcome Session::module_unload(uint64_t handle) {
  auto it = modules_.find(handle);
  if (it == modules_.end()) {
    return {error(ErrorCode::kInvalidHandle, "moduleUnload: unknown module handle ", hex(handle))};
  }
  // Functions of the module handle die with it; launching one later is an unknown handle, not a
  // launch of freed code. The image itself stays loaded while other handles (of this session
  // or others) use it.
  std::erase_if(functions_, [handle](const auto& f) { return f.second.module == handle; });
  const ModuleCache::Ref ref = it->second;
  modules_.erase(it);
  return {module_cache_.release(ref).with_context("moduleUnload")};
}

Session::Outcome Session::function_get(proto::Call::FunctionGet::Reader c) {
  const uint64_t handle = c.getFunction();
  Status usable = check_new_handle(functions_, handle, kMaxFunctions, "functionGet");
  if (!usable.ok()) return {usable};
  auto module = modules_.find(c.getModule());
  if (module == modules_.end()) {
    return {error(ErrorCode::kInvalidHandle, "functionGet: unknown module handle ",
                  hex(c.getModule()))};
  }
  auto name = c.getName();
  if (name.size() == 0 || name.size() > wire::kMaxNameBytes) {
    return {invalid(str_cat("functionGet: a kernel name of ", name.size(), " bytes"))};
  }
  auto function =
      device_.get_function(module->second.module, std::string(name.cStr(), name.size()));
  if (!function.ok()) return {function.status()};
  auto info = device_.function_info(*function);
  if (!info.ok()) return {info.status()};
  functions_.emplace(handle, FunctionEntry{*function, c.getModule(), *info});
  return {Status(), *info};
}

Session::Outcome Session::launch_kernel(proto::Call::LaunchKernel::Reader c) {
  auto f = functions_.find(c.getFunction());
  if (f == functions_.end()) {
    return {error(ErrorCode::kInvalidHandle, "launchKernel: unknown function handle ",
                  hex(c.getFunction()))};
  }
  auto s = stream(c.getStream());
  if (!s.ok()) return {s.status()};
  auto params = c.getParams();
  if (params.size() != f->second.info.param_bytes()) {
    return {invalid(str_cat("launchKernel ", f->second.info.name, ": ", params.size(),
                            " bytes of parameters, the kernel takes ",
                            f->second.info.param_bytes()))};
  }
  device::LaunchConfig config;
  config.grid = {c.getGridX(), c.getGridY(), c.getGridZ()};
  config.block = {c.getBlockX(), c.getBlockY(), c.getBlockZ()};
  config.shared_memory_bytes = c.getSharedMemBytes();
  return {device_.launch(*s, f->second.function, config,
                         std::as_bytes(std::span(params.begin(), params.size()))),
          {}, false, *s};
}

// ---- Completion and teardown ----

Status Session::after(device::Stream s, std::function<void(Status)> fn) {
  {
    std::lock_guard<std::mutex> lock(callbacks_mutex_);
    ++pending_callbacks_;
  }
  Status queued = device_.add_callback(s, [this, fn = std::move(fn)](Status status) {
    fn(std::move(status));
    std::lock_guard<std::mutex> lock(callbacks_mutex_);
    if (--pending_callbacks_ == 0) callbacks_done_.notify_all();
  });
  if (!queued.ok()) {
    std::lock_guard<std::mutex> lock(callbacks_mutex_);
    if (--pending_callbacks_ == 0) callbacks_done_.notify_all();
  }
  return queued;
}

void Session::quiesce() {
  if (default_stream_) (void)device_.synchronize_stream(*default_stream_);
  if (sync_stream_) (void)device_.synchronize_stream(*sync_stream_);
  for (const auto& [handle, s] : streams_) (void)device_.synchronize_stream(s);
  std::unique_lock<std::mutex> lock(callbacks_mutex_);
  callbacks_done_.wait(lock, [this] { return pending_callbacks_ == 0; });
}

void Session::build_completions(capnp::MessageBuilder& message,
                                std::deque<CompletionRecord>::const_iterator first, size_t count) {
  auto list = message.initRoot<proto::ServerMessage>().initCompletions(static_cast<unsigned>(count));
  for (size_t i = 0; i < count; ++i, ++first) {
    const CompletionRecord& r = *first;
    auto c = list[static_cast<unsigned>(i)];
    c.setSeq(r.seq);
    c.setCode(static_cast<uint32_t>(r.status.code()));
    if (!r.status.ok()) c.setMessage(r.status.message());
    auto result = c.initResult();
    if (const uint64_t* ping = std::get_if<uint64_t>(&r.result)) {
      result.setPing(*ping);
    } else if (const float* ms = std::get_if<float>(&r.result)) {
      result.setElapsedMs(*ms);
    } else if (const KernelInfo* info = std::get_if<KernelInfo>(&r.result)) {
      auto k = result.initKernel();
      k.setName(info->name);
      auto params = k.initParams(static_cast<unsigned>(info->params.size()));
      for (size_t p = 0; p < info->params.size(); ++p) {
        params[static_cast<unsigned>(p)].setOffset(info->params[p].offset);
        params[static_cast<unsigned>(p)].setBytes(info->params[p].bytes);
      }
    } else {
      result.setNone();
    }
  }
}

void Session::post_completion(uint64_t seq, Status status, CallResult result) {
  if (!status.ok()) failed_calls_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    posted_.push_back({seq, limited(std::move(status)), std::move(result)});
  }
  channel_->interrupt();
}

Status Session::deliver() {
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    for (CompletionRecord& r : posted_) unsent_.push_back(std::move(r));
    posted_.clear();
  }
  // Each message must be one ring record, so that it is written whole or not at all: a message
  // cut off half-way would leave the client's ring in the middle of a message.
  const uint64_t limit = channel_->max_unfragmented_message_bytes();
  while (!unsent_.empty()) {
    size_t count = std::min(unsent_.size(), kCompletionsPerMessage);
    std::optional<capnp::MallocMessageBuilder> message;
    auto build = [&] {
      message.emplace();
      build_completions(*message, unsent_.begin(), count);
    };
    build();
    while (capnp::computeSerializedSizeInWords(*message) * sizeof(capnp::word) > limit) {
      if (count > 1) {
        count /= 2;
      } else {
        // One completion alone does not fit (a huge kernel description): report that instead.
        CompletionRecord& r = unsent_.front();
        r = {r.seq,
             error(ErrorCode::kInvalidValue, "the reply to call ", r.seq,
                   " does not fit the completion ring (at most ", limit, " bytes per message)"),
             {}};
      }
      build();
    }
    // Never wait: if the client has not made room, the records stay queued.
    Status sent = channel_->send(*message, std::chrono::nanoseconds(0));
    if (sent.code() == ErrorCode::kTimeout) break;
    if (sent.code() == ErrorCode::kDeinitialized) {
      unsent_.clear();
      return Status();
    }
    if (!sent.ok()) return sent.with_context("completion ring");
    unsent_.erase(unsent_.begin(), unsent_.begin() + static_cast<long>(count));
  }
  if (unsent_.size() > kMaxUnsentCompletions) {
    return error(ErrorCode::kIllegalState, unsent_.size(),
                 " completions are waiting: the client does not read its completion ring");
  }
  return Status();
}

void Session::send_closing(const Status& why) {
  capnp::MallocMessageBuilder message;
  auto closing = message.initRoot<proto::ServerMessage>().initClosing();
  closing.setCode(static_cast<uint32_t>(why.code()));
  closing.setMessage(why.message());
  // Best effort, briefly: the client may be the reason the session ends.
  (void)channel_->send(message, std::chrono::milliseconds(100));
}

void Session::teardown() {
  if (torn_down_.exchange(true)) return;
  channel_->close();
  quiesce();
  for (const auto& [handle, e] : events_) (void)device_.destroy_event(e);
  events_.clear();
  for (const auto& [handle, s] : streams_) (void)device_.destroy_stream(s);
  streams_.clear();
  if (default_stream_) (void)device_.destroy_stream(*default_stream_);
  if (sync_stream_) (void)device_.destroy_stream(*sync_stream_);
  default_stream_.reset();
  sync_stream_.reset();
  functions_.clear();
  // The session's work is done (quiesce): its references go back; an image no other session
  // uses is unloaded.
  for (const auto& [handle, ref] : modules_) {
    Status released = module_cache_.release(ref);
    if (!released.ok()) LOG(ERROR) << "session " << identity_.id << ": " << released;
  }
  modules_.clear();
  for (const auto& [va, a] : allocations_) {
    Status unmapped = device_.unmap(va, a.bytes);
    Status released = device_.release_physical(a.memory);
    if (!unmapped.ok() || !released.ok()) {
      LOG(ERROR) << "session " << identity_.id << ": releasing " << hex(va) << ": "
                 << (unmapped.ok() ? released : unmapped);
    }
  }
  allocations_.clear();
  allocated_bytes_ = 0;
  Status freed = device_.free_address_range(va_base_, round_up(config_.va_bytes, granularity_));
  if (!freed.ok()) LOG(ERROR) << "session " << identity_.id << ": " << freed;
  if (arena_registered_) {
    Status unregistered = device_.unregister_host_memory(channel_->arena().data());
    if (!unregistered.ok()) LOG(ERROR) << "session " << identity_.id << ": " << unregistered;
    arena_registered_ = false;
  }
}

}  // namespace hiber::server
