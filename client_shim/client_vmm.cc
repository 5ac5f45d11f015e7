// Client virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, ...), carved
// from the function's memory: reservations are ranges of the grant, a physical allocation counts
// against the quota when it is created, and its contents are a block in hiberd at the address it
// is mapped at, so it travels with the function under late binding and swaps like cudaMalloc
// memory. What cannot work through hiberd is refused: mapping part of an allocation, one
// allocation at two addresses at once, and exporting one to another process.
#include "client_shim/client.h"

namespace hiber::shim {

uint64_t Client::allocation_granularity() {
  std::lock_guard lock(mu_);
  if (!ensure_open_locked().ok()) return 0;
  return calls_->session().grant.allocation_granularity;
}

const std::pair<const uint64_t, uint64_t>* Client::reservation_holding_locked(
    uint64_t address) const {
  auto it = reservations_.upper_bound(address);
  if (it == reservations_.begin()) return nullptr;
  --it;
  return address - it->first < it->second ? &*it : nullptr;
}

bool Client::in_adjacent_mappings_locked(uint64_t address, uint64_t bytes) const {
  auto it = mappings_.upper_bound(address);
  if (it == mappings_.begin()) return false;
  --it;
  uint64_t at = address;
  const uint64_t end = address + bytes;
  while (it != mappings_.end() && it->first <= at && at < it->first + it->second->bytes) {
    at = it->first + it->second->bytes;
    if (at >= end) return true;
    ++it;
  }
  return false;
}

Result<uint64_t> Client::reserve_address(uint64_t bytes, uint64_t alignment) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  const uint64_t granule = calls_->session().grant.allocation_granularity;
  if (bytes == 0 || bytes % granule != 0) {
    return error(ErrorCode::kInvalidValue, "cuMemAddressReserve: ", bytes,
                 " bytes is not a multiple of the granularity (", granule, ")");
  }
  if (alignment != 0 && ((alignment & (alignment - 1)) != 0 || alignment > granule)) {
    return error(ErrorCode::kInvalidValue, "cuMemAddressReserve: alignment ", alignment,
                 " (the shim aligns reservations to the granularity, ", granule, ", and no more)");
  }
  auto va = segments_.allocate(bytes);
  if (!va) {
    return error(ErrorCode::kOutOfMemory, "cuMemAddressReserve: no free range of ", bytes,
                 " bytes left in the function's address range (", calls_->session().grant.va_bytes,
                 " bytes)");
  }
  reservations_.emplace(*va, bytes);
  return *va;
}

Status Client::free_address(uint64_t address, uint64_t bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto it = reservations_.find(address);
  if (it == reservations_.end() || it->second != bytes) {
    return error(ErrorCode::kInvalidValue, "cuMemAddressFree: [", hex(address), ", +", bytes,
                 ") is not a range cuMemAddressReserve returned");
  }
  auto mapped = mappings_.lower_bound(address);
  if (mapped != mappings_.end() && mapped->first < address + bytes) {
    return error(ErrorCode::kInvalidValue, "cuMemAddressFree: ", hex(mapped->first),
                 " in the range is still mapped");
  }
  // Allocations unmapped but not released keep their contents: out of the range they go.
  HIBER_RETURN_IF_ERROR(move_parked_out_locked(address, bytes));
  reservations_.erase(it);
  segments_.free(address);
  return Status();
}

Result<PhysicalObj*> Client::create_physical(uint64_t bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  const wire::Grant& grant = calls_->session().grant;
  if (bytes == 0 || bytes % grant.allocation_granularity != 0) {
    return error(ErrorCode::kInvalidValue, "cuMemCreate: ", bytes,
                 " bytes is not a multiple of the granularity (", grant.allocation_granularity,
                 ")");
  }
  if (grant.largest_allocation_bytes != 0 && bytes > grant.largest_allocation_bytes) {
    return error(ErrorCode::kOutOfMemory, "cuMemCreate: ", bytes,
                 " bytes in one allocation: ", "this function may be served at most ",
                 grant.largest_allocation_bytes);
  }
  if (bytes > grant.quota_bytes || quota_used_ > grant.quota_bytes - bytes) {
    if (!trim_pools_locked(/*all=*/true) || quota_used_ > grant.quota_bytes - bytes) {
      return error(ErrorCode::kOutOfMemory, "cuMemCreate: ", bytes, " bytes would exceed the ",
                   "function's device memory quota (", quota_used_, " of ", grant.quota_bytes,
                   " bytes in use)");
    }
  }
  auto physical = std::make_unique<PhysicalObj>();
  physical->bytes = bytes;
  PhysicalObj* made = physical.get();
  physicals_.emplace(reinterpret_cast<uint64_t>(made), std::move(physical));
  quota_used_ += bytes;
  return made;
}

Result<PhysicalObj*> Client::physical(uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = physicals_.find(handle);
  if (it == physicals_.end() || it->second->references == 0) {
    return error(ErrorCode::kInvalidValue, "unknown physical allocation handle ", hex(handle));
  }
  return it->second.get();
}

Result<PhysicalObj*> Client::physical_at(uint64_t address) {
  std::lock_guard lock(mu_);
  auto it = mappings_.find(address);
  if (it == mappings_.end()) {
    return error(ErrorCode::kInvalidValue, "cuMemRetainAllocationHandle: ", hex(address),
                 " is not where an allocation is mapped");
  }
  ++it->second->references;  // the program releases this handle too
  return it->second;
}

Status Client::release_physical(PhysicalObj* physical) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (--physical->references > 0) return Status();
  if (physical->mapped_at) return Status();  // as CUDA: freed once unmapped
  if (physical->block_at) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::DeviceSynchronize{}));
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemFree{.va = *physical->block_at}));
    if (physical->own_segment) segments_.free(*physical->block_at);
  }
  quota_used_ -= physical->bytes;
  physicals_.erase(reinterpret_cast<uint64_t>(physical));
  return Status();
}

Status Client::move_block_locked(PhysicalObj* physical, uint64_t to) {
  const uint64_t from = *physical->block_at;
  const wire::Grant& grant = calls_->session().grant;
  // hiberd holds both blocks while the contents are copied.
  if (quota_used_ > grant.quota_bytes - std::min(grant.quota_bytes, physical->bytes)) {
    return error(ErrorCode::kOutOfMemory, "moving an unmapped allocation of ", physical->bytes,
                 " bytes to ", hex(to), " needs that much of the quota free while it is copied (",
                 quota_used_, " of ", grant.quota_bytes, " bytes in use)");
  }
  HIBER_RETURN_IF_ERROR(
      enqueue_locked(wire::calls::MemAllocate{.va = to, .bytes = physical->bytes}));
  HIBER_RETURN_IF_ERROR(order_for_work_locked(nullptr));
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemcpyDtoD{
      .stream = wire::StreamHandle(), .dst = to, .src = from, .bytes = physical->bytes}));
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::DeviceSynchronize{}));
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemFree{.va = from}));
  if (physical->own_segment) segments_.free(from);
  physical->block_at = to;
  physical->own_segment = false;
  return Status();
}

Status Client::move_parked_out_locked(uint64_t address, uint64_t bytes) {
  for (const auto& [handle, physical] : physicals_) {
    if (physical->mapped_at || !physical->block_at) continue;
    const uint64_t at = *physical->block_at;
    if (at >= address + bytes || at + physical->bytes <= address) continue;
    auto segment = segments_.allocate(physical->bytes);
    if (!segment) {
      return error(ErrorCode::kOutOfMemory, "no free range of ", physical->bytes,
                   " bytes to keep an unmapped allocation's contents in");
    }
    Status moved = move_block_locked(physical.get(), *segment);
    if (!moved.ok()) {
      segments_.free(*segment);
      return moved;
    }
    physical->own_segment = true;
  }
  return Status();
}

Status Client::map_physical(uint64_t address, uint64_t bytes, uint64_t offset,
                            PhysicalObj* physical) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (offset != 0 || bytes != physical->bytes) {
    return error(ErrorCode::kInvalidValue, "cuMemMap: ", bytes, " bytes at offset ", offset,
                 " of an allocation of ", physical->bytes,
                 ": the shim maps whole allocations only (offset 0, its size)");
  }
  if (physical->mapped_at) {
    return error(ErrorCode::kInvalidValue, "cuMemMap: the allocation is mapped at ",
                 hex(*physical->mapped_at),
                 " already; the shim maps an allocation at one address at a time");
  }
  const auto* reservation = reservation_holding_locked(address);
  if (reservation == nullptr || bytes > reservation->first + reservation->second - address) {
    return error(ErrorCode::kInvalidValue, "cuMemMap: [", hex(address), ", +", bytes,
                 ") is not inside a range cuMemAddressReserve returned");
  }
  auto next = mappings_.lower_bound(address);
  bool overlaps = next != mappings_.end() && next->first < address + bytes;
  if (next != mappings_.begin()) {
    auto before = std::prev(next);
    overlaps |= before->first + before->second->bytes > address;
  }
  if (overlaps) {
    return error(ErrorCode::kInvalidValue, "cuMemMap: [", hex(address), ", +", bytes,
                 ") overlaps a mapping");
  }
  if (physical->block_at != address) {
    // Contents of other allocations parked here move out first, then this one's move in.
    HIBER_RETURN_IF_ERROR(move_parked_out_locked(address, bytes));
    if (physical->block_at) {
      HIBER_RETURN_IF_ERROR(move_block_locked(physical, address));
    } else {
      HIBER_RETURN_IF_ERROR(
          enqueue_locked(wire::calls::MemAllocate{.va = address, .bytes = bytes}));
      physical->block_at = address;
    }
  }
  physical->mapped_at = address;
  mappings_.emplace(address, physical);
  allocations_.emplace(address, bytes);
  return Status();
}

Status Client::unmap_range(uint64_t address, uint64_t bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  // Whole mappings, back to back, exactly covering the range (as CUDA requires).
  std::vector<PhysicalObj*> unmapping;
  uint64_t at = address;
  while (at < address + bytes) {
    auto it = mappings_.find(at);
    if (it == mappings_.end()) {
      return error(ErrorCode::kInvalidValue, "cuMemUnmap: [", hex(address), ", +", bytes,
                   ") is not whole mappings (nothing is mapped at ", hex(at), ")");
    }
    unmapping.push_back(it->second);
    at += it->second->bytes;
  }
  if (at != address + bytes || unmapping.empty()) {
    return error(ErrorCode::kInvalidValue, "cuMemUnmap: [", hex(address), ", +", bytes,
                 ") ends inside a mapping");
  }
  // Work in flight may still use the memory: the contents stay (parked) unless released.
  for (PhysicalObj* physical : unmapping) {
    mappings_.erase(*physical->mapped_at);
    allocations_.erase(*physical->mapped_at);
    physical->mapped_at.reset();
    if (physical->references == 0) {
      HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::DeviceSynchronize{}));
      HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemFree{.va = *physical->block_at}));
      quota_used_ -= physical->bytes;
      physicals_.erase(reinterpret_cast<uint64_t>(physical));
    }
  }
  return Status();
}

Status Client::check_mapped(uint64_t address, uint64_t bytes, const char* what) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (bytes != 0 && in_adjacent_mappings_locked(address, bytes)) return Status();
  return error(ErrorCode::kInvalidValue, what, ": [", hex(address), ", +", bytes,
               ") is not mapped with cuMemMap");
}

}  // namespace hiber::shim
