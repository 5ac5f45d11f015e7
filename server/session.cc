#include "server/session.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstring>

#include <glog/logging.h>

#include "server/device/library.h"
#include "server/handle_table.h"
#include "wire/call_codec.h"
#include "wire/limits.h"

namespace hiber::server {
namespace proto = wire::proto;
using device::DevicePtr;

namespace {

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

Status invalid(const std::string& message) { return Status(ErrorCode::kInvalidValue, message); }

}  // namespace

Result<std::unique_ptr<Session>> Session::create(device::Device& device, ModuleCache& modules,
                                                 ContextPool& contexts, DevicePools& pools,
                                                 ModelRepository& repository, GpuLessor& lessor,
                                                 SessionIdentity identity,
                                                 const SessionConfig& config) {
  // The memory first: once it exists it owns an adopted range (reserved_va), and frees it
  // whatever fails later.
  auto memory =
      FunctionMemory::create(device, pools, repository, memory::FunctionId{config.instance.value()},
                             config.va_bytes, config.quota_bytes, config.memory, config.reserved_va);
  if (!memory.ok()) return memory.status().with_context("the session's memory");
  auto channel = wire::ServerChannel::create(config.channel);
  if (!channel.ok()) return channel.status().with_context("creating the session channel");
  std::unique_ptr<Session> session(
      new Session(device, modules, contexts, lessor, std::move(identity), config,
                  std::move(channel).value(), std::move(memory).value()));
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

Session::Session(device::Device& device, ModuleCache& modules, ContextPool& contexts,
                 GpuLessor& lessor, SessionIdentity identity, const SessionConfig& config,
                 std::unique_ptr<wire::ServerChannel> channel,
                 std::shared_ptr<FunctionMemory> memory)
    : device_(device),
      module_cache_(modules),
      context_pool_(contexts),
      lessor_(lessor),
      identity_(std::move(identity)),
      config_(config),
      gpu_count_(device.gpu_count()),
      started_(std::chrono::steady_clock::now()),
      channel_(std::move(channel)),
      memory_(std::move(memory)),
      staging_([this](uint64_t end) { channel_->release_staging(end); }),
      queue_({config.limits.max_queued_bytes, config.limits.max_queue_age}),
      contexts_(gpu_count_),
      handles_(device, gpu_count_, [this](int gpu) { return context_on(gpu); }) {}

Session::~Session() {
  CHECK(!thread_.joinable()) << "session " << identity_.id << " destroyed while running";
  teardown();
}

wire::SessionInfo Session::welcome() const {
  wire::SessionInfo info;
  info.session_id = identity_.id.value();
  info.server_version = wire::current_protocol_version();
  info.grant.va_base = memory_->va_base();
  info.grant.va_bytes = memory_->va_bytes();
  info.grant.quota_bytes = config_.quota_bytes;
  info.grant.allocation_granularity = memory_->granularity();
  info.grant.largest_allocation_bytes = memory_->largest_allocation();
  info.layout = channel_->layout();
  // The function sees one device, ordinal 0: whichever GPU a lease gives it. The node's GPUs
  // are one model (a pool of one kind), so GPU 0's properties describe every lease.
  const device::DeviceProperties& props = device_.properties(0);
  wire::DeviceInfo dev;
  dev.ordinal = 0;
  dev.name = props.name;
  dev.uuid.assign(props.uuid.begin(), props.uuid.end());
  dev.pci_bus_id = props.pci_bus_id;
  // The function's memory is its grant: cudaGetDeviceProperties' totalGlobalMem, cuDeviceTotalMem,
  // cudaMemGetInfo and NVML all say the quota, so a framework that sizes a cache from any of
  // them plans with the same bytes.
  dev.total_memory_bytes = std::min(props.total_memory_bytes, config_.quota_bytes);
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
    // Once per session: why it ends, when hiberd ends it, is the first thing a client's
    // "hiberd ended the session" leads to.
    LOG(INFO) << "session " << identity_.id << " (" << identity_.function_id
              << ") closing: " << reason;
  }
  channel_->close();
  // Wakes the session thread wherever it waits: for mail, or on the channel.
  mail_.close();
  channel_->interrupt();
}

void Session::abandon(std::string_view reason) {
  abandoned_.store(true);
  close(reason);
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
  s.batch_sizes = Histogram(batch_bounds_);
  for (size_t i = 0; i < batch_size_counts_.size(); ++i) {
    s.batch_sizes.counts[i] = batch_size_counts_[i].load(std::memory_order_relaxed);
    s.batch_sizes.count += s.batch_sizes.counts[i];
  }
  s.batch_sizes.sum = static_cast<double>(batched_calls_.load(std::memory_order_relaxed));
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

void Session::end_lease(RequestId lease) { post(EndCommand{lease, Status()}); }

void Session::fail(RequestId lease, const Status& why) {
  post(EndCommand{lease, why.ok() ? Status(ErrorCode::kUnknown, "GPU failed") : why});
}

void Session::forget_shared_context(GpuId gpu) { post(ForgetContextCommand{gpu}); }

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
    } else if (auto* fault = std::get_if<FaultCommand>(&mail)) {
      commands.emplace_back(std::move(*fault));
    } else if (auto* forget = std::get_if<ForgetContextCommand>(&mail)) {
      commands.emplace_back(*forget);
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
    } else if (auto* fault = std::get_if<FaultCommand>(&command)) {
      lose_context(fault->why);
    } else if (auto* forget = std::get_if<ForgetContextCommand>(&command)) {
      forget_context(forget->gpu);
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
  if (!lost_context_.ok()) {
    // Asked for before the context was lost: nothing of this function runs any more.
    lessor_.streaming(identity_.id, lease.id, lost_context_, false);
    lessor_.released(identity_.id, lease.id, lost_context_);
    return;
  }
  if (lease_ || lease.gpus.size() != 1) {
    // The controller grants one lease at a time, of one GPU; anything else is its bug. Refuse
    // it loudly rather than run on two GPUs.
    LOG(ERROR) << "session " << identity_.id << ": lease " << lease.id << " on GPUs " << lease.gpus
               << " granted while "
               << (lease_ ? str_cat("lease ", lease_->id, " is held")
                          : "an instance runs on one GPU")
               << "; refusing it";
    lessor_.streaming(identity_.id, lease.id,
                      Status(ErrorCode::kIllegalState, lease_ ? "a second lease while one is held"
                                                              : "a lease of several GPUs"),
                      false);
    lessor_.released(identity_.id, lease.id, Status());
    return;
  }
  asked_for_gpu_ = false;
  leases_.fetch_add(1, std::memory_order_relaxed);
  const int gpu = lease.gpus.first().value();
  // The swap runs on a stream of its own on the lease's GPU, so client work queued behind it
  // waits only for the groups it touches.
  auto swap_stream = handles_.swap_stream(gpu);
  Status bound = swap_stream.status();
  const bool was_fixed = memory_->model_fixed();
  if (bound.ok()) {
    const SessionId session = identity_.id;
    const RequestId id = lease.id;
    bound = memory_->bind(
        lease, *swap_stream,
        [this, session, id](const Status& done, const SwapReport& report) {
          lessor_.swap_done(session, id, done, report);
        },
        [this](GpuId g, const memory::Shortfall& s) {
          return lessor_.make_room(identity_.id, g, s);
        });
  }
  if (bound.ok() && !was_fixed && memory_->model_fixed() && config_.model_fixed) {
    config_.model_fixed(memory_);
  }
  lessor_.streaming(identity_.id, lease.id, bound, bound.ok() && memory_->bound_swap_bytes() == 0);
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
  bound_gpu_.store(lease.gpus.first());
  last_gpu_call_ = std::chrono::steady_clock::now();
}

void Session::finish_lease(const Status& failure) {
  const Lease lease = *lease_;
  // A lost context was logged, and told to the client, when it was lost.
  if (!failure.ok() && !device::is_context_fault(failure.code())) {
    LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id << "): GPU "
                 << lease.gpus.first() << " failed under it: " << failure;
    // Sequence 0: an error of the session, which the client makes sticky.
    unsent_.push_back({0, limited(failure.with_context(str_cat("GPU ", lease.gpus.first()))), {}});
  }
  // Nothing of this function may run on the GPU once it is handed back.
  quiesce();
  Status unbound = memory_->unbind();
  if (!unbound.ok()) LOG(ERROR) << "session " << identity_.id << ": unmapping: " << unbound;
  lease_.reset();
  bound_gpu_.store(std::nullopt);
  lessor_.released(identity_.id, lease.id, failure.ok() ? unbound : failure);
}

Result<device::Context> Session::context_on(int gpu) {
  if (gpu < 0 || gpu >= gpu_count_)
    return error(ErrorCode::kInvalidDevice, "GPU ", gpu, " does not exist");
  std::optional<device::Context>& slot = contexts_[gpu];
  if (!slot) {
    HIBER_ASSIGN_OR_RETURN(device::Context context, context_pool_.take(gpu));
    slot = context;
  }
  return *slot;
}

void Session::lose_context(const Status& why) {
  if (!lost_context_.ok()) return;  // a second fault came before the first was seen
  const ErrorCode code =
      device::is_context_fault(why.code()) ? why.code() : ErrorCode::kLaunchFailed;
  lost_context_ = Status(code, str_cat(why.message(), "; the function's CUDA context is lost: ",
                                       "every later call fails (reconnect to start over)"));
  LOG(WARNING) << "session " << identity_.id << " (" << identity_.function_id << ", pid "
               << identity_.peer.pid << "): " << lost_context_;
  // Sequence 0: an error of the session, which the client makes sticky.
  unsent_.push_back({0, limited(lost_context_), {}});
  if (lease_) {
    // The client hears of it before the drain, which on CUDA waits for the kernel to end.
    (void)deliver();
    finish_lease(lost_context_);
  }
}

void Session::forget_context(GpuId gpu) {
  const int g = gpu.value();
  if (lease_ && lease_->gpus.first() == gpu) {
    // The controller holds a GPU it resets, and only one lease runs on a GPU: its bug.
    LOG(DFATAL) << "session " << identity_.id << ": told to forget GPU " << gpu
                << "'s context while leasing it; keeping it";
  } else if (g >= 0 && g < gpu_count_ && contexts_[g]) {
    // No lease is on the GPU, so the work of these objects has drained (finish_lease); what it
    // left (a stream's first failure) stays for the client.
    handles_.forget_gpu(g);
    memory_->forget_context(g);
    contexts_[g].reset();  // the shared context: nothing to give back
  }
  lessor_.context_forgotten(identity_.id, gpu);
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
    const std::chrono::nanoseconds stuck = unsent_.empty()
                                               ? std::chrono::nanoseconds(std::chrono::hours(1))
                                               : std::chrono::nanoseconds(retry);

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
  if (lease_ || !lost_context_.ok()) {
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
  Status read =
      wire::read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) -> Status {
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
          const size_t bucket =
              static_cast<size_t>(std::lower_bound(batch_bounds_.begin(), batch_bounds_.end(),
                                                   static_cast<double>(calls.size())) -
                                  batch_bounds_.begin());
          batch_size_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
          batched_calls_.fetch_add(calls.size(), std::memory_order_relaxed);
        }
        for (uint32_t i = first; i < calls.size(); ++i) {
          // The client is gone: what it still asked for would only keep the GPU busy.
          if (abandoned_.load(std::memory_order_relaxed)) return Status();
          // A graph's calls being defined are kept, not run: they need no lease.
          if (!lease_ && lost_context_.ok() && !defining_ && wire::runs_on_gpu(calls[i])) {
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
    if (!lost_context_.ok()) {
      outcome = Outcome{lost_context_};
      return;
    }
    // Between graphBegin and graphEnd calls are kept for the graph, not run.
    if (defining_ && call.which() != proto::Call::GRAPH_END) {
      outcome = Outcome{keep_for_graph(call)};
      return;
    }
    const bool on_gpu = lease_ && wire::runs_on_gpu(call);
    if (on_gpu) {
      last_gpu_call_ = std::chrono::steady_clock::now();
      Status admitted = admit_gpu_call(call);
      if (!admitted.ok()) {
        outcome = Outcome{std::move(admitted)};
        return;
      }
    }
    outcome = dispatch(call, seq);
    if (on_gpu && outcome.status.ok() && outcome.completes_on) meter(call, *outcome.completes_on);
  });
  KJ_IF_MAYBE (e, thrown) {
    outcome = Outcome{invalid(str_cat("malformed call (", wire::call_name(call.which()),
                                      "): ", e->getDescription().cStr()))};
  }
  // Not ready answers a query; it is not a failure (and, as in CUDA, not a sticky error).
  const bool failed = !outcome.status.ok() && outcome.status.code() != ErrorCode::kNotReady;
  // A fault the call found (a synchronisation or query answering it, or a call the faulted
  // context refused) ends the context: the session loses it once this batch is done, between
  // calls (the calls after it fail on the faulted context meanwhile).
  if (lost_context_.ok() && device::is_context_fault(outcome.status.code())) {
    post(FaultCommand{outcome.status});
  }
  if (failed) {
    // Nor is a module cache miss, which asks the client for the image: it still goes back to
    // the client as an error, but the session's count of failed calls leaves it out.
    const bool cache_miss = call.which() == proto::Call::MODULE_LOAD_CACHED &&
                            outcome.status.code() == ErrorCode::kNotFound;
    if (!cache_miss) failed_calls_.fetch_add(1, std::memory_order_relaxed);
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

void Session::release_staging_now(uint64_t staging_end) {
  if (staging_end == 0) return;
  auto ticket = staging_.begin(staging_end);
  if (ticket.ok()) staging_.finish(*ticket);
}

// ---- Completion and teardown ----

Status Session::after(device::Stream s, std::function<void(Status)> fn) {
  {
    MutexLock lock(callbacks_mutex_);
    ++pending_callbacks_;
  }
  Status queued = device_.add_callback(s, [this, fn = std::move(fn)](Status status) {
    fn(std::move(status));
    MutexLock lock(callbacks_mutex_);
    if (--pending_callbacks_ == 0) callbacks_done_.notify_all();
  });
  if (!queued.ok()) {
    MutexLock lock(callbacks_mutex_);
    if (--pending_callbacks_ == 0) callbacks_done_.notify_all();
  }
  return queued;
}

namespace {

// Bytes a GPU call moves or writes, as the queue limit counts them.
uint64_t work_bytes(proto::Call::Reader call) {
  switch (call.which()) {
    case proto::Call::MEMCPY_HTO_D: return call.getMemcpyHtoD().getBytes();
    case proto::Call::MEMCPY_DTO_H: return call.getMemcpyDtoH().getBytes();
    case proto::Call::MEMCPY_DTO_D: return call.getMemcpyDtoD().getBytes();
    case proto::Call::MEMSET: {
      const uint64_t count = call.getMemset().getCount();
      const uint64_t element = call.getMemset().getElementBytes();
      return count > UINT64_MAX / std::max<uint64_t>(element, 1) ? UINT64_MAX : count * element;
    }
    default: return 0;
  }
}

}  // namespace

Status Session::admit_gpu_call(proto::Call::Reader call) {
  Status admitted =
      queue_.admit(wire::call_name(call.which()), std::chrono::steady_clock::now(), unmarked_);
  for (const device::Stream& s : unmarked_) place_marker(s);
  return admitted;
}

void Session::meter(proto::Call::Reader call, device::Stream stream) {
  if (queue_.enqueued(stream, work_bytes(call))) place_marker(stream);
}

void Session::place_marker(device::Stream stream) {
  queue_.marked(stream, std::chrono::steady_clock::now());
  Status placed = after(stream, [this, stream](Status) { queue_.finished(stream); });
  if (!placed.ok()) queue_.finished(stream);
}

bool Session::work_pending() {
  bool pending = false;
  for (ClientStream* entry : handles_.client_streams()) {
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

void Session::quiesce() {
  for (ClientStream* entry : handles_.client_streams()) {
    for (const std::optional<device::Stream>& s : entry->per_gpu) {
      if (!s) continue;
      Status drained = device_.synchronize_stream(*s);
      if (!drained.ok() && entry->drained_error.ok()) entry->drained_error = drained;
    }
  }
  for (const device::Stream& s : handles_.own_streams()) (void)device_.synchronize_stream(s);
  MutexLock lock(callbacks_mutex_);
  lock.wait(callbacks_done_,
            [this]() REQUIRES(callbacks_mutex_) { return pending_callbacks_ == 0; });
}

void Session::build_completions(capnp::MessageBuilder& message,
                                std::deque<CompletionRecord>::const_iterator first, size_t count) {
  auto list =
      message.initRoot<proto::ServerMessage>().initCompletions(static_cast<unsigned>(count));
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
    } else if (const auto* answer = std::get_if<wire::LibraryAnswer>(&r.result)) {
      result.setLibrary(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(answer->bytes.data()),
                                            answer->bytes.size()));
    } else {
      result.setNone();
    }
  }
}

void Session::post_completion(uint64_t seq, Status status, CallResult result) {
  if (!status.ok()) failed_calls_.fetch_add(1, std::memory_order_relaxed);
  // Work that faulted ended the context it ran in: the session loses it (on its thread).
  if (device::is_context_fault(status.code())) post(FaultCommand{status});
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
  if (abandoned_.load()) {
    // Nobody will read the results: work not yet started is dropped where the device can.
    const Status why(ErrorCode::kDeinitialized, "the client is gone");
    size_t cancelled = 0;
    for (const device::Stream& s : handles_.all_streams()) {
      if (device_.cancel_stream(s, why).ok()) ++cancelled;
    }
    VLOG(1) << "session " << identity_.id << ": the client is gone; cancelled the work queued on "
            << cancelled << " streams";
  }
  quiesce();
  handles_.destroy_all();
  functions_.clear();
  for (library_ops::Library library : {library_ops::Library::kBlas, library_ops::Library::kDnn}) {
    if (device::LibraryBackend* backend = device_.library(library))
      backend->release(identity_.id.value(), std::nullopt);
  }
  // The session's work is done (quiesce): its references go back; an image no other session
  // uses is unloaded.
  for (const auto& [handle, ref] : modules_) {
    Status released = module_cache_.release(ref);
    if (!released.ok()) LOG(ERROR) << "session " << identity_.id << ": " << released;
  }
  modules_.clear();
  module_bytes_ = 0;
  // Unmaps and frees every block on every GPU, and its host copies (and the swap's events).
  memory_->release_all();
  // Nothing of the session is left in its contexts now: they go back, to be destroyed.
  for (std::optional<device::Context>& context : contexts_) {
    if (context) context_pool_.give_back(*context);
    context.reset();
  }
  lease_.reset();
  bound_gpu_.store(std::nullopt);
  if (arena_registered_) {
    Status unregistered = device_.unregister_host_memory(channel_->arena().data());
    if (!unregistered.ok()) LOG(ERROR) << "session " << identity_.id << ": " << unregistered;
    arena_registered_ = false;
  }
}

}  // namespace hiber::server
