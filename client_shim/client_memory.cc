// Device memory placed by the client inside its grant, pinned host memory in the arena, and
// copies and memsets between them.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "client_shim/client.h"
#include "client_shim/shim_capabilities.h"
#include "common/device_attributes.h"

namespace hiber::shim {
namespace {

// Small allocations share one-granule slabs at this alignment (cudaMalloc guarantees 256).
constexpr uint64_t kSlabAlignment = 256;
// Pageable copies go through staging in chunks of this size (bench/wire_bench.cc: 1 MiB chunks
// with a few MiB in flight keep up with memcpy).
constexpr uint64_t kStagingChunk = 1 << 20;

constexpr ErrorCode kHostMemoryAlreadyRegistered = static_cast<ErrorCode>(712);
constexpr ErrorCode kHostMemoryNotRegistered = static_cast<ErrorCode>(713);

const char* kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return "host-to-device";
    case CopyKind::kDeviceToHost: return "device-to-host";
    case CopyKind::kDeviceToDevice: return "device-to-device";
    case CopyKind::kHostToHost: return "host-to-host";
    case CopyKind::kDefault: return "default";
  }
  return "?";
}

}  // namespace

// ---- Device memory ----

Result<uint64_t> Client::allocate_segment_locked(uint64_t size, uint64_t asked, const char* what) {
  const wire::Grant& grant = calls_->session().grant;
  // Refused here rather than by hiberd later, at a synchronisation far from the call.
  if (grant.largest_allocation_bytes != 0 && size > grant.largest_allocation_bytes) {
    return error(ErrorCode::kOutOfMemory, what, ": ", asked,
                 " bytes in one allocation: this function may be served at most ",
                 grant.largest_allocation_bytes,
                 " bytes in one (its quota, bounded by the smallest GPU's memory pool)");
  }
  if (size > grant.quota_bytes || quota_used_ > grant.quota_bytes - size) {
    return error(ErrorCode::kOutOfMemory, what, ": ", asked, " bytes would exceed the ",
                 "function's device memory quota (", quota_used_, " of ", grant.quota_bytes,
                 " bytes in use)");
  }
  auto va = segments_.allocate(size);
  if (!va) {
    return error(ErrorCode::kOutOfMemory, what, ": no free range of ", size,
                 " bytes left in the granted address range");
  }
  Status sent = enqueue_locked(wire::calls::MemAllocate{.va = *va, .bytes = size});
  if (!sent.ok()) {
    segments_.free(*va);
    return sent;
  }
  quota_used_ += size;
  return *va;
}

Status Client::release_segment_locked(uint64_t segment) {
  quota_used_ -= segments_.free(segment);
  return enqueue_locked(wire::calls::MemFree{.va = segment});
}

Result<uint64_t> Client::malloc_device(uint64_t bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(check_unsafe_in_capture_locked("cudaMalloc"));
  if (bytes == 0) return uint64_t{0};
  const uint64_t granule = calls_->session().grant.allocation_granularity;
  auto back = [&](uint64_t size) -> Result<uint64_t> {
    Result<uint64_t> segment = allocate_segment_locked(size, bytes, "cudaMalloc");
    // Memory cached by the stream-ordered pools goes back first when the quota is short.
    if (!segment.ok() && segment.status().code() == ErrorCode::kOutOfMemory &&
        trim_pools_locked(/*all=*/true)) {
      segment = allocate_segment_locked(size, bytes, "cudaMalloc");
    }
    return segment;
  };

  if (bytes <= granule / 2) {
    for (auto& [start, slab] : slabs_) {
      if (auto piece = slab.space.allocate(bytes)) {
        allocations_.emplace(*piece, bytes);
        return *piece;
      }
    }
    HIBER_ASSIGN_OR_RETURN(uint64_t start, back(granule));
    Slab& slab =
        slabs_.emplace(start, Slab{RangeAllocator(start, granule, kSlabAlignment)}).first->second;
    const uint64_t piece = *slab.space.allocate(bytes);
    allocations_.emplace(piece, bytes);
    return piece;
  }
  HIBER_ASSIGN_OR_RETURN(uint64_t start, back(segments_.round_up(bytes)));
  allocations_.emplace(start, bytes);
  return start;
}

Status Client::free_device(uint64_t address) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (address == 0) return Status();  // cudaFree(nullptr) does nothing
  HIBER_RETURN_IF_ERROR(check_unsafe_in_capture_locked("cudaFree"));
  return free_device_locked(address, "cudaFree");
}

Status Client::free_device_locked(uint64_t address, const char* what) {
  auto it = allocations_.find(address);
  if (it == allocations_.end() || mappings_.count(address) != 0) {
    return error(
        ErrorCode::kInvalidValue, what, ": ", hex(address),
        " is not the start of a device allocation",
        mappings_.count(address) != 0 ? " (it is mapped with cuMemMap: cuMemUnmap it)" : "");
  }
  // cudaFree waits for the device, so nothing still running uses the memory when it is
  // reused. The wait is queued, not waited for here.
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::DeviceSynchronize{}));
  if (pool_allocations_.count(address) != 0) {
    // From a stream-ordered pool: back to it, after everything before (the wait above).
    return free_to_pool_locked(address, /*stream=*/nullptr, /*ordered=*/false);
  }
  allocations_.erase(it);
  uint64_t segment = address;
  if (auto slab = slab_holding(address); slab != slabs_.end()) {
    slab->second.space.free(address);
    if (!slab->second.space.empty()) return Status();
    segment = slab->first;
    slabs_.erase(slab);
  }
  return release_segment_locked(segment);
}

Status Client::reset_device() {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto reply = call_locked(wire::calls::DeviceSynchronize{});
  wait_host_calls_locked(nullptr, /*all=*/true);
  Status synced = sync_point_locked(reply.status());
  std::vector<uint64_t> segments;
  for (const auto& [start, bytes] : allocations_) {
    if (slab_holding(start) == slabs_.end() && pool_allocations_.count(start) == 0 &&
        mappings_.count(start) == 0) {
      segments.push_back(start);
    }
  }
  for (const auto& [start, slab] : slabs_) segments.push_back(start);
  auto add_pool = [&](const MemPoolObj* pool) {
    for (const auto& [start, space] : pool->segments) segments.push_back(start);
  };
  if (default_pool_) add_pool(default_pool_.get());
  for (const auto& [key, pool] : pools_) add_pool(pool.get());
  for (uint64_t segment : segments) HIBER_RETURN_IF_ERROR(release_segment_locked(segment));
  // Client virtual memory: every physical allocation's block, and every reservation.
  for (const auto& [handle, physical] : physicals_) {
    if (physical->block_at) {
      HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemFree{.va = *physical->block_at}));
      if (physical->own_segment) segments_.free(*physical->block_at);
    }
    quota_used_ -= physical->bytes;
  }
  for (const auto& [start, bytes] : reservations_) segments_.free(start);
  physicals_.clear();
  mappings_.clear();
  reservations_.clear();
  allocations_.clear();
  slabs_.clear();
  HIBER_RETURN_IF_ERROR(reset_pools_locked());
  std::vector<wire::EventHandle> events;
  for (const auto& [key, s] : streams_) {
    if (!s->join_event.is_zero()) events.push_back(s->join_event);
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::StreamDestroy{.stream = s->wire}));
  }
  for (const auto& [key, e] : events_) events.push_back(e->wire);
  if (!legacy_join_event_.is_zero()) events.push_back(legacy_join_event_);
  for (wire::EventHandle event : events) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::EventDestroy{.event = event}));
  }
  // Captures in progress end with their streams (their graphs are dropped). Graphs made before
  // are the program's to drop: CUDA destroys them here, and a launch of one fails in hiberd once
  // its kernels' module is unloaded.
  captures_.clear();
  capturing_.clear();
  streams_.clear();
  events_.clear();
  legacy_join_event_ = wire::EventHandle();
  for (const auto& [key, module] : modules_) {
    if (module->wire.is_zero()) continue;
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::ModuleUnload{.module = module->wire}));
    module->wire = wire::ModuleHandle();
    for (const auto& kernel : module->kernels) kernel->wire = wire::FunctionHandle();
  }
  HIBER_RETURN_IF_ERROR(calls_->flush());
  return synced;
}

MemoryInfo Client::memory_info() {
  std::lock_guard lock(mu_);
  if (!ensure_open_locked().ok()) return {};
  const uint64_t quota = calls_->session().grant.quota_bytes;
  return {quota - quota_used_, quota};
}

const std::pair<const uint64_t, uint64_t>* Client::allocation_holding(uint64_t address) const {
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return nullptr;
  --it;
  // A zero-size allocation (cudaMalloc(0) returns none, but be safe) still holds its start.
  return address - it->first < std::max<uint64_t>(it->second, 1) ? &*it : nullptr;
}

std::map<uint64_t, Client::Slab>::iterator Client::slab_holding(uint64_t address) {
  auto slab = slabs_.upper_bound(address);
  if (slab == slabs_.begin()) return slabs_.end();
  --slab;
  return address - slab->first < segments_.size_of(slab->first) ? slab : slabs_.end();
}

int Client::device_attribute(int device, int attr) {
  std::lock_guard lock(mu_);
  if (!ensure_open_locked().ok()) return 0;
  return attribute_locked(device, attr);
}

int Client::attribute_locked(int device, int attr) const {
  if (!calls_) return 0;
  const auto& devices = calls_->session().devices;
  if (device < 0 || device >= static_cast<int>(devices.size())) return 0;
  // What the shim does, whatever the GPU could do (mapped host memory, managed memory, pools...).
  if (int value = 0; shim_capability(attr, &value)) return value;
  const auto& values = devices[device].attributes;
  return attr >= 0 && attr < static_cast<int>(values.size()) ? values[attr] : 0;
}

Status Client::check_device_range_locked(uint64_t address, uint64_t bytes, const char* what) {
  if (const auto* held = allocation_holding(address)) {
    const uint64_t offset = address - held->first;
    if (offset < held->second && bytes <= held->second - offset) return Status();
    // Allocations mapped back to back with cuMemMap are one range to the program.
    if (in_adjacent_mappings_locked(address, bytes)) return Status();
  }
  return error(ErrorCode::kInvalidValue, what, ": [", hex(address), ", ", hex(address + bytes),
               ") is not inside one device allocation");
}

// ---- Host memory ----

PointerInfo Client::classify_locked(const void* pointer, uint64_t bytes) {
  PointerInfo info;
  const auto address = reinterpret_cast<uint64_t>(pointer);
  if (calls_) {
    // Device memory is what this client allocated: any other address, even inside the grant,
    // is not a device pointer the program may use.
    if (allocation_holding(address) != nullptr) {
      info.kind = PointerKind::kDevice;
      return info;
    }
    std::span<std::byte> arena = calls_->channel().arena();
    const auto arena_start = reinterpret_cast<uint64_t>(arena.data());
    const uint64_t offset = address - arena_start;
    if (address >= arena_start && offset < arena.size() && bytes <= arena.size() - offset &&
        arena_heap_.find(offset)) {
      info.kind = PointerKind::kArena;
      info.pinned = true;
      info.arena_offset = offset;
      return info;
    }
  }
  auto it = pinned_ranges_.upper_bound(address);
  if (it != pinned_ranges_.begin()) {
    --it;
    info.pinned = address - it->first < it->second;
  }
  return info;
}

PointerInfo Client::classify(const void* pointer, uint64_t bytes) {
  std::lock_guard lock(mu_);
  return classify_locked(pointer, bytes);
}

std::optional<PointerRange> Client::pointer_range(const void* pointer) {
  std::lock_guard lock(mu_);
  const auto address = reinterpret_cast<uint64_t>(pointer);
  if (calls_) {
    if (const auto* held = allocation_holding(address)) {
      return PointerRange{PointerKind::kDevice, held->first, held->second};
    }
    std::span<std::byte> arena = calls_->channel().arena();
    const auto arena_start = reinterpret_cast<uint64_t>(arena.data());
    if (address >= arena_start && address - arena_start < arena.size()) {
      if (auto block = arena_heap_.find(address - arena_start)) {
        return PointerRange{PointerKind::kArena, arena_start + block->first, block->second};
      }
    }
  }
  auto it = pinned_ranges_.upper_bound(address);
  if (it != pinned_ranges_.begin()) {
    --it;
    if (address - it->first < it->second) {
      return PointerRange{PointerKind::kHost, it->first, it->second};
    }
  }
  return std::nullopt;
}

Result<void*> Client::malloc_host(uint64_t bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (bytes == 0) return static_cast<void*>(nullptr);
  if (auto offset = arena_heap_.allocate(bytes)) {
    return static_cast<void*>(calls_->channel().arena().data() + *offset);
  }
  // The arena is full: plain memory, which copies stage like pageable memory. Correct, slower.
  const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  void* memory = std::aligned_alloc(4096, rounded);
  if (memory == nullptr) {
    return error(ErrorCode::kOutOfMemory, "cudaMallocHost: cannot allocate ", bytes, " bytes");
  }
  const auto address = reinterpret_cast<uint64_t>(memory);
  host_allocs_.emplace(address, bytes);
  pinned_ranges_.emplace(address, bytes);
  return memory;
}

Status Client::free_host(void* pointer) {
  if (pointer == nullptr) return Status();
  std::unique_lock lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  const auto address = reinterpret_cast<uint64_t>(pointer);
  const PointerInfo info = classify_locked(pointer, 1);
  if (info.kind == PointerKind::kArena && arena_heap_.size_of(info.arena_offset) != 0) {
    // cudaFreeHost waits for the device: an async copy may still read or write the buffer.
    auto reply = call_locked(wire::calls::DeviceSynchronize{});
    Status synced = sync_point_locked(reply.status());
    arena_heap_.free(info.arena_offset);
    return synced;
  }
  auto it = host_allocs_.find(address);
  if (it == host_allocs_.end()) {
    return error(ErrorCode::kInvalidValue, "cudaFreeHost: ", pointer,
                 " was not allocated by cudaMallocHost/cudaHostAlloc");
  }
  host_allocs_.erase(it);
  pinned_ranges_.erase(address);
  std::free(pointer);
  return Status();
}

Status Client::register_host(void* pointer, uint64_t bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (pointer == nullptr || bytes == 0) {
    return Status(ErrorCode::kInvalidValue, "cudaHostRegister: null pointer or zero size");
  }
  const auto address = reinterpret_cast<uint64_t>(pointer);
  auto next = pinned_ranges_.lower_bound(address);
  const bool overlaps_next = next != pinned_ranges_.end() && next->first < address + bytes;
  bool overlaps_prev = false;
  if (next != pinned_ranges_.begin()) {
    auto prev = std::prev(next);
    overlaps_prev = prev->first + prev->second > address;
  }
  if (overlaps_next || overlaps_prev || classify_locked(pointer, 1).kind != PointerKind::kHost) {
    return error(kHostMemoryAlreadyRegistered, "cudaHostRegister: ", pointer,
                 " is already registered or pinned");
  }
  pinned_ranges_.emplace(address, bytes);
  return Status();
}

Status Client::unregister_host(void* pointer) {
  std::unique_lock lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  const auto address = reinterpret_cast<uint64_t>(pointer);
  if (host_allocs_.count(address) != 0 || pinned_ranges_.count(address) == 0) {
    return error(kHostMemoryNotRegistered, "cudaHostUnregister: ", pointer,
                 " was not registered with cudaHostRegister");
  }
  pinned_ranges_.erase(address);
  return Status();
}

// ---- Copies ----

Status Client::memcpy(void* dst, const void* src, uint64_t bytes, CopyKind kind, StreamObj* stream,
                      bool async) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (bytes == 0) return Status();
  if (dst == nullptr || src == nullptr) {
    return Status(ErrorCode::kInvalidValue, "cudaMemcpy: null pointer");
  }
  const bool dst_device = classify_locked(dst, bytes).kind == PointerKind::kDevice;
  const bool src_device = classify_locked(src, bytes).kind == PointerKind::kDevice;
  const CopyKind actual = src_device
                              ? (dst_device ? CopyKind::kDeviceToDevice : CopyKind::kDeviceToHost)
                              : (dst_device ? CopyKind::kHostToDevice : CopyKind::kHostToHost);
  if (kind != CopyKind::kDefault && kind != actual) {
    return error(ErrorCode::kInvalidValue, "cudaMemcpy: a ", kind_name(kind), " copy from ", src,
                 " to ", dst, ", but these pointers make it ", kind_name(actual));
  }
  if (CaptureObj* capture = capture_of_locked(stream)) {
    // A graph's copy runs at each launch: it may name device memory and cudaMallocHost memory
    // (read and written where it is then), not memory the copy would stage now.
    const bool pinned_side = actual == CopyKind::kHostToDevice
                                 ? classify_locked(src, bytes).kind == PointerKind::kArena
                             : actual == CopyKind::kDeviceToHost
                                 ? classify_locked(dst, bytes).kind == PointerKind::kArena
                                 : actual == CopyKind::kDeviceToDevice;
    if (!async || !pinned_side) {
      return refuse_in_capture_locked(
          *capture, async ? "a copy from or to memory other than device or cudaMallocHost memory"
                          : "a synchronous copy");
    }
  } else if (!async && actual != CopyKind::kDeviceToDevice) {
    HIBER_RETURN_IF_ERROR(check_unsafe_in_capture_locked("a synchronous copy"));
  }
  const auto dst_address = reinterpret_cast<uint64_t>(dst);
  const auto src_address = reinterpret_cast<uint64_t>(src);
  switch (actual) {
    case CopyKind::kHostToDevice:
      return copy_to_device_locked(dst_address, src, bytes, stream, async);
    case CopyKind::kDeviceToHost:
      return copy_from_device_locked(dst, src_address, bytes, stream, async);
    case CopyKind::kDeviceToDevice: {
      HIBER_RETURN_IF_ERROR(
          check_device_range_locked(dst_address, bytes, "cudaMemcpy destination"));
      HIBER_RETURN_IF_ERROR(check_device_range_locked(src_address, bytes, "cudaMemcpy source"));
      HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
      // Device-to-device copies never block the host, synchronous or not, as in CUDA.
      return enqueue_locked(wire::calls::MemcpyDtoD{
          .stream = stream_wire(stream), .dst = dst_address, .src = src_address, .bytes = bytes});
    }
    default: {
      // Host to host: in stream order, so wait for the stream first.
      auto reply = call_locked(wire::calls::StreamSynchronize{.stream = stream_wire(stream)});
      HIBER_RETURN_IF_ERROR(sync_point_locked(reply.status()));
      std::memmove(dst, src, bytes);
      return Status();
    }
  }
}

Status Client::copy_to_device_locked(uint64_t dst, const void* src, uint64_t bytes,
                                     StreamObj* stream, bool async) {
  HIBER_RETURN_IF_ERROR(check_device_range_locked(dst, bytes, "cudaMemcpy destination"));
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  const wire::StreamHandle s = stream_wire(stream);
  const PointerInfo from = classify_locked(src, bytes);
  if (from.kind == PointerKind::kArena) {
    // Pinned memory in the arena: hiberd reads it where it is.
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemcpyHtoD{
        .stream = s, .dst = dst, .src_offset = from.arena_offset, .bytes = bytes}));
  } else {
    // Any other host memory is captured into staging now, so the call returns with the source
    // free for reuse, as CUDA's pageable copies do.
    const auto* from_bytes = static_cast<const std::byte*>(src);
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t chunk = std::min(kStagingChunk, bytes - done);
      HIBER_ASSIGN_OR_RETURN(wire::CallClient::Staged staged, calls_->stage(chunk));
      std::memcpy(staged.bytes.data(), from_bytes + done, chunk);
      HIBER_RETURN_IF_ERROR(
          enqueue_locked(wire::calls::MemcpyHtoD{.stream = s,
                                                 .dst = dst + done,
                                                 .src_offset = staged.offset,
                                                 .bytes = chunk,
                                                 .staging_end = staged.staging_end}));
      done += chunk;
      // A large copy: let hiberd start on this chunk while the next one is captured.
      if (bytes > kStagingChunk) HIBER_RETURN_IF_ERROR(calls_->flush());
    }
  }
  if (async) return Status();
  auto reply = call_locked(wire::calls::StreamSynchronize{.stream = s});
  return sync_point_locked(reply.status());
}

Status Client::copy_from_device_locked(void* dst, uint64_t src, uint64_t bytes, StreamObj* stream,
                                       bool async) {
  HIBER_RETURN_IF_ERROR(check_device_range_locked(src, bytes, "cudaMemcpy source"));
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  const wire::StreamHandle s = stream_wire(stream);
  const PointerInfo to = classify_locked(dst, bytes);
  if (to.kind == PointerKind::kArena) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemcpyDtoH{
        .stream = s, .dst_offset = to.arena_offset, .src = src, .bytes = bytes}));
    if (async) return Status();
    auto reply = call_locked(wire::calls::StreamSynchronize{.stream = s});
    if (reply.ok()) note_idle_locked(stream);
    return sync_point_locked(reply.status());
  }
  // Memory outside the arena is written by the client after each chunk's reply; the copy is
  // synchronous, as CUDA's copies to pageable memory are. A few chunks are in flight at once, so
  // hiberd copies the next while the client copies out the last. The window is at most a
  // quarter of staging, so a chunk's bytes are copied out long before staging reuses them.
  auto* to_bytes = static_cast<std::byte*>(dst);
  const uint64_t chunk_limit = std::max<uint64_t>(kStagingChunk, calls_->staging_capacity() / 16);
  constexpr size_t kWindow = 4;
  struct InFlight {
    uint64_t seq;
    std::span<std::byte> staged;
    uint64_t offset;
  };
  std::deque<InFlight> in_flight;
  Status failed;
  uint64_t issued = 0;
  while (issued < bytes || !in_flight.empty()) {
    while (failed.ok() && issued < bytes && in_flight.size() < kWindow) {
      const uint64_t chunk = std::min(chunk_limit, bytes - issued);
      auto staged = calls_->stage(chunk);
      if (!staged.ok()) {
        failed = staged.status();
        break;
      }
      auto seq =
          calls_->append_awaited(wire::calls::MemcpyDtoH{.stream = s,
                                                         .dst_offset = staged->offset,
                                                         .src = src + issued,
                                                         .bytes = chunk,
                                                         .staging_end = staged->staging_end});
      if (!seq.ok()) {
        failed = seq.status();
        break;
      }
      in_flight.push_back({*seq, staged->bytes, issued});
      issued += chunk;
    }
    if (Status sent = calls_->flush(); !sent.ok() && failed.ok()) failed = sent;
    if (in_flight.empty()) break;
    const InFlight next = in_flight.front();
    in_flight.pop_front();
    auto reply = calls_->wait(next.seq);
    if (!reply.ok() && failed.ok()) failed = reply.status();
    if (failed.ok()) std::memcpy(to_bytes + next.offset, next.staged.data(), next.staged.size());
  }
  // The last chunk's reply came after all earlier work on the stream was done.
  if (failed.ok()) note_idle_locked(stream);
  return sync_point_locked(lost_session_locked(failed, /*answer_lost=*/true));
}

Status Client::memset(uint64_t dst, uint32_t value, int element_bytes, uint64_t count,
                      StreamObj* stream, bool async) {
  (void)async;  // memsets of device memory never block the host, as in CUDA
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (count == 0) return Status();
  HIBER_RETURN_IF_ERROR(check_device_range_locked(dst, count * element_bytes, "cudaMemset"));
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  return enqueue_locked(wire::calls::Memset{.stream = stream_wire(stream),
                                            .dst = dst,
                                            .value = value,
                                            .element_bytes = static_cast<uint8_t>(element_bytes),
                                            .count = count});
}

}  // namespace hiber::shim
