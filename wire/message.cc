#include "wire/message.h"

#include <bit>
#include <cstring>

#include <glog/logging.h>

#include "wire/limits.h"

namespace hiber::wire {
namespace {

// Segment tables are little-endian u32s; we read and write them in host order.
static_assert(std::endian::native == std::endian::little);

}  // namespace

std::span<std::byte> Message::resize(size_t bytes) {
  words_.resize((bytes + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  size_ = bytes;
  return {reinterpret_cast<std::byte*>(words_.data()), size_};
}

Status check_framing(const Message& message, std::string_view what) {
  const auto invalid = [&](const auto&... reason) {
    return error(ErrorCode::kInvalidValue, what, ": ", reason...);
  };
  if (message.size() == 0) return invalid("empty message");
  if (message.size() % sizeof(capnp::word) != 0) {
    return invalid("message of ", message.size(), " bytes is not a whole number of words");
  }
  // The table is little-endian u32s: segment count - 1, then each segment's size in words,
  // padded to a whole word.
  const auto bytes = message.bytes();
  const auto u32_at = [&](size_t index) {
    uint32_t value;
    std::memcpy(&value, bytes.data() + index * sizeof(value), sizeof(value));
    return value;
  };
  const uint64_t words = message.size() / sizeof(capnp::word);
  const uint64_t segments = uint64_t{u32_at(0)} + 1;
  if (segments > kMaxSegments) {
    return invalid("message has ", segments, " segments; at most ", kMaxSegments, " are allowed");
  }
  const uint64_t table_words = segments / 2 + 1;
  if (table_words > words) {
    return invalid("message of ", words, " words ends inside its table of ", segments, " segments");
  }
  uint64_t total = table_words;
  for (uint64_t i = 0; i < segments; ++i) total += u32_at(1 + i);
  if (total != words) {
    return invalid("segment table describes ", total, " words but the message has ", words);
  }
  return Status();
}

capnp::ReaderOptions untrusted_reader_options(size_t words) {
  capnp::ReaderOptions options;
  // A small constant lets a tiny message still read its root and a few empty pointers.
  options.traversalLimitInWords = words * kTraversalLimitFactor + 64;
  options.nestingLimit = kNestingLimit;
  return options;
}

Status malformed(std::string_view what, const kj::Exception& exception) {
  return error(ErrorCode::kInvalidValue, what, ": ", exception.getDescription().cStr());
}

std::vector<std::span<const std::byte>> frame_pieces(capnp::MessageBuilder& builder,
                                                     WordBuffer& table) {
  const auto segments = builder.getSegmentsForOutput();
  CHECK(segments.size() > 0) << "framing a message that has no root";
  // Segment count - 1, each segment's size in words, then zero padding to a whole word.
  table.assign(segments.size() / 2 + 1);
  auto* out = reinterpret_cast<std::byte*>(table.data());
  const auto put_u32 = [&](size_t index, size_t value) {
    const auto v = static_cast<uint32_t>(value);
    std::memcpy(out + index * sizeof(v), &v, sizeof(v));
  };
  put_u32(0, segments.size() - 1);
  for (size_t i = 0; i < segments.size(); ++i) put_u32(1 + i, segments[i].size());

  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(segments.size() + 1);
  pieces.push_back(std::as_bytes(table.span()));
  for (const auto& segment : segments) {
    pieces.push_back(std::as_bytes(std::span(segment.begin(), segment.size())));
  }
  return pieces;
}

std::vector<std::byte> frame_bytes(capnp::MessageBuilder& builder) {
  WordBuffer table;
  const auto pieces = frame_pieces(builder, table);
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  std::vector<std::byte> bytes;
  bytes.reserve(total);
  for (const auto& piece : pieces) bytes.insert(bytes.end(), piece.begin(), piece.end());
  return bytes;
}

}  // namespace hiber::wire
