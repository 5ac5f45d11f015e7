#include "server/session.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include <glog/logging.h>

#include "wire/call_codec.h"
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

Status invalid(const std::string& message) { return Status(ErrorCode::kInvalidValue, message); }

// Checks that a client-chosen handle can name a new object of `table`: not zero (reserved),
// not in use, and the session under its limit for that kind of object.
template <typename Table>
Status check_new_handle(const Table& table, typename Table::key_type handle, size_t limit,
                        std::string_view call) {
  if (handle.is_zero()) return invalid(str_cat(call, ": handle 0 is reserved"));
  if (table.count(handle) != 0) {
    return invalid(str_cat(call, ": handle ", hex(handle.value()), " is already in use"));
  }
  if (table.size() >= limit) {
    return error(ErrorCode::kOutOfMemory, call, ": the session already holds ", limit);
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Session>> Session::create(device::Device& device, ModuleCache& modules,
                                                 DevicePools& pools, ModelRepository& repository,
                                                 GpuLessor& lessor, SessionIdentity identity,
                                                 const SessionConfig& config) {
  auto channel = wire::ServerChannel::create(config.channel);
  if (!channel.ok()) return channel.status().with_context("creating the session channel");
  auto memory = FunctionMemory::create(device, pools, repository, identity.id, config.va_bytes,
                                       config.quota_bytes, config.memory);
  if (!memory.ok()) return memory.status().with_context("the session's memory");
  std::unique_ptr<Session> session(new Session(device, modules, lessor, std::move(identity),
                                               config, std::move(channel).value(),
                                               std::move(memory).value()));
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
  return session;
}

Session::Session(device::Device& device, ModuleCache& modules, GpuLessor& lessor,
                 SessionIdentity identity, const SessionConfig& config,
                 std::unique_ptr<wire::ServerChannel> channel,
                 std::shared_ptr<FunctionMemory> memory)
    : device_(device),
      module_cache_(modules),
      lessor_(lessor),
      identity_(std::move(identity)),
      config_(config),
      gpu_count_(device.gpu_count()),
      started_(std::chrono::steady_clock::now()),
      channel_(std::move(channel)),
      memory_(std::move(memory)),
      staging_([this](uint64_t end) { channel_->release_staging(end); }) {
  default_stream_.per_gpu.resize(gpu_count_);
  sync_streams_.resize(gpu_count_);
  swap_streams_.resize(gpu_count_);
}

Session::~Session() {
  CHECK(!thread_.joinable()) << "session " << identity_.id << " destroyed while running";
  teardown();
}

wire::SessionInfo Session::welcome() const {
  wire::SessionInfo info;
  info.session_id = identity_.id;
  info.server_version = wire::current_protocol_version();
  info.grant.va_base = memory_->va_base();
  info.grant.va_bytes = memory_->va_bytes();
  info.grant.quota_bytes = config_.quota_bytes;
  info.grant.allocation_granularity = memory_->granularity();
  info.layout = channel_->layout();
  // The function sees one device, ordinal 0: whichever GPU a lease gives it. The node's GPUs
  // are one model (a pool of one kind), so GPU 0's properties describe every lease.
  const device::DeviceProperties& props = device_.properties(0);
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
  // Wakes the session thread wherever it waits: for mail, or on the channel.
  mail_.close();
  channel_->interrupt();
}

void Session::join() {
  if (thread_.joinable()) thread_.join();
}

SessionSnapshot Session::snapshot() const {
  SessionSnapshot s;
  s.identity = identity_;
  s.gpu = bound_gpu_.load();
  s.allocated_bytes = memory_->allocated_bytes();
  s.quota_bytes = config_.quota_bytes;
  s.batches = batches_.load();
  s.calls = calls_.load();
  s.failed_calls = failed_calls_.load();
  s.malformed_messages = malformed_messages_.load();
  s.leases = leases_.load();
  s.connected_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return s;
}

// ---- Leases ----

void Session::grant(const Lease& lease) { post(GrantCommand{lease}); }

void Session::end_lease(uint64_t lease) { post(EndCommand{lease, Status()}); }

void Session::fail(uint64_t lease, const Status& why) {
  post(EndCommand{lease, why.ok() ? Status(ErrorCode::kUnknown, "GPU failed") : why});
}

void Session::post(Mail mail) {
  // A closed session drops it: its thread is ending and acts on nothing more.
  if (mail_.post(std::move(mail))) channel_->interrupt();
}

std::vector<Session::Command> Session::take_mail() {
  std::vector<Command> commands;
  for (Mail& mail : mail_.take_all()) {
    if (auto* completion = std::get_if<CompletionRecord>(&mail)) {
      unsent_.push_back(std::move(*completion));
    } else if (auto* grant = std::get_if<GrantCommand>(&mail)) {
      commands.emplace_back(std::move(*grant));
    } else {
      commands.emplace_back(std::get<EndCommand>(std::move(mail)));
    }
  }
  return commands;
}

void Session::run_commands(std::vector<Command> commands) {
  for (Command& command : commands) {
    if (auto* grant = std::get_if<GrantCommand>(&command)) {
      begin_lease(grant->lease);
    } else {
      const EndCommand& end = std::get<EndCommand>(command);
      if (!lease_ || lease_->id != end.lease) {
        // Not (or no longer) held: its grant failed and was released already.
        continue;
      }
      finish_lease(end.failure);
    }
  }
}

void Session::begin_lease(const Lease& lease) {
  if (lease_) {
    // The controller grants one lease at a time; a second one is its bug. Refuse it loudly
    // rather than run on two GPUs.
    LOG(ERROR) << "session " << identity_.id << ": lease " << lease.id << " on GPU " << lease.gpu
               << " granted while lease " << lease_->id << " is held; refusing it";
    lessor_.streaming(identity_.id, lease.id,
                      Status(ErrorCode::kIllegalState, "a second lease while one is held"));
    lessor_.released(identity_.id, lease.id, Status());
    return;
  }
  asked_for_gpu_ = false;
  leases_.fetch_add(1, std::memory_order_relaxed);
  const int gpu = lease.gpu;
  // The swap runs on a stream of its own on the lease's GPU, so client work queued behind it
  // waits only for the groups it touches.
  auto swap_stream = device_stream(swap_streams_, 0, gpu);
  Status bound = swap_stream.status();
  if (bound.ok()) {
    const uint64_t session = identity_.id;
    const uint64_t id = lease.id;
    bound = memory_->bind(
        lease, *swap_stream,
        [this, session, id](const Status& done, const SwapReport& report) {
          lessor_.swap_done(session, id, done, report);
        },
        [this](int g, const memory::Shortfall& s) { return lessor_.make_room(identity_.id, g, s); });
  }
  lessor_.streaming(identity_.id, lease.id, bound);
  if (!bound.ok()) {
    LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id
                 << "): cannot run on GPU " << gpu << ": " << bound;
    // The calls waiting for this lease fail rather than wait for the next one.
    lease_failure_ = bound.with_context(str_cat("GPU ", gpu));
    quiesce();
    (void)memory_->unbind();
    lessor_.released(identity_.id, lease.id, bound);
    return;
  }
  lease_ = lease;
  bound_gpu_.store(gpu);
  last_gpu_call_ = std::chrono::steady_clock::now();
}

void Session::finish_lease(const Status& failure) {
  const Lease lease = *lease_;
  if (!failure.ok()) {
    LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id << "): GPU "
                 << lease.gpu << " failed under it: " << failure;
    // Sequence 0: an error of the session, which the client makes sticky.
    unsent_.push_back({0, limited(failure.with_context(str_cat("GPU ", lease.gpu))), {}});
  }
  // Nothing of this function may run on the GPU once it is handed back.
  quiesce();
  Status unbound = memory_->unbind();
  if (!unbound.ok()) LOG(ERROR) << "session " << identity_.id << ": unmapping: " << unbound;
  lease_.reset();
  bound_gpu_.store(-1);
  lessor_.released(identity_.id, lease.id, failure.ok() ? unbound : failure);
}

// ---- The call stream ----

void Session::run() {
  std::chrono::milliseconds retry = kMinRetry;
  while (true) {
    std::vector<Command> commands = take_mail();
    const size_t unsent_before = unsent_.size();
    Status delivered = deliver();
    if (!delivered.ok()) {
      LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id << ", pid "
                   << identity_.peer.pid << "): " << delivered << "; ending the session";
      send_closing(delivered);
      channel_->close();
      break;
    }
    if (channel_->closed()) break;
    run_commands(std::move(commands));
    retry = unsent_.size() < unsent_before ? kMinRetry : std::min(retry * 2, kMaxRetry);
    const std::chrono::nanoseconds stuck =
        unsent_.empty() ? std::chrono::nanoseconds(std::chrono::hours(1)) : std::chrono::nanoseconds(retry);

    if (held_) {
      resume_held(stuck);
      continue;
    }

    // An implicit lease the function no longer uses goes back: no GPU call for a while, and no
    // work of its left on the GPU (a program waiting for its kernels keeps its GPU, so it does
    // not move while it computes).
    std::chrono::nanoseconds timeout = stuck;
    if (lease_ && lease_->implicit) {
      const auto idle = std::chrono::steady_clock::now() - last_gpu_call_;
      if (idle >= config_.implicit_lease_idle) {
        if (!work_pending()) {
          finish_lease(Status());
          continue;
        }
        last_gpu_call_ = std::chrono::steady_clock::now();
        continue;
      }
      timeout = std::min<std::chrono::nanoseconds>(timeout, config_.implicit_lease_idle - idle);
    }
    Status received = channel_->receive(request_, timeout);
    // kNotReady: a command or a completion is waiting; kTimeout: time to retry or to release.
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
    batches_.fetch_add(1, std::memory_order_relaxed);
    run_request(0);
  }
  teardown();
  if (on_exit_) on_exit_();
}

void Session::run_request(uint32_t first) {
  held_ = handle_message(request_, first);
  // Keep the buffer for the next message, unless a rare huge one made it big.
  if (!held_ && request_.size() > kKeptMessageBytes) request_ = wire::Message();
}

void Session::resume_held(std::chrono::nanoseconds wait) {
  const uint32_t first = *held_;
  if (lease_) {
    run_request(first);
    return;
  }
  if (!lease_failure_.ok()) {
    held_.reset();
    fail_held(request_, first, std::exchange(lease_failure_, Status()));
    return;
  }
  if (!asked_for_gpu_) {
    asked_for_gpu_ = true;
    lessor_.need_gpu(identity_.id);
  }
  mail_.wait_for(wait);
}

std::optional<uint32_t> Session::handle_message(const wire::Message& message, uint32_t first) {
  std::optional<uint32_t> stopped_at;
  Status read = wire::read_message<proto::Batch>(
      message, "batch", [&](proto::Batch::Reader batch) -> Status {
        auto calls = batch.getCalls();
        if (first == 0) {
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
            for (auto call : calls) last_end = std::max(last_end, wire::staging_end(call));
            release_staging_now(last_end);
            return refused;
          }
        }
        for (uint32_t i = first; i < calls.size(); ++i) {
          if (!lease_ && wire::runs_on_gpu(calls[i].which())) {
            stopped_at = i;
            return Status();
          }
          execute(calls[i], next_seq_++);
        }
        return Status();
      });
  if (!read.ok()) {
    malformed_messages_.fetch_add(1, std::memory_order_relaxed);
    LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id
                 << "): rejected a message: " << read;
    // Sequence 0: an error of the session, not of one call. The client makes it sticky.
    unsent_.push_back({0, limited(read), {}});
    return std::nullopt;
  }
  return stopped_at;
}

void Session::fail_held(const wire::Message& message, uint32_t first, const Status& why) {
  const Status failure = limited(why);
  // Once, as an error of the session: the client makes it sticky, as a lost context would be.
  unsent_.push_back({0, failure, {}});
  (void)wire::read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) {
    auto calls = batch.getCalls();
    for (uint32_t i = first; i < calls.size(); ++i) {
      const uint64_t seq = next_seq_++;
      calls_.fetch_add(1, std::memory_order_relaxed);
      failed_calls_.fetch_add(1, std::memory_order_relaxed);
      kj::runCatchingExceptions([&] {
        release_staging_now(wire::staging_end(calls[i]));
        if (calls[i].getReply()) unsent_.push_back({seq, failure, {}});
      });
    }
    return Status();
  });
}

void Session::execute(proto::Call::Reader call, uint64_t seq) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  Outcome outcome;
  // A field the client encoded wrongly throws when read; that fails this call only.
  VLOG(3) << "session " << identity_.id << ": call " << seq << " " << wire::call_name(call.which());
  kj::Maybe<kj::Exception> thrown = kj::runCatchingExceptions([&] {
    if (lease_ && wire::runs_on_gpu(call.which())) last_gpu_call_ = std::chrono::steady_clock::now();
    outcome = dispatch(call, seq);
  });
  KJ_IF_MAYBE(e, thrown) {
    outcome = Outcome{invalid(str_cat("malformed call (", wire::call_name(call.which()),
                                      "): ", e->getDescription().cStr()))};
  }
  // Not ready answers a query; it is not a failure (and, as in CUDA, not a sticky error).
  const bool failed = !outcome.status.ok() && outcome.status.code() != ErrorCode::kNotReady;
  if (failed) {
    failed_calls_.fetch_add(1, std::memory_order_relaxed);
    // A copy that never ran must still give its staging back, or the client's FIFO stalls.
    kj::runCatchingExceptions([&] { release_staging_now(wire::staging_end(call)); });
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
  switch (call.which()) {
#define HIBER_DISPATCH_kAsync(Name, handler) return handler(wire::read_call<wire::calls::Name>(call));
#define HIBER_DISPATCH_kSync(Name, handler) \
  return handler(wire::read_call<wire::calls::Name>(call), seq, call.getReply());
#define HIBER_DISPATCH(Name, name, WHICH, where, timing, shape, handler, fields) \
  case proto::Call::WHICH:                                                       \
    HIBER_DISPATCH_##timing(Name, handler)
    HIBER_CALLS(HIBER_DISPATCH, HIBER_CALL_IGNORED)
#undef HIBER_DISPATCH
#undef HIBER_DISPATCH_kSync
#undef HIBER_DISPATCH_kAsync
  }
  const auto version = wire::current_protocol_version();
  return {error(ErrorCode::kNotSupported, "call type ", static_cast<unsigned>(call.which()),
                " is not known to this hiberd (protocol ", version.major, ".", version.minor,
                "); the client speaks a newer protocol")};
}

// ---- Memory ----

Session::Outcome Session::ping(const wire::calls::Ping& c) { return {Status(), c.value}; }

Session::Outcome Session::mem_allocate(const wire::calls::MemAllocate& c) {
  // Placed and mapped at once under a lease; otherwise recorded, and placed by the next lease.
  const int gpu = lease_ ? lease_->gpu : -1;
  Status added = memory_->add_block(
      c.va, c.bytes, gpu,
      [this](int g, const memory::Shortfall& s) { return lessor_.make_room(identity_.id, g, s); });
  return {added.with_context("memAllocate")};
}

Session::Outcome Session::mem_free(const wire::calls::MemFree& c) {
  if (!memory_->is_block(c.va)) {
    return {invalid(str_cat("memFree of ", hex(c.va), ": not the start of an allocation"))};
  }
  // As cudaFree: work already enqueued may still use the memory; wait for it.
  quiesce();
  return {memory_->remove_block(c.va).with_context("memFree")};
}

Status Session::check_arena_range(uint64_t offset, uint64_t bytes, std::string_view what) const {
  if (wire::arena_range_ok(offset, bytes, channel_->arena().size())) return Status();
  return invalid(str_cat(what, ": arena range [", offset, ", +", bytes,
                         ") is outside the arena of ", channel_->arena().size(), " bytes"));
}

Status Session::before_access(device::Stream stream, uint64_t ptr, uint64_t bytes, bool write) {
  waits_.clear();
  memory_->access(ptr, bytes, write, &waits_);
  for (const device::Event& e : waits_) HIBER_RETURN_IF_ERROR(device_.wait_event(stream, e));
  return Status();
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

Session::Outcome Session::memcpy_htod(const wire::calls::MemcpyHtoD& c) {
  const uint64_t bytes = c.bytes;
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  if (bytes == 0) return {track_staging(c.staging_end, *s), {}, false, *s};
  Status checked = check_arena_range(c.src_offset, bytes, "memcpyHtoD source");
  if (checked.ok()) checked = memory_->check_range(c.dst, bytes, "memcpyHtoD destination");
  if (checked.ok()) checked = before_access(*s, c.dst, bytes, /*write=*/true);
  if (!checked.ok()) return {checked};
  const std::byte* data = channel_->arena().data() + c.src_offset;
  Status copied = device_.copy_host_to_device(*s, c.dst, data, bytes);
  if (!copied.ok()) return {copied};
  // Looked at while the copy runs (pointer tables, for pipelining), before any later call of
  // the session; the staging stays the client's to reuse only after track_staging's callback.
  memory_->storing(c.dst, std::span(data, bytes));
  return {track_staging(c.staging_end, *s), {}, false, *s};
}

Session::Outcome Session::memcpy_dtoh(const wire::calls::MemcpyDtoH& c) {
  const uint64_t bytes = c.bytes;
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  if (bytes == 0) return {track_staging(c.staging_end, *s), {}, false, *s};
  Status checked = check_arena_range(c.dst_offset, bytes, "memcpyDtoH destination");
  if (checked.ok()) checked = memory_->check_range(c.src, bytes, "memcpyDtoH source");
  if (checked.ok()) checked = before_access(*s, c.src, bytes, /*write=*/false);
  if (!checked.ok()) return {checked};
  Status copied =
      device_.copy_device_to_host(*s, channel_->arena().data() + c.dst_offset, c.src, bytes);
  if (!copied.ok()) return {copied};
  return {track_staging(c.staging_end, *s), {}, false, *s};
}

Session::Outcome Session::memcpy_dtod(const wire::calls::MemcpyDtoD& c) {
  const uint64_t bytes = c.bytes;
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  if (bytes == 0) return {Status(), {}, false, *s};
  Status checked = memory_->check_range(c.src, bytes, "memcpyDtoD source");
  if (checked.ok()) checked = memory_->check_range(c.dst, bytes, "memcpyDtoD destination");
  if (checked.ok()) checked = before_access(*s, c.src, bytes, /*write=*/false);
  if (checked.ok()) checked = before_access(*s, c.dst, bytes, /*write=*/true);
  if (!checked.ok()) return {checked};
  memory_->copying(c.dst, c.src);
  return {device_.copy_device_to_device(*s, c.dst, c.src, bytes), {}, false, *s};
}

Session::Outcome Session::memset(const wire::calls::Memset& c) {
  const int element = c.element_bytes;
  if (element != 1 && element != 2 && element != 4) {
    return {invalid(str_cat("memset element size ", element, " (must be 1, 2 or 4)"))};
  }
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  const uint64_t count = c.count;
  if (count == 0) return {Status(), {}, false, *s};
  if (count > UINT64_MAX / static_cast<uint64_t>(element)) return {invalid("memset size overflows")};
  Status checked = memory_->check_range(c.dst, count * element, "memset destination");
  if (!checked.ok()) return {checked};
  if (c.dst % static_cast<uint64_t>(element) != 0) {
    return {invalid(str_cat("memset destination ", hex(c.dst), " is not aligned to ", element,
                            " bytes"))};
  }
  checked = before_access(*s, c.dst, count * element, /*write=*/true);
  if (!checked.ok()) return {checked};
  return {device_.memset(*s, c.dst, c.value, element, count), {}, false, *s};
}

// ---- Streams and events ----

Result<Session::StreamEntry*> Session::stream_entry(wire::StreamHandle handle) {
  if (handle.is_zero()) return &default_stream_;
  auto it = streams_.find(handle);
  if (it == streams_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown stream handle ", hex(handle.value()));
  }
  return &it->second;
}

Result<Session::EventEntry*> Session::event_entry(wire::EventHandle handle) {
  auto it = events_.find(handle);
  if (it == events_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown event handle ", hex(handle.value()));
  }
  return &it->second;
}

Result<device::Stream> Session::device_stream(std::vector<std::optional<device::Stream>>& per_gpu,
                                              int32_t priority, int gpu) {
  std::optional<device::Stream>& slot = per_gpu[gpu];
  if (!slot) {
    auto created = device_.create_stream(gpu, priority);
    if (!created.ok()) return created.status();
    slot = *created;
  }
  return *slot;
}

Result<device::Stream> Session::work_stream(wire::StreamHandle handle) {
  HIBER_ASSIGN_OR_RETURN(StreamEntry * entry, stream_entry(handle));
  HIBER_ASSIGN_OR_RETURN(device::Stream s, device_stream(entry->per_gpu, entry->priority, lease_->gpu));
  entry->last_gpu = lease_->gpu;
  return s;
}

Session::Outcome Session::stream_create(const wire::calls::StreamCreate& c) {
  Status usable = check_new_handle(streams_, c.stream, kMaxStreams, "streamCreate");
  if (!usable.ok()) return {usable};
  StreamEntry entry;
  entry.priority = c.priority;
  entry.per_gpu.resize(gpu_count_);
  streams_.emplace(c.stream, std::move(entry));
  return {};
}

Session::Outcome Session::stream_destroy(const wire::calls::StreamDestroy& c) {
  if (c.stream.is_zero()) return {invalid("streamDestroy: the default stream cannot be destroyed")};
  auto it = streams_.find(c.stream);
  if (it == streams_.end()) {
    return {error(ErrorCode::kInvalidHandle, "streamDestroy: unknown stream handle ",
                  hex(c.stream.value()))};
  }
  const StreamEntry entry = std::move(it->second);
  streams_.erase(it);
  Status result;
  for (const std::optional<device::Stream>& s : entry.per_gpu) {
    if (!s) continue;
    // Work already on the stream still runs; this callback lets teardown know when it is done.
    Status tracked = after(*s, [](Status) {});
    Status destroyed = device_.destroy_stream(*s);
    if (result.ok()) result = tracked.ok() ? destroyed : tracked;
  }
  return {result};
}

Session::Outcome Session::stream_synchronize(const wire::calls::StreamSynchronize& c, uint64_t seq, bool reply) {
  auto entry = stream_entry(c.stream);
  if (!entry.ok()) return {entry.status()};
  if (!reply) return {};
  StreamEntry& e = **entry;
  // Work drained when a lease ended reports its failure here, once, as CUDA would have.
  if (!e.drained_error.ok()) return {std::exchange(e.drained_error, Status())};
  if (e.last_gpu < 0 || !e.per_gpu[e.last_gpu]) return {};
  Status queued = after(*e.per_gpu[e.last_gpu],
                        [this, seq](Status done) { post_completion(seq, std::move(done)); });
  if (!queued.ok()) return {queued};
  return {Status(), {}, /*deferred=*/true};
}

Session::Outcome Session::stream_query(const wire::calls::StreamQuery& c) {
  auto entry = stream_entry(c.stream);
  if (!entry.ok()) return {entry.status()};
  StreamEntry& e = **entry;
  if (!e.drained_error.ok()) return {std::exchange(e.drained_error, Status())};
  if (e.last_gpu < 0 || !e.per_gpu[e.last_gpu]) return {};
  return {device_.query_stream(*e.per_gpu[e.last_gpu])};
}

Session::Outcome Session::stream_wait_event(const wire::calls::StreamWaitEvent& c) {
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  auto e = event_entry(c.event);
  if (!e.ok()) return {e.status()};
  // An event never recorded is complete; one recorded under an earlier lease was drained when
  // that lease ended. Only a record on this GPU can still be pending.
  const EventEntry& entry = **e;
  if (entry.last_gpu != lease_->gpu) return {Status(), {}, false, *s};
  return {device_.wait_event(*s, *entry.per_gpu[entry.last_gpu]), {}, false, *s};
}

Session::Outcome Session::event_create(const wire::calls::EventCreate& c) {
  Status usable = check_new_handle(events_, c.event, kMaxEvents, "eventCreate");
  if (!usable.ok()) return {usable};
  EventEntry entry;
  entry.disable_timing = c.disable_timing;
  entry.per_gpu.resize(gpu_count_);
  events_.emplace(c.event, std::move(entry));
  return {};
}

Session::Outcome Session::event_destroy(const wire::calls::EventDestroy& c) {
  auto it = events_.find(c.event);
  if (it == events_.end()) {
    return {error(ErrorCode::kInvalidHandle, "eventDestroy: unknown event handle ",
                  hex(c.event.value()))};
  }
  const EventEntry entry = std::move(it->second);
  events_.erase(it);
  Status result;
  for (const std::optional<device::Event>& e : entry.per_gpu) {
    if (!e) continue;
    Status destroyed = device_.destroy_event(*e);
    if (result.ok()) result = destroyed;
  }
  return {result};
}

Session::Outcome Session::event_record(const wire::calls::EventRecord& c) {
  auto e = event_entry(c.event);
  if (!e.ok()) return {e.status()};
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  EventEntry& entry = **e;
  const int gpu = lease_->gpu;
  if (!entry.per_gpu[gpu]) {
    auto created = device_.create_event(gpu, entry.disable_timing);
    if (!created.ok()) return {created.status()};
    entry.per_gpu[gpu] = *created;
  }
  entry.last_gpu = gpu;
  Status recorded = device_.record_event(*entry.per_gpu[gpu], *s);
  if (recorded.ok() && !entry.disable_timing) {
    entry.completed_ns->store(0);
    recorded = after(*s, [completed = entry.completed_ns](Status) {
      completed->store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count());
    });
  }
  return {recorded, {}, false, *s};
}

Session::Outcome Session::event_synchronize(const wire::calls::EventSynchronize& c, uint64_t seq, bool reply) {
  auto e = event_entry(c.event);
  if (!e.ok()) return {e.status()};
  if (!reply) return {};
  const EventEntry& entry = **e;
  if (entry.last_gpu < 0) return {};
  const int gpu = entry.last_gpu;
  auto sync = device_stream(sync_streams_, 0, gpu);
  if (!sync.ok()) return {sync.status()};
  // The synchronisation stream waits for the event's latest record, then reports.
  Status waited = device_.wait_event(*sync, *entry.per_gpu[gpu]);
  if (!waited.ok()) return {waited};
  Status queued = after(*sync, [this, seq](Status done) { post_completion(seq, std::move(done)); });
  if (!queued.ok()) return {queued};
  return {Status(), {}, true};
}

Session::Outcome Session::event_query(const wire::calls::EventQuery& c) {
  auto e = event_entry(c.event);
  if (!e.ok()) return {e.status()};
  const EventEntry& entry = **e;
  if (entry.last_gpu < 0) return {};
  return {device_.query_event(*entry.per_gpu[entry.last_gpu])};
}

Session::Outcome Session::event_elapsed(const wire::calls::EventElapsedTime& c) {
  auto a = event_entry(c.start);
  if (!a.ok()) return {a.status()};
  auto b = event_entry(c.end);
  if (!b.ok()) return {b.status()};
  const EventEntry& first = **a;
  const EventEntry& last = **b;
  if (first.last_gpu < 0 || last.last_gpu < 0) {
    return {error(ErrorCode::kInvalidHandle, "eventElapsedTime: an event was never recorded")};
  }
  if (first.disable_timing || last.disable_timing) {
    return {error(ErrorCode::kInvalidHandle, "eventElapsedTime: an event has timing disabled")};
  }
  if (first.last_gpu != last.last_gpu) {
    // Recorded under leases on different GPUs: timed on the host, when each record completed.
    const int64_t a = first.completed_ns->load(), b = last.completed_ns->load();
    if (a == 0 || b == 0) {
      return {error(ErrorCode::kNotReady, "eventElapsedTime: an event has not completed")};
    }
    return {Status(), static_cast<float>(static_cast<double>(b - a) / 1e6)};
  }
  auto ms = device_.elapsed_ms(*first.per_gpu[first.last_gpu], *last.per_gpu[last.last_gpu]);
  if (!ms.ok()) return {ms.status()};
  return {Status(), *ms};
}

Session::Outcome Session::device_synchronize(const wire::calls::DeviceSynchronize&, uint64_t seq, bool reply) {
  if (!reply) return {};
  struct Countdown {
    std::mutex mutex;
    size_t remaining;
    Status first_error;
  };
  // Failures of work drained at the end of a lease come first.
  for (StreamEntry* e : all_entries()) {
    if (!e->drained_error.ok()) return {std::exchange(e->drained_error, Status())};
  }
  const std::vector<device::Stream> all = all_streams();
  if (all.empty()) return {};
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

Session::Outcome Session::module_load(const wire::calls::ModuleLoad& c) {
  const wire::ModuleHandle handle = c.module;
  const uint64_t bytes = c.image_bytes;
  Status checked = check_arena_range(c.image_offset, bytes, "moduleLoad image");
  if (checked.ok()) checked = check_new_handle(modules_, handle, kMaxModules, "moduleLoad");
  if (checked.ok() && bytes == 0) checked = Status(ErrorCode::kInvalidImage, "empty module image");
  // Hash and parse a private copy: the client can write its arena while we read, and the bytes
  // the cache keys an image by must be the bytes it loaded. A local, so that a large image's
  // memory goes back as soon as it is loaded.
  std::vector<std::byte> image;
  if (checked.ok()) {
    const std::byte* src = channel_->arena().data() + c.image_offset;
    image.assign(src, src + bytes);
  }
  // The image bytes are no longer needed whatever happens next. (On failure, execute()
  // releases the staging too; releasing an end twice is harmless.)
  release_staging_now(c.staging_end);
  if (!checked.ok()) return {checked};
  // The image already loaded for any session if these bytes were; loaded now otherwise.
  auto module = module_cache_.acquire_by_image(image);
  if (!module.ok()) return {module.status().with_context("moduleLoad")};
  modules_.emplace(handle, *module);
  return {};
}

Session::Outcome Session::module_load_cached(const wire::calls::ModuleLoadCached& c) {
  const wire::ModuleHandle handle = c.module;
  Status usable = check_new_handle(modules_, handle, kMaxModules, "moduleLoadCached");
  if (!usable.ok()) return {usable};
  if (c.sha256.size() != std::tuple_size_v<Sha256>) {
    return {invalid(str_cat("moduleLoadCached: a SHA-256 of ", c.sha256.size(), " bytes (it has ",
                            std::tuple_size_v<Sha256>, ")"))};
  }
  auto module = module_cache_.acquire_by_hash(c.sha256.first<std::tuple_size_v<Sha256>>());
  if (!module.ok()) return {module.status().with_context("moduleLoadCached")};
  modules_.emplace(handle, *module);
  return {};
}

Session::Outcome Session::module_unload(const wire::calls::ModuleUnload& c) {
  const wire::ModuleHandle handle = c.module;
  auto it = modules_.find(handle);
  if (it == modules_.end()) {
    return {error(ErrorCode::kInvalidHandle, "moduleUnload: unknown module handle ",
                  hex(handle.value()))};
  }
  // Functions of the module handle die with it; launching one later is an unknown handle, not a
  // launch of freed code. The image itself stays loaded while other handles (of this session
  // or others) use it.
  std::erase_if(functions_, [handle](const auto& f) { return f.second.module == handle; });
  const ModuleCache::Ref ref = it->second;
  modules_.erase(it);
  return {module_cache_.release(ref).with_context("moduleUnload")};
}

Session::Outcome Session::function_get(const wire::calls::FunctionGet& c) {
  const wire::FunctionHandle handle = c.function;
  Status usable = check_new_handle(functions_, handle, kMaxFunctions, "functionGet");
  if (!usable.ok()) return {usable};
  auto module = modules_.find(c.module);
  if (module == modules_.end()) {
    return {error(ErrorCode::kInvalidHandle, "functionGet: unknown module handle ",
                  hex(c.module.value()))};
  }
  if (c.name.empty() || c.name.size() > wire::kMaxNameBytes) {
    return {invalid(str_cat("functionGet: a kernel name of ", c.name.size(), " bytes"))};
  }
  auto function = device_.get_function(module->second.module, c.name);
  if (!function.ok()) return {function.status()};
  auto info = device_.function_info(*function);
  if (!info.ok()) return {info.status()};
  functions_.emplace(handle, FunctionEntry{*function, c.module, *info});
  return {Status(), *info};
}

Session::Outcome Session::launch_kernel(const wire::calls::LaunchKernel& c) {
  auto f = functions_.find(c.function);
  if (f == functions_.end()) {
    return {error(ErrorCode::kInvalidHandle, "launchKernel: unknown function handle ",
                  hex(c.function.value()))};
  }
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  const std::span<const std::byte> bytes = c.params;
  if (bytes.size() != f->second.info.param_bytes()) {
    return {invalid(str_cat("launchKernel ", f->second.info.name, ": ", bytes.size(),
                            " bytes of parameters, the kernel takes ",
                            f->second.info.param_bytes()))};
  }
  // The kernel waits for the swap groups its arguments point into, no more (pipelined
  // execution), and the blocks it may write are noted for dirty tracking.
  waits_.clear();
  memory_->kernel_access(bytes, f->second.info, &waits_);
  for (const device::Event& e : waits_) {
    Status waited = device_.wait_event(*s, e);
    if (!waited.ok()) return {waited};
  }
  device::LaunchConfig config;
  config.grid = {c.grid_x, c.grid_y, c.grid_z};
  config.block = {c.block_x, c.block_y, c.block_z};
  config.shared_memory_bytes = c.shared_mem_bytes;
  return {device_.launch(*s, f->second.function, config, bytes), {}, false, *s};
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

bool Session::work_pending() {
  bool pending = false;
  for (StreamEntry* entry : all_entries()) {
    for (const std::optional<device::Stream>& s : entry->per_gpu) {
      if (!s) continue;
      Status q = device_.query_stream(*s);
      if (q.code() == ErrorCode::kNotReady) {
        pending = true;
      } else if (!q.ok() && entry->drained_error.ok()) {
        // A query reports a failure once: keep it for the client's next synchronisation.
        entry->drained_error = std::move(q);
      }
    }
  }
  return pending;
}

std::vector<Session::StreamEntry*> Session::all_entries() {
  std::vector<StreamEntry*> entries = {&default_stream_};
  for (auto& [handle, entry] : streams_) entries.push_back(&entry);
  return entries;
}

std::vector<device::Stream> Session::all_streams() const {
  std::vector<device::Stream> all;
  auto add = [&all](const std::vector<std::optional<device::Stream>>& per_gpu) {
    for (const std::optional<device::Stream>& s : per_gpu) {
      if (s) all.push_back(*s);
    }
  };
  add(default_stream_.per_gpu);
  for (const auto& [handle, entry] : streams_) add(entry.per_gpu);
  add(sync_streams_);
  add(swap_streams_);
  return all;
}

void Session::quiesce() {
  for (StreamEntry* entry : all_entries()) {
    for (const std::optional<device::Stream>& s : entry->per_gpu) {
      if (!s) continue;
      Status drained = device_.synchronize_stream(*s);
      if (!drained.ok() && entry->drained_error.ok()) entry->drained_error = drained;
    }
  }
  for (const auto* per_gpu : {&sync_streams_, &swap_streams_}) {
    for (const std::optional<device::Stream>& s : *per_gpu) {
      if (s) (void)device_.synchronize_stream(*s);
    }
  }
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
  post(CompletionRecord{seq, limited(std::move(status)), std::move(result)});
}

Status Session::deliver() {
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
  for (auto& [handle, entry] : events_) {
    for (const std::optional<device::Event>& e : entry.per_gpu) {
      if (e) (void)device_.destroy_event(*e);
    }
  }
  events_.clear();
  for (const device::Stream& s : all_streams()) (void)device_.destroy_stream(s);
  streams_.clear();
  default_stream_.per_gpu.assign(gpu_count_, std::nullopt);
  sync_streams_.assign(gpu_count_, std::nullopt);
  swap_streams_.assign(gpu_count_, std::nullopt);
  functions_.clear();
  // The session's work is done (quiesce): its references go back; an image no other session
  // uses is unloaded.
  for (const auto& [handle, ref] : modules_) {
    Status released = module_cache_.release(ref);
    if (!released.ok()) LOG(ERROR) << "session " << identity_.id << ": " << released;
  }
  modules_.clear();
  // Unmaps and frees every block on every GPU, and its host copies.
  memory_->release_all();
  lease_.reset();
  bound_gpu_.store(-1);
  if (arena_registered_) {
    Status unregistered = device_.unregister_host_memory(channel_->arena().data());
    if (!unregistered.ok()) LOG(ERROR) << "session " << identity_.id << ": " << unregistered;
    arena_registered_ = false;
  }
}

}  // namespace hiber::server
