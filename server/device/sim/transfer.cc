#include "server/device/sim/transfer.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace hiber::device::sim {
namespace {

// Unthrottled chunks: long enough to amortise the checks, short enough not to hold up map/unmap.
constexpr uint64_t kUnthrottledChunkBytes = 4 << 20;

}  // namespace

template <typename Ranges, typename Touch>
Status Mover::chunked(uint64_t total, const LinkModel::Path& path, Ranges&& ranges,
                      Touch&& touch) const {
  const bool throttled = links_ != nullptr && path.throttled();
  // A multiple of 4 so that fills of 2- and 4-byte elements never split one.
  const uint64_t chunk =
      (throttled ? LinkModel::chunk_bytes(path) : kUnthrottledChunkBytes) / 64 * 64;
  struct TransferGuard {
    LinkModel* links;
    uint64_t id;
    ~TransferGuard() {
      if (links != nullptr) links->end(id);
    }
  } transfer{throttled ? links_ : nullptr, throttled ? links_->begin(path, total) : 0};
  for (uint64_t offset = 0; offset < total;) {
    const uint64_t n = std::min(chunk, total - offset);
    // Each chunk lands once the link model has moved it.
    if (throttled) links_->wait_until_moved(transfer.id, offset + n);
    const auto checked = ranges(offset, n);
    HIBER_RETURN_IF_ERROR(
        space_.access(checked, ErrorCode::kIllegalAddress,
                      [&](std::span<std::byte* const> direct) { touch(offset, n, direct); }));
    offset += n;
  }
  return Status();
}

Status Mover::copy(const CopySpec& spec) const {
  auto* dst = static_cast<std::byte*>(spec.dst);
  const auto* src = static_cast<const std::byte*>(spec.src);
  auto ranges = [&](uint64_t offset, uint64_t n) {
    std::array<DeviceRange, 2> r{};  // a range of 0 bytes checks nothing
    if (spec.dst_gpu >= 0) r[0] = {reinterpret_cast<DevicePtr>(dst + offset), n, spec.dst_gpu};
    if (spec.src_gpu >= 0) r[1] = {reinterpret_cast<DevicePtr>(src + offset), n, spec.src_gpu};
    return r;
  };
  // memmove: aliased mappings can make distinct device addresses overlap in memory.
  return chunked(spec.bytes, spec.path, ranges,
                 [&](uint64_t offset, uint64_t n, std::span<std::byte* const> direct) {
                   std::memmove(direct[0] != nullptr ? direct[0] : dst + offset,
                                direct[1] != nullptr ? direct[1] : src + offset, n);
                 });
}

Status Mover::fill(const FillSpec& spec) const {
  auto* dst = reinterpret_cast<std::byte*>(spec.dst);
  const uint64_t total = spec.count * static_cast<uint64_t>(spec.element_bytes);
  auto ranges = [&](uint64_t offset, uint64_t n) {
    return std::array<DeviceRange, 1>{DeviceRange{spec.dst + offset, n, spec.gpu}};
  };
  return chunked(total, spec.path, ranges,
                 [&](uint64_t offset, uint64_t n, std::span<std::byte* const> direct) {
                   std::byte* at = direct[0] != nullptr ? direct[0] : dst + offset;
                   switch (spec.element_bytes) {
                     case 1: std::memset(at, static_cast<int>(spec.value & 0xff), n); break;
                     case 2:
                       std::fill_n(reinterpret_cast<uint16_t*>(at), n / 2,
                                   static_cast<uint16_t>(spec.value));
                       break;
                     default:
                       std::fill_n(reinterpret_cast<uint32_t*>(at), n / 4, spec.value);
                       break;
                   }
                 });
}

}  // namespace hiber::device::sim
