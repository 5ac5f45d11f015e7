#include "server/device/sim/address_space.h"

#include <glog/logging.h>
#include <sys/mman.h>

#include <bit>
#include <iterator>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace hiber::device::sim {
namespace {

bool overflows(uint64_t va, uint64_t bytes) { return bytes > UINT64_MAX - va; }

// Reserves [va, va + bytes) as inaccessible address space, replacing whatever is there.
bool map_inaccessible(DevicePtr va, uint64_t bytes) {
  void* p = ::mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

// Larger requests than this cannot be met by a 47-bit user address space anyway.
constexpr uint64_t kMaxReserveBytes = uint64_t{1} << 46;

// Device addresses go to clients, which keep their grant free in their own address space too
// (client_shim reserves it with MAP_FIXED_NOREPLACE, and what is already mapped there is lost
// to cudaMalloc). Ranges the kernel picks for hiberd lie among the libraries and mmaps that
// clients have at the same heights, so a grant could collide with most of a client's. Reserve
// from here instead: above every sanitizer's shadow (ASan's ends at 0x10007fff7fff; this is
// the start of ThreadSanitizer's high application range) and 1.5 TiB below where Linux places
// mappings top-down from the stack, where a process almost never has anything.
constexpr uint64_t kPreferredBase = 0x7e8000000000;
constexpr uint64_t kPreferredEnd = 0x7f8000000000;
constexpr int kPreferredTries = 16;

uint64_t align_up(uint64_t v, uint64_t align) { return (v + align - 1) & ~(align - 1); }

}  // namespace

AddressSpace::~AddressSpace() {
  for (const auto& [va, bytes] : reservations_) ::munmap(reinterpret_cast<void*>(va), bytes);
}

Result<DevicePtr> AddressSpace::reserve_at(DevicePtr va, uint64_t bytes) {
  if (bytes == 0 || bytes % granularity_ != 0 || va % granularity_ != 0 ||
      bytes > kMaxReserveBytes || va > UINT64_MAX - bytes)
    return error(ErrorCode::kInvalidValue, "reserve_address_range_at(", va, ", ", bytes,
                 "): not a range of whole granules (", granularity_, ")");
  WriterLock lock(mu_);
  void* p = ::mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != reinterpret_cast<void*>(va)) {
    if (p != MAP_FAILED) ::munmap(p, bytes);  // a kernel without MAP_FIXED_NOREPLACE
    // Say by what: the first mapping of this process inside the range.
    std::string by = "something";
    if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, maps) != nullptr) {
        unsigned long long start = 0, end = 0;
        if (std::sscanf(line, "%llx-%llx", &start, &end) == 2 && start < va + bytes && end > va) {
          by = line;
          while (!by.empty() && by.back() == '\n') by.pop_back();
          break;
        }
      }
      std::fclose(maps);
    }
    return error(ErrorCode::kAlreadyMapped, "reserve_address_range_at: [", hex(va), ", +", bytes,
                 ") is taken by ", by);
  }
  reservations_.emplace(va, bytes);
  return va;
}

Result<DevicePtr> AddressSpace::reserve(uint64_t bytes, uint64_t alignment) {
  if (bytes == 0 || bytes % granularity_ != 0)
    return error(ErrorCode::kInvalidValue, "reserve_address_range: ", bytes,
                 " bytes is not a positive multiple of the granularity (", granularity_, ")");
  if ((alignment & (alignment - 1)) != 0)
    return error(ErrorCode::kInvalidValue, "reserve_address_range: alignment ", alignment,
                 " is not a power of two");
  const uint64_t align = std::max(alignment, granularity_);
  if (bytes > kMaxReserveBytes || align > kMaxReserveBytes)
    return error(ErrorCode::kOutOfMemory, "reserve_address_range: ", bytes, " bytes aligned to ",
                 align, " exceed the address space");
  {
    WriterLock lock(mu_);
    for (int attempt = 0; attempt < kPreferredTries; ++attempt) {
      uint64_t want = align_up(next_preferred_, align);
      // Past this space's own ranges in the way (ranges kept for sessions being resumed, which
      // reserve_at placed anywhere in the region), without spending a try on each.
      for (auto own = reservations_.upper_bound(want); want < kPreferredEnd;) {
        if (own != reservations_.begin() && std::prev(own)->first + std::prev(own)->second > want) {
          want = align_up(std::prev(own)->first + std::prev(own)->second, align);
        } else if (own != reservations_.end() && own->first < want + bytes) {
          want = align_up(own->first + own->second, align);
        } else {
          break;
        }
        own = reservations_.upper_bound(want);
      }
      if (want >= kPreferredEnd || bytes > kPreferredEnd - want) break;
      void* p = ::mmap(reinterpret_cast<void*>(want), bytes, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
      if (p == reinterpret_cast<void*>(want)) {
        next_preferred_ = want + bytes;
        reservations_.emplace(want, bytes);
        return want;
      }
      // Taken (or a kernel without MAP_FIXED_NOREPLACE put it elsewhere): skip past it.
      if (p != MAP_FAILED) ::munmap(p, bytes);
      next_preferred_ = want + std::max<uint64_t>(bytes, uint64_t{1} << 30);
    }
  }
  // The preferred region is used up or taken: anywhere the kernel likes.
  // Over-reserve by the alignment, then trim both ends.
  const uint64_t span = bytes + align;
  void* p = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return error(ErrorCode::kOutOfMemory, "reserve_address_range: mmap of ", span,
                 " bytes failed: ", std::strerror(errno));
  const uint64_t base = reinterpret_cast<uint64_t>(p);
  const DevicePtr va = (base + align - 1) & ~(align - 1);
  if (va > base) ::munmap(p, va - base);
  if (base + span > va + bytes)
    ::munmap(reinterpret_cast<void*>(va + bytes), base + span - va - bytes);
  WriterLock lock(mu_);
  reservations_.emplace(va, bytes);
  return va;
}

Status AddressSpace::free(DevicePtr va, uint64_t bytes) {
  WriterLock lock(mu_);
  auto it = reservations_.find(va);
  if (it == reservations_.end() || it->second != bytes)
    return error(ErrorCode::kInvalidValue, "free_address_range: [", hex(va), ", +", bytes,
                 ") is not a range reserve_address_range returned");
  auto mapped = mappings_.lower_bound(va);
  if (mapped != mappings_.end() && mapped->first < va + bytes)
    return error(ErrorCode::kInvalidValue, "free_address_range: ", hex(mapped->first),
                 " in the range is still mapped; unmap it first");
  if (::munmap(reinterpret_cast<void*>(va), bytes) != 0)
    return os_error("free_address_range: munmap");
  reservations_.erase(it);
  return Status();
}

std::map<DevicePtr, uint64_t>::const_iterator AddressSpace::reservation_of(DevicePtr va,
                                                                           uint64_t bytes) const {
  auto it = reservations_.upper_bound(va);
  if (it == reservations_.begin()) return reservations_.end();
  --it;
  if (va - it->first > it->second || bytes > it->second - (va - it->first))
    return reservations_.end();
  return it;
}

Status AddressSpace::map(DevicePtr va, uint64_t bytes, std::shared_ptr<PhysicalBlock> block,
                         uint64_t offset) {
  if (bytes == 0 || va % granularity_ != 0 || bytes % granularity_ != 0 ||
      offset % granularity_ != 0)
    return error(ErrorCode::kInvalidValue, "map: address ", hex(va), ", size ", bytes,
                 " and offset ", offset, " must be multiples of the granularity (", granularity_,
                 ") and the size positive");
  if (overflows(va, bytes)) return error(ErrorCode::kInvalidValue, "map: range wraps around");
  if (offset > block->bytes() || bytes > block->bytes() - offset)
    return error(ErrorCode::kInvalidValue, "map: [", offset, ", +", bytes,
                 ") is outside the physical allocation of ", block->bytes(), " bytes");
  WriterLock lock(mu_);
  if (reservation_of(va, bytes) == reservations_.end())
    return error(ErrorCode::kInvalidValue, "map: [", hex(va), ", +", bytes,
                 ") is not inside one reserved address range");
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + bytes)
    return error(ErrorCode::kAlreadyMapped, "map: ", hex(next->first), " is already mapped");
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > va)
      return error(ErrorCode::kAlreadyMapped, "map: ", hex(va),
                   " is already mapped (by the mapping at ", hex(prev->first), ")");
  }
  void* p =
      ::mmap(reinterpret_cast<void*>(va), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
             block->fd(), static_cast<off_t>(block->offset() + offset));
  if (p == MAP_FAILED) {
    int err = errno;
    // A failed MAP_FIXED may have removed the reservation's pages; put them back.
    CHECK(map_inaccessible(va, bytes)) << "cannot restore reserved range: " << std::strerror(errno);
    return error(ErrorCode::kMapFailed, "map: mmap at ", hex(va), ": ", std::strerror(err));
  }
  mappings_.emplace(va, Mapping{bytes, std::move(block), offset, 0});
  return Status();
}

Result<std::pair<AddressSpace::MappingMap::iterator, AddressSpace::MappingMap::iterator>>
AddressSpace::whole_mappings(DevicePtr va, uint64_t bytes, const char* operation) {
  if (bytes == 0 || overflows(va, bytes))
    return error(ErrorCode::kInvalidValue, operation, ": empty or wrapping range");
  auto first = mappings_.find(va);
  if (first == mappings_.end())
    return error(ErrorCode::kInvalidValue, operation, ": ", hex(va),
                 " is not the start of a mapping");
  auto it = first;
  DevicePtr at = va;
  while (at < va + bytes) {
    if (it == mappings_.end() || it->first != at)
      return error(ErrorCode::kInvalidValue, operation, ": ", hex(at), " in [", hex(va), ", +",
                   bytes, ") is not mapped");
    at += it->second.bytes;
    ++it;
  }
  if (at != va + bytes)
    return error(ErrorCode::kInvalidValue, operation, ": [", hex(va), ", +", bytes,
                 ") ends inside a mapping (which ends at ", hex(at),
                 "); the range must cover whole mappings");
  return std::make_pair(first, it);
}

Status AddressSpace::unmap(DevicePtr va, uint64_t bytes) {
  std::vector<Mapping> removed;  // dropped after the lock: freeing memory punches holes
  {
    WriterLock lock(mu_);
    HIBER_ASSIGN_OR_RETURN(auto range, whole_mappings(va, bytes, "unmap"));
    if (!map_inaccessible(va, bytes))
      return error(ErrorCode::kMapFailed, "unmap: mmap at ", hex(va), ": ", std::strerror(errno));
    for (auto it = range.first; it != range.second; ++it) removed.push_back(std::move(it->second));
    mappings_.erase(range.first, range.second);
  }
  return Status();
}

Status AddressSpace::set_access(DevicePtr va, uint64_t bytes, uint64_t gpu_mask,
                                std::span<const uint64_t> reachers) {
  WriterLock lock(mu_);
  HIBER_ASSIGN_OR_RETURN(auto range, whole_mappings(va, bytes, "set_access"));
  for (auto it = range.first; it != range.second; ++it) {
    const int owner = it->second.block->gpu();
    const uint64_t unreachable = gpu_mask & ~reachers[owner];
    if (unreachable != 0)
      return error(ErrorCode::kPeerAccessUnsupported, "set_access: GPU ",
                   std::countr_zero(unreachable), " cannot access memory of GPU ", owner,
                   " (no peer access between them), mapped at ", hex(it->first));
  }
  for (auto it = range.first; it != range.second; ++it) it->second.access_mask = gpu_mask;
  return Status();
}

Result<int> AddressSpace::check(const DeviceRange& range) const {
  ReaderLock lock(mu_);
  HIBER_RETURN_IF_ERROR(check_locked(range, ErrorCode::kInvalidValue));
  auto it = std::prev(mappings_.upper_bound(range.va));  // exists: the check found it
  return it->second.block->gpu();
}

Status AddressSpace::check_argument(uint64_t word, int gpu) const {
  ReaderLock lock(mu_);
  const auto in = reservation_of(word, 0);
  if (in == reservations_.end()) return Status();
  const Status at = check_locked({word, 1, gpu}, ErrorCode::kIllegalAddress);
  if (at.ok()) return at;
  // One past the end of accessible memory, within one reserved range: the start of another
  // range (another function's, whose first block may lie there) is never that.
  if (word > in->first && check_locked({word - 1, 1, gpu}, ErrorCode::kIllegalAddress).ok())
    return Status();
  return at;
}

std::byte* AddressSpace::direct_locked(const DeviceRange& range) const {
  if (range.bytes == 0) return nullptr;
  auto it = std::prev(mappings_.upper_bound(range.va));  // exists: the check found it
  const Mapping& m = it->second;
  if (range.va + range.bytes > it->first + m.bytes) return reinterpret_cast<std::byte*>(range.va);
  return m.block->view() + m.block_offset + (range.va - it->first);
}

Status AddressSpace::check_locked(const DeviceRange& range, ErrorCode code) const {
  if (range.bytes == 0) return Status();
  if (overflows(range.va, range.bytes))
    return error(code, "device range [", hex(range.va), ", +", range.bytes, ") wraps around");
  const DevicePtr end = range.va + range.bytes;
  auto it = mappings_.upper_bound(range.va);
  if (it != mappings_.begin()) --it;
  for (DevicePtr at = range.va; at < end; ++it) {
    if (it == mappings_.end() || it->first > at || it->first + it->second.bytes <= at)
      return error(code, "device address ", hex(at), " (in [", hex(range.va), ", +", range.bytes,
                   ")) is not mapped");
    if ((it->second.access_mask >> range.gpu & 1) == 0)
      return error(code, "device address ", hex(at), " (in [", hex(range.va), ", +", range.bytes,
                   ")) is mapped but not accessible from GPU ", range.gpu);
    at = it->first + it->second.bytes;
  }
  return Status();
}

}  // namespace hiber::device::sim
