// One message taken off a ring or a socket: a private, 8-byte aligned copy, reused between
// messages so the steady state allocates nothing.
#pragma once

#include <capnp/common.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "wire/word_buffer.h"

namespace hiber::wire {

class Message {
 public:
  // Sets the size to `bytes`, keeping the first min(old, new) bytes (the rest are unspecified),
  // and returns the writable bytes. Capacity is kept, so reuse allocates nothing.
  std::span<std::byte> resize(size_t bytes);

  std::span<const std::byte> bytes() const {
    return {reinterpret_cast<const std::byte*>(words_.data()), size_};
  }
  kj::ArrayPtr<const capnp::word> words() const {
    return {words_.data(), (size_ + sizeof(capnp::word) - 1) / sizeof(capnp::word)};
  }
  size_t size() const { return size_; }

 private:
  WordBuffer words_;
  size_t size_ = 0;
};

// Reads a Cap'n Proto message (standard stream framing: segment table, then segments) from
// `message` with limits fit for untrusted input, and calls fn(root) with its root as T::Reader;
// fn returns a Status. Malformed, truncated or oversized input, or any Cap'n Proto error thrown
// while fn reads the message, becomes kInvalidValue "<what>: <reason>". fn's own Status is
// returned otherwise. The framing must cover the message exactly: trailing bytes are an error.
// Limits: at most kMaxSegments segments, traversal of kTraversalLimitFactor times the message's
// words (plus a little), nesting kNestingLimit deep.
template <typename T, typename Fn>
Status read_message(const Message& message, std::string_view what, Fn&& fn);

// The non-template half of read_message: checks the segment table against the message size
// (kInvalidValue "<what>: ..."), and gives the reader options for a message of `words` words.
Status check_framing(const Message& message, std::string_view what);
capnp::ReaderOptions untrusted_reader_options(size_t words);
// "<what>: <description>" as kInvalidValue, for an exception thrown while reading.
Status malformed(std::string_view what, const kj::Exception& exception);

// Serialises a built message with standard stream framing into pieces that a ring or socket
// write can gather: the segment table, then each segment. The pieces point into `table` and
// into the builder; both must outlive their use.
std::vector<std::span<const std::byte>> frame_pieces(capnp::MessageBuilder& builder,
                                                     WordBuffer& table);

// The same, concatenated into one buffer.
std::vector<std::byte> frame_bytes(capnp::MessageBuilder& builder);

}  // namespace hiber::wire

#include "wire/message_inl.h"
