// A growable, zero-filled buffer of Cap'n Proto words (message copies, segment memory, segment
// tables). Not std::vector<capnp::word>: capnp::word is not copyable under clang
// (capnp/common.h), so such a vector compiles with GCC only. This one stores uint64_t, which has
// a word's size and alignment, and hands out capnp::word pointers.
#pragma once

#include <capnp/common.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace hiber::wire {

class WordBuffer {
 public:
  WordBuffer() = default;
  explicit WordBuffer(size_t words) : words_(words) {}

  // New words are zero; the first min(old, new) words are kept.
  void resize(size_t words) { words_.resize(words); }
  // `words` zero words.
  void assign(size_t words) { words_.assign(words, 0); }

  size_t size() const { return words_.size(); }
  capnp::word* data() { return reinterpret_cast<capnp::word*>(words_.data()); }
  const capnp::word* data() const { return reinterpret_cast<const capnp::word*>(words_.data()); }
  capnp::word& operator[](size_t index) { return data()[index]; }
  std::span<const capnp::word> span() const { return {data(), size()}; }

 private:
  static_assert(sizeof(uint64_t) == sizeof(capnp::word) &&
                alignof(uint64_t) >= alignof(capnp::word));
  std::vector<uint64_t> words_;
};

}  // namespace hiber::wire
