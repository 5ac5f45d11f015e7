// How one client's channel memfd is laid out (docs/wire-format.md):
//
//   offset 0                  ChannelHeader (one page)
//   request_ring_offset       RingHeader page, then request_ring_bytes of data
//   completion_ring_offset    RingHeader page, then completion_ring_bytes of data
//   arena_offset              arena_bytes of bulk data
//
// The server creates the memfd and decides the layout; the client learns it from the Welcome
// and checks it against the memfd's real size before mapping anything.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/status.h"
#include "wire/doorbell.h"
#include "wire/ring.h"

namespace hiber::wire {

inline constexpr uint64_t kChannelMagic = 0x4c4e4843'52424948;  // "HIBRCHNL"
inline constexpr uint32_t kChannelLayoutVersion = 1;

struct alignas(64) ChannelHeader {
  uint64_t magic;           // kChannelMagic
  uint32_t layout_version;  // kChannelLayoutVersion
  uint32_t reserved;
  // Written by the server: the client's staging bytes up to here are no longer needed.
  alignas(64) std::atomic<uint64_t> staging_released{0};
  alignas(64) Doorbell staging_bell;  // the client sleeps here waiting for staging_released
  // Set by the server when it ends the session; both rings' doorbells are rung after it.
  alignas(64) std::atomic<uint32_t> server_closed{0};
};
static_assert(sizeof(ChannelHeader) <= 4096);

// What a channel should look like; sizes are rounded up to what the layout needs.
struct ChannelConfig {
  uint64_t request_ring_bytes = 1 << 20;       // power of two
  uint64_t completion_ring_bytes = 256 << 10;  // power of two
  uint64_t arena_bytes = 64 << 20;             // multiple of a page
  uint64_t max_message_bytes = 16 << 20;
};

struct ChannelLayout {
  uint64_t memfd_bytes = 0;
  uint64_t request_ring_offset = 0;
  uint64_t request_ring_bytes = 0;
  uint64_t completion_ring_offset = 0;
  uint64_t completion_ring_bytes = 0;
  uint64_t arena_offset = 0;
  uint64_t arena_bytes = 0;
  uint64_t max_message_bytes = 0;
};

// Computes the layout for a config; kInvalidValue if a size is out of range.
Result<ChannelLayout> make_layout(const ChannelConfig& config);

// Checks a layout received from a peer: regions in order, page-aligned, inside memfd_bytes,
// rings powers of two, and memfd_bytes equal to the real size of the memfd.
Status validate_layout(const ChannelLayout& layout, uint64_t actual_memfd_bytes);

// The views of a mapped channel.
struct ChannelViews {
  ChannelHeader* header = nullptr;
  RingView requests;
  RingView completions;
  std::byte* arena = nullptr;
  uint64_t arena_bytes = 0;
};
ChannelViews views_of(std::byte* base, const ChannelLayout& layout);

// True if [offset, offset + bytes) lies inside an arena of arena_bytes (overflow-safe).
inline bool arena_range_ok(uint64_t offset, uint64_t bytes, uint64_t arena_bytes) {
  return offset <= arena_bytes && bytes <= arena_bytes - offset;
}

}  // namespace hiber::wire
