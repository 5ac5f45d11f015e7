#include "server/handle_table.h"

#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>

namespace hiber::server {
namespace {

// Bounds on what one session may create, so a client cannot exhaust the server's memory.
constexpr size_t kMaxStreams = 4096;
constexpr size_t kMaxEvents = 1 << 16;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

}  // namespace

Status check_new_handle(uint64_t handle, bool in_use, size_t held, size_t limit,
                        std::string_view call) {
  if (handle == 0) return Status(ErrorCode::kInvalidValue, str_cat(call, ": handle 0 is reserved"));
  if (in_use) {
    return error(ErrorCode::kInvalidValue, call, ": handle ", hex(handle), " is already in use");
  }
  if (held >= limit) {
    return error(ErrorCode::kOutOfMemory, call, ": the session already holds ", limit);
  }
  return Status();
}

HandleTable::HandleTable(device::Device& device, int gpu_count, ContextSource contexts)
    : device_(device), gpu_count_(gpu_count), contexts_(std::move(contexts)) {
  default_stream_.per_gpu.resize(gpu_count_);
  sync_streams_.resize(gpu_count_);
  swap_streams_.resize(gpu_count_);
}

Result<ClientStream*> HandleTable::stream(wire::StreamHandle handle) {
  if (handle.is_zero()) return &default_stream_;
  auto it = streams_.find(handle);
  if (it == streams_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown stream handle ", hex(handle.value()));
  }
  return &it->second;
}

Result<ClientEvent*> HandleTable::event(wire::EventHandle handle) {
  auto it = events_.find(handle);
  if (it == events_.end()) {
    return error(ErrorCode::kInvalidHandle, "unknown event handle ", hex(handle.value()));
  }
  return &it->second;
}

Status HandleTable::add_stream(wire::StreamHandle handle, int32_t priority) {
  HIBER_RETURN_IF_ERROR(check_new_handle(streams_, handle, kMaxStreams, "streamCreate"));
  ClientStream entry;
  entry.priority = priority;
  entry.per_gpu.resize(gpu_count_);
  streams_.emplace(handle, std::move(entry));
  return Status();
}

Status HandleTable::add_event(wire::EventHandle handle, bool disable_timing) {
  HIBER_RETURN_IF_ERROR(check_new_handle(events_, handle, kMaxEvents, "eventCreate"));
  ClientEvent entry;
  entry.disable_timing = disable_timing;
  entry.per_gpu.resize(gpu_count_);
  events_.emplace(handle, std::move(entry));
  return Status();
}

Result<ClientStream> HandleTable::remove_stream(wire::StreamHandle handle) {
  if (handle.is_zero()) {
    return Status(ErrorCode::kInvalidValue,
                  "streamDestroy: the default stream cannot be destroyed");
  }
  auto it = streams_.find(handle);
  if (it == streams_.end()) {
    return error(ErrorCode::kInvalidHandle, "streamDestroy: unknown stream handle ",
                 hex(handle.value()));
  }
  ClientStream entry = std::move(it->second);
  streams_.erase(it);
  return entry;
}

Result<ClientEvent> HandleTable::remove_event(wire::EventHandle handle) {
  auto it = events_.find(handle);
  if (it == events_.end()) {
    return error(ErrorCode::kInvalidHandle, "eventDestroy: unknown event handle ",
                 hex(handle.value()));
  }
  ClientEvent entry = std::move(it->second);
  events_.erase(it);
  return entry;
}

Result<device::Context> HandleTable::context_on(int gpu) const {
  if (contexts_) return contexts_(gpu);
  if (gpu < 0 || gpu >= gpu_count_)
    return error(ErrorCode::kInvalidDevice, "GPU ", gpu, " does not exist");
  return device_.shared_context(gpu);
}

Result<device::Stream> HandleTable::device_stream(PerGpuStreams& per_gpu, int32_t priority,
                                                  int gpu) {
  std::optional<device::Stream>& slot = per_gpu[gpu];
  if (!slot) {
    HIBER_ASSIGN_OR_RETURN(device::Context context, context_on(gpu));
    auto created = device_.create_stream(context, priority);
    if (!created.ok()) return created.status();
    slot = *created;
  }
  return *slot;
}

Result<device::Stream> HandleTable::work_stream(wire::StreamHandle handle, int gpu) {
  HIBER_ASSIGN_OR_RETURN(ClientStream * entry, stream(handle));
  HIBER_ASSIGN_OR_RETURN(device::Stream s, device_stream(entry->per_gpu, entry->priority, gpu));
  entry->last_gpu = gpu;
  return s;
}

Result<device::Event> HandleTable::event_on(ClientEvent& event, int gpu) {
  std::optional<device::Event>& slot = event.per_gpu[gpu];
  if (!slot) {
    HIBER_ASSIGN_OR_RETURN(device::Context context, context_on(gpu));
    auto created = device_.create_event(context, event.disable_timing);
    if (!created.ok()) return created.status();
    slot = *created;
  }
  return *slot;
}

Result<device::Stream> HandleTable::sync_stream(int gpu) {
  return device_stream(sync_streams_, 0, gpu);
}

Result<device::Stream> HandleTable::swap_stream(int gpu) {
  return device_stream(swap_streams_, 0, gpu);
}

std::vector<ClientStream*> HandleTable::client_streams() {
  std::vector<ClientStream*> entries = {&default_stream_};
  for (auto& [handle, entry] : streams_) entries.push_back(&entry);
  return entries;
}

std::vector<device::Stream> HandleTable::own_streams() const {
  std::vector<device::Stream> own;
  for (const PerGpuStreams* per_gpu : {&sync_streams_, &swap_streams_}) {
    for (const std::optional<device::Stream>& s : *per_gpu) {
      if (s) own.push_back(*s);
    }
  }
  return own;
}

std::vector<device::Stream> HandleTable::all_streams() const {
  std::vector<device::Stream> all;
  auto add = [&all](const PerGpuStreams& per_gpu) {
    for (const std::optional<device::Stream>& s : per_gpu) {
      if (s) all.push_back(*s);
    }
  };
  add(default_stream_.per_gpu);
  for (const auto& [handle, entry] : streams_) add(entry.per_gpu);
  for (const device::Stream& s : own_streams()) all.push_back(s);
  return all;
}

void HandleTable::forget_gpu(int gpu) {
  auto forget_stream = [gpu](ClientStream& stream) {
    stream.per_gpu[gpu].reset();
    if (stream.last_gpu == gpu) stream.last_gpu.reset();
  };
  forget_stream(default_stream_);
  for (auto& [handle, entry] : streams_) forget_stream(entry);
  for (auto& [handle, entry] : events_) {
    entry.per_gpu[gpu].reset();
    if (entry.last_gpu == gpu) entry.last_gpu.reset();
  }
  sync_streams_[gpu].reset();
  swap_streams_[gpu].reset();
}

void HandleTable::destroy_all() {
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
}

}  // namespace hiber::server
