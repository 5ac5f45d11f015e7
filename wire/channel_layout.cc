#include "wire/channel_layout.h"

#include <algorithm>
#include <bit>
#include <cstddef>

#include "wire/limits.h"

namespace hiber::wire {
namespace {

// Both processes map the header; docs/wire-format.md gives the offsets.
static_assert(offsetof(ChannelHeader, magic) == 0 && offsetof(ChannelHeader, layout_version) == 8 &&
              offsetof(ChannelHeader, staging_released) == 64 &&
              offsetof(ChannelHeader, staging_bell) == 128 &&
              offsetof(ChannelHeader, server_closed) == 192);

bool valid_ring_bytes(uint64_t bytes) {
  return std::has_single_bit(bytes) && bytes >= kMinRingBytes && bytes <= kMaxRingBytes;
}

bool valid_max_message(uint64_t bytes) {
  return bytes >= sizeof(capnp::word) && bytes <= kMaxMessageBytes;
}

bool page_aligned(uint64_t offset) { return offset % kPageBytes == 0; }

// a + b, or false on overflow.
bool add(uint64_t a, uint64_t b, uint64_t& sum) { return !__builtin_add_overflow(a, b, &sum); }

}  // namespace

Result<ChannelLayout> make_layout(const ChannelConfig& config) {
  const auto ring_bytes = [](uint64_t requested) {
    return requested == 0 || requested > kMaxRingBytes
               ? 0
               : std::max(kMinRingBytes, std::bit_ceil(requested));
  };
  ChannelLayout layout;
  layout.request_ring_bytes = ring_bytes(config.request_ring_bytes);
  layout.completion_ring_bytes = ring_bytes(config.completion_ring_bytes);
  if (layout.request_ring_bytes == 0 || layout.completion_ring_bytes == 0) {
    return error(ErrorCode::kInvalidValue, "ring sizes must be in [1, ", kMaxRingBytes,
                 "] bytes; got ", config.request_ring_bytes, " and ", config.completion_ring_bytes);
  }
  if (!valid_max_message(config.max_message_bytes)) {
    return error(ErrorCode::kInvalidValue, "max_message_bytes must be in [", sizeof(capnp::word),
                 ", ", kMaxMessageBytes, "]; got ", config.max_message_bytes);
  }
  layout.max_message_bytes = config.max_message_bytes;
  if (config.arena_bytes > kMaxArenaBytes) {
    return error(ErrorCode::kInvalidValue, "arena of ", config.arena_bytes,
                 " bytes exceeds the limit of ", kMaxArenaBytes);
  }
  layout.arena_bytes = (config.arena_bytes + kPageBytes - 1) / kPageBytes * kPageBytes;

  // The channel header page, then each ring's header page and data, then the arena.
  layout.request_ring_offset = kPageBytes;
  layout.completion_ring_offset =
      layout.request_ring_offset + kPageBytes + layout.request_ring_bytes;
  layout.arena_offset = layout.completion_ring_offset + kPageBytes + layout.completion_ring_bytes;
  layout.memfd_bytes = layout.arena_offset + layout.arena_bytes;
  return layout;
}

Status validate_layout(const ChannelLayout& layout, uint64_t actual_memfd_bytes) {
  const auto invalid = [](const auto&... reason) {
    return error(ErrorCode::kInvalidValue, "bad channel layout: ", reason...);
  };
  if (layout.memfd_bytes != actual_memfd_bytes) {
    return invalid("it describes ", layout.memfd_bytes, " bytes but the memfd has ",
                   actual_memfd_bytes);
  }
  if (!valid_ring_bytes(layout.request_ring_bytes) ||
      !valid_ring_bytes(layout.completion_ring_bytes)) {
    return invalid("ring sizes ", layout.request_ring_bytes, " and ", layout.completion_ring_bytes,
                   " are not powers of two in [", kMinRingBytes, ", ", kMaxRingBytes, "]");
  }
  if (!valid_max_message(layout.max_message_bytes)) {
    return invalid("max_message_bytes ", layout.max_message_bytes, " is not in [",
                   sizeof(capnp::word), ", ", kMaxMessageBytes, "]");
  }
  if (!page_aligned(layout.request_ring_offset) || !page_aligned(layout.completion_ring_offset) ||
      !page_aligned(layout.arena_offset) || !page_aligned(layout.arena_bytes)) {
    return invalid("regions must start and end on ", kPageBytes, "-byte pages");
  }
  if (layout.arena_bytes > kMaxArenaBytes) {
    return invalid("arena of ", layout.arena_bytes, " bytes exceeds ", kMaxArenaBytes);
  }
  // Regions in order, without overlap: header page, request ring, completion ring, arena.
  uint64_t request_end, completion_end, arena_end;
  if (layout.request_ring_offset < kPageBytes ||
      !add(layout.request_ring_offset, kPageBytes + layout.request_ring_bytes, request_end) ||
      layout.completion_ring_offset < request_end ||
      !add(layout.completion_ring_offset, kPageBytes + layout.completion_ring_bytes,
           completion_end) ||
      layout.arena_offset < completion_end ||
      !add(layout.arena_offset, layout.arena_bytes, arena_end) || arena_end > layout.memfd_bytes) {
    return invalid("regions overlap, are out of order or exceed the ", layout.memfd_bytes,
                   "-byte memfd");
  }
  return Status();
}

ChannelViews views_of(std::byte* base, const ChannelLayout& layout) {
  const auto ring_at = [&](uint64_t offset, uint64_t bytes) {
    return RingView{
        .header = reinterpret_cast<RingHeader*>(base + offset),
        .data = base + offset + kPageBytes,
        .capacity = bytes,
        .max_message_bytes = layout.max_message_bytes,
    };
  };
  return ChannelViews{
      .header = reinterpret_cast<ChannelHeader*>(base),
      .requests = ring_at(layout.request_ring_offset, layout.request_ring_bytes),
      .completions = ring_at(layout.completion_ring_offset, layout.completion_ring_bytes),
      .arena = base + layout.arena_offset,
      .arena_bytes = layout.arena_bytes,
  };
}

}  // namespace hiber::wire
