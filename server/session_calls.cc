// The session's call handlers: one per call of the call table (wire/call_table.h), and the
// table-driven dispatch to them. Each checks every value the client sent before it acts.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <glog/logging.h>

#include "server/device/library.h"
#include "server/handle_table.h"
#include "server/session.h"
#include "wire/call_codec.h"
#include "wire/handshake.h"
#include "wire/limits.h"

namespace hiber::server {
namespace proto = wire::proto;

namespace {

// Bounds on what one session may create, so a client cannot exhaust the server's memory.
constexpr size_t kMaxModules = 4096;
constexpr size_t kMaxFunctions = 1 << 16;

Status invalid(const std::string& message) { return Status(ErrorCode::kInvalidValue, message); }

// When a recorded event's latest record completed; stamped now if the device event is complete
// and no callback has stamped it yet. kNotReady while the record is pending.
Result<int64_t> completed_ns(device::Device& device, const ClientEvent& event) {
  if (std::optional<int64_t> ns = event.completed->ns()) return *ns;
  Status queried = device.query_event(*event.per_gpu[*event.last_gpu]);
  if (queried.code() == ErrorCode::kNotReady)
    return error(ErrorCode::kNotReady, "an event has not completed");
  HIBER_RETURN_IF_ERROR(queried);
  event.completed->stamp(event.completed->latest());
  return *event.completed->ns();
}

}  // namespace

Session::Outcome Session::dispatch(proto::Call::Reader call, uint64_t seq) {
  switch (call.which()) {
#define HIBER_DISPATCH_kAsync(Name, handler) \
  return handler(wire::read_call<wire::calls::Name>(call));
#define HIBER_DISPATCH_kSync(Name, handler) \
  return handler(wire::read_call<wire::calls::Name>(call), seq, call.getReply());
#define HIBER_DISPATCH(Name, name, WHICH, where, timing, shape, handler, fields) \
  case proto::Call::WHICH: HIBER_DISPATCH_##timing(Name, handler)
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
  const std::optional<GpuId> gpu =
      lease_ ? std::optional<GpuId>(lease_->gpus.first()) : std::nullopt;
  Status added =
      memory_->add_block(c.va, c.bytes, gpu, [this](GpuId g, const memory::Shortfall& s) {
        return lessor_.make_room(identity_.id, g, s);
      });
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
  if (count > UINT64_MAX / static_cast<uint64_t>(element))
    return {invalid("memset size overflows")};
  Status checked = memory_->check_range(c.dst, count * element, "memset destination");
  if (!checked.ok()) return {checked};
  if (c.dst % static_cast<uint64_t>(element) != 0) {
    return {invalid(
        str_cat("memset destination ", hex(c.dst), " is not aligned to ", element, " bytes"))};
  }
  checked = before_access(*s, c.dst, count * element, /*write=*/true);
  if (!checked.ok()) return {checked};
  return {device_.memset(*s, c.dst, c.value, element, count), {}, false, *s};
}

// ---- Streams and events ----

Result<device::Stream> Session::work_stream(wire::StreamHandle handle) {
  return handles_.work_stream(handle, lease_->gpus.first().value());
}

Session::Outcome Session::stream_create(const wire::calls::StreamCreate& c) {
  return {handles_.add_stream(c.stream, c.priority)};
}

Session::Outcome Session::stream_destroy(const wire::calls::StreamDestroy& c) {
  auto removed = handles_.remove_stream(c.stream);
  if (!removed.ok()) return {removed.status()};
  Status result;
  for (const std::optional<device::Stream>& s : removed->per_gpu) {
    if (!s) continue;
    // Work already on the stream still runs; this callback lets teardown know when it is done.
    Status tracked = after(*s, [](Status) {});
    Status destroyed = device_.destroy_stream(*s);
    if (result.ok()) result = tracked.ok() ? destroyed : tracked;
  }
  return {result};
}

Session::Outcome Session::stream_synchronize(const wire::calls::StreamSynchronize& c, uint64_t seq,
                                             bool reply) {
  auto entry = handles_.stream(c.stream);
  if (!entry.ok()) return {entry.status()};
  if (!reply) return {};
  ClientStream& e = **entry;
  // Work drained when a lease ended reports its failure here, once, as CUDA would have.
  if (!e.drained_error.ok()) return {std::exchange(e.drained_error, Status())};
  if (!e.last_gpu || !e.per_gpu[*e.last_gpu]) return {};
  Status queued = after(*e.per_gpu[*e.last_gpu],
                        [this, seq](Status done) { post_completion(seq, std::move(done)); });
  if (!queued.ok()) return {queued};
  return {Status(), {}, /*deferred=*/true};
}

Session::Outcome Session::stream_query(const wire::calls::StreamQuery& c) {
  auto entry = handles_.stream(c.stream);
  if (!entry.ok()) return {entry.status()};
  ClientStream& e = **entry;
  if (!e.drained_error.ok()) return {std::exchange(e.drained_error, Status())};
  if (!e.last_gpu || !e.per_gpu[*e.last_gpu]) return {};
  return {device_.query_stream(*e.per_gpu[*e.last_gpu])};
}

Session::Outcome Session::stream_wait_event(const wire::calls::StreamWaitEvent& c) {
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  auto e = handles_.event(c.event);
  if (!e.ok()) return {e.status()};
  // An event never recorded is complete; one recorded under an earlier lease was drained when
  // that lease ended. Only a record on this GPU can still be pending.
  const ClientEvent& entry = **e;
  if (entry.last_gpu != lease_->gpus.first().value()) return {Status(), {}, false, *s};
  return {device_.wait_event(*s, *entry.per_gpu[*entry.last_gpu]), {}, false, *s};
}

Session::Outcome Session::event_create(const wire::calls::EventCreate& c) {
  return {handles_.add_event(c.event, c.disable_timing)};
}

Session::Outcome Session::event_destroy(const wire::calls::EventDestroy& c) {
  auto removed = handles_.remove_event(c.event);
  if (!removed.ok()) return {removed.status()};
  Status result;
  for (const std::optional<device::Event>& e : removed->per_gpu) {
    if (!e) continue;
    Status destroyed = device_.destroy_event(*e);
    if (result.ok()) result = destroyed;
  }
  return {result};
}

Session::Outcome Session::event_record(const wire::calls::EventRecord& c) {
  auto e = handles_.event(c.event);
  if (!e.ok()) return {e.status()};
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  ClientEvent& entry = **e;
  auto event = handles_.event_on(entry, lease_->gpus.first().value());
  if (!event.ok()) return {event.status()};
  entry.last_gpu = lease_->gpus.first().value();
  Status recorded = device_.record_event(*event, *s);
  if (recorded.ok() && !entry.disable_timing) {
    const uint64_t record = entry.completed->begin();
    recorded = after(*s, [time = entry.completed, record](Status) { time->stamp(record); });
  }
  return {recorded, {}, false, *s};
}

Session::Outcome Session::event_synchronize(const wire::calls::EventSynchronize& c, uint64_t seq,
                                            bool reply) {
  auto e = handles_.event(c.event);
  if (!e.ok()) return {e.status()};
  if (!reply) return {};
  const ClientEvent& entry = **e;
  if (!entry.last_gpu) return {};
  const int gpu = *entry.last_gpu;
  auto sync = handles_.sync_stream(gpu);
  if (!sync.ok()) return {sync.status()};
  // The synchronisation stream waits for the event's latest record, then reports. The record's
  // time is stamped first: the event is complete only with it (record_time.h).
  Status waited = device_.wait_event(*sync, *entry.per_gpu[gpu]);
  if (!waited.ok()) return {waited};
  Status queued = after(
      *sync, [this, seq, time = entry.completed, record = entry.completed->latest()](Status done) {
        time->stamp(record);
        post_completion(seq, std::move(done));
      });
  if (!queued.ok()) return {queued};
  return {Status(), {}, true};
}

Session::Outcome Session::event_query(const wire::calls::EventQuery& c) {
  auto e = handles_.event(c.event);
  if (!e.ok()) return {e.status()};
  const ClientEvent& entry = **e;
  if (!entry.last_gpu) return {};
  Status queried = device_.query_event(*entry.per_gpu[*entry.last_gpu]);
  if (queried.ok()) entry.completed->stamp(entry.completed->latest());
  return {queried};
}

Session::Outcome Session::event_elapsed(const wire::calls::EventElapsedTime& c) {
  auto a = handles_.event(c.start);
  if (!a.ok()) return {a.status()};
  auto b = handles_.event(c.end);
  if (!b.ok()) return {b.status()};
  const ClientEvent& first = **a;
  const ClientEvent& last = **b;
  if (!first.last_gpu || !last.last_gpu) {
    return {error(ErrorCode::kInvalidHandle, "eventElapsedTime: an event was never recorded")};
  }
  if (first.disable_timing || last.disable_timing) {
    return {error(ErrorCode::kInvalidHandle, "eventElapsedTime: an event has timing disabled")};
  }
  if (first.last_gpu != last.last_gpu) {
    // Recorded under leases on different GPUs: timed on the host, when each record completed.
    auto a = completed_ns(device_, first);
    if (!a.ok()) return {a.status().with_context("eventElapsedTime")};
    auto b = completed_ns(device_, last);
    if (!b.ok()) return {b.status().with_context("eventElapsedTime")};
    return {Status(), static_cast<float>(static_cast<double>(*b - *a) / 1e6)};
  }
  auto ms = device_.elapsed_ms(*first.per_gpu[*first.last_gpu], *last.per_gpu[*last.last_gpu]);
  if (!ms.ok()) return {ms.status()};
  return {Status(), *ms};
}

Session::Outcome Session::device_synchronize(const wire::calls::DeviceSynchronize&, uint64_t seq,
                                             bool reply) {
  // Queued without a reply (cudaFree, a pool's trim): the calls after it wait for the device, so
  // memory freed by the client is not reused while earlier work may still touch it.
  if (!reply) {
    quiesce();
    return {};
  }
  struct Countdown {
    std::mutex mutex;
    size_t remaining;
    Status first_error;
  };
  // Failures of work drained at the end of a lease come first.
  for (ClientStream* e : handles_.client_streams()) {
    if (!e->drained_error.ok()) return {std::exchange(e->drained_error, Status())};
  }
  const std::vector<device::Stream> all = handles_.all_streams();
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

Status Session::check_module_budget(std::string_view call, uint64_t bytes) const {
  const uint64_t limit = config_.limits.max_module_bytes;
  if (limit == 0 || bytes <= limit - std::min(limit, module_bytes_)) return Status();
  return error(ErrorCode::kOutOfMemory, call, ": an image of ", bytes,
               " bytes would bring this session's loaded code to ", module_bytes_ + bytes,
               " bytes, above the ", limit,
               " that --session_max_module_mib allows; unload "
               "modules first");
}

Session::Outcome Session::module_load(const wire::calls::ModuleLoad& c) {
  const wire::ModuleHandle handle = c.module;
  const uint64_t bytes = c.image_bytes;
  Status checked = check_arena_range(c.image_offset, bytes, "moduleLoad image");
  if (checked.ok()) checked = check_new_handle(modules_, handle, kMaxModules, "moduleLoad");
  if (checked.ok() && bytes == 0) checked = Status(ErrorCode::kInvalidImage, "empty module image");
  // Before the private copy below: the budget bounds what a load costs hiberd, that copy too.
  if (checked.ok()) checked = check_module_budget("moduleLoad", bytes);
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
  module_bytes_ += module->image_bytes;
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
  if (Status budget = check_module_budget("moduleLoadCached", module->image_bytes); !budget.ok()) {
    Status released = module_cache_.release(*module);
    if (!released.ok()) LOG(ERROR) << "session " << identity_.id << ": " << released;
    return {budget};
  }
  modules_.emplace(handle, *module);
  module_bytes_ += module->image_bytes;
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
  module_bytes_ -= ref.image_bytes;
  return {module_cache_.release(ref).with_context("moduleUnload")};
}

Session::Outcome Session::function_get(const wire::calls::FunctionGet& c) {
  const wire::FunctionHandle handle = c.function;
  Status usable = check_new_handle(functions_, handle, kMaxFunctions, "functionGet");
  if (!usable.ok()) return {usable};
  // Checked before the name can reach a log line or another error message.
  Status name =
      wire::check_printable_name(c.name, wire::kMaxNameBytes, "kernel name", "functionGet");
  if (!name.ok()) return {name};
  auto module = modules_.find(c.module);
  if (module == modules_.end()) {
    return {error(ErrorCode::kInvalidHandle, "functionGet: unknown module handle ",
                  hex(c.module.value()))};
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
    return {
        invalid(str_cat("launchKernel ", f->second.info.name, ": ", bytes.size(),
                        " bytes of parameters, the kernel takes ", f->second.info.param_bytes()))};
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
  if (config_.kernel_deadline.count() > 0) {
    config.deadline = config_.kernel_deadline;
    // The session thread acts on it: the function's context is lost (session.h).
    config.on_timeout = [this](const Status& why) {
      context_lost_->store(true);
      post(FaultCommand{why});
    };
    config.context_lost = context_lost_;
  }
  return {device_.launch(*s, f->second.function, config, bytes), {}, false, *s};
}

// ---- Remoted libraries (wire/library.h) ----

Session::Outcome Session::library_handle_create(const wire::calls::LibraryHandleCreate& c) {
  Status made = libraries_.create_handle(c.handle, c.library);
  if (!made.ok()) return {made};
  const auto library = static_cast<library_ops::Library>(c.library);
  device::LibraryBackend* backend = device_.library(library);
  if (backend == nullptr) {
    (void)libraries_.destroy_handle(c.handle);
    return {error(ErrorCode::kNotSupported, "libraryHandleCreate: hiberd's ",
                  device_.backend_name(), " device does not run ",
                  library_ops::library_name(library))};
  }
  // The CUDA backend's real library may be missing on this machine: the client learns it now,
  // at cublasCreate/cudnnCreate, rather than at its first compute call.
  if (Status available = backend->check_available(); !available.ok()) {
    (void)libraries_.destroy_handle(c.handle);
    return {available.with_context("libraryHandleCreate")};
  }
  return {Status()};
}

Session::Outcome Session::library_handle_destroy(const wire::calls::LibraryHandleDestroy& c) {
  Result<library_ops::Library> library = libraries_.library(c.handle);
  Status destroyed = libraries_.destroy_handle(c.handle);
  if (destroyed.ok()) {
    if (device::LibraryBackend* backend = device_.library(*library))
      backend->release(identity_.id.value(), library_ops::LibraryHandle(c.handle.value()));
  }
  return {destroyed};
}

Session::Outcome Session::library_call(const wire::calls::LibraryCall& c) {
  Result<LibraryAccess> access = libraries_.check_call(c.handle, c.op, c.args);
  if (!access.ok()) return {access.status()};
  device::LibraryBackend* backend = device_.library(*libraries_.library(c.handle));
  const device::LibraryCall call{identity_.id.value(), library_ops::LibraryHandle(c.handle.value()),
                                 static_cast<library_ops::LibraryOp>(c.op), c.args};
  if (library_ops::defines_session_state(call.op)) {
    // Kept by the backend for the calls that use it; nothing runs, so no lease is needed (a
    // resumed session replays its definitions while its function is idle).
    return {backend->run(device::Stream{}, call)};
  }
  auto s = work_stream(c.stream);
  if (!s.ok()) return {s.status()};
  // Operands inside the session's own blocks only; the call waits for the swap groups they lie
  // in (pipelined execution), or for the whole model when it reaches memory through pointers.
  waits_.clear();
  for (const LibraryOperand& operand : access->operands) {
    if (operand.bytes == 0) continue;
    Status inside = memory_->check_range(operand.ptr, operand.bytes, operand.what);
    if (!inside.ok())
      return {inside.with_context(library_ops::library_name(*libraries_.library(c.handle)))};
    memory_->access(operand.ptr, operand.bytes, operand.write, &waits_);
  }
  if (access->through_pointers) memory_->access_all(&waits_);
  for (const device::Event& e : waits_) {
    Status waited = device_.wait_event(*s, e);
    if (!waited.ok()) return {waited};
  }
  return {backend->run(*s, call), {}, false, *s};
}

Session::Outcome Session::library_query(const wire::calls::LibraryQuery& c) {
  Status checked = libraries_.check_query(c.handle, c.op, c.args);
  if (!checked.ok()) return {checked};
  device::LibraryBackend* backend = device_.library(*libraries_.library(c.handle));
  // Answers hold for the GPU model that runs the work: the lease's, in the instance's context
  // there, or the first GPU's between leases, in its shared context (a node's GPUs are of one
  // model, and no context of the instance's is made for a GPU it may never run on).
  Result<device::Context> context = lease_ ? context_on(lease_->gpus.first().value())
                                           : Result<device::Context>(device_.shared_context(0));
  if (!context.ok()) return {context.status()};
  const device::LibraryCall call{identity_.id.value(), library_ops::LibraryHandle(c.handle.value()),
                                 static_cast<library_ops::LibraryOp>(c.op), c.args};
  Result<std::vector<std::byte>> answer = backend->answer(*context, call);
  if (!answer.ok()) return {answer.status()};
  return {Status(), wire::LibraryAnswer{std::move(answer).value()}};
}

}  // namespace hiber::server
