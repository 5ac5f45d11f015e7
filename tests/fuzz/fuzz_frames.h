// Frames for the harnesses of socket protocols (the handshake, control requests).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tests/fuzz/fuzz_support.h"
#include "wire/message.h"
#include "wire/socket_frame.h"

namespace hiber::fuzz {

// The socket bytes as hiberd reads them: through a FrameReader, fed once whole and once in
// three pieces (io_uring delivers arbitrary splits; both must give the same frame). Returns the
// frame, or nullptr where the bytes do not make one.
inline const wire::Message* read_frame(std::span<const std::byte> stream, wire::FrameReader& whole,
                                       wire::FrameReader& pieces) {
  const size_t used = whole.feed(stream);
  size_t fed = 0;
  for (size_t cut : {stream.size() / 3, 2 * stream.size() / 3, stream.size()}) {
    while (fed < cut && !pieces.complete() && pieces.error().ok()) {
      fed += pieces.feed(stream.subspan(fed, cut - fed));
    }
  }
  CHECK_EQ(whole.complete(), pieces.complete());
  CHECK_EQ(whole.error().ok(), pieces.error().ok());
  if (!whole.complete()) return nullptr;
  CHECK_EQ(used, fed);
  const auto a = whole.message().bytes();
  const auto b = pieces.message().bytes();
  CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "split feeds gave another frame";
  return &whole.message();
}

// A frame's payload as a Message (what FrameReader hands the decoders).
inline wire::Message payload_of(std::span<const std::byte> frame) {
  wire::Message message;
  const auto body = frame.subspan(sizeof(uint32_t));
  auto out = message.resize(body.size());
  std::copy(body.begin(), body.end(), out.begin());
  return message;
}

}  // namespace hiber::fuzz
