#include "wire/batch_builder.h"

#include <capnp/any.h>
#include <capnp/message.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include <glog/logging.h>

#include "wire/limits.h"
#include "wire/word_buffer.h"

namespace hiber::wire {
namespace {

// The first segment: the root pointer (word 0), the Batch struct (its data, then its one
// pointer: the calls), the call list's tag word, then the calls.
constexpr uint64_t kCallWords =
    proto::Call::_capnpPrivate::dataWordSize + proto::Call::_capnpPrivate::pointerCount;
constexpr uint64_t kCallsPointerWord = 1 + proto::Batch::_capnpPrivate::dataWordSize;
constexpr uint64_t kTagWord = kCallsPointerWord + proto::Batch::_capnpPrivate::pointerCount;
constexpr uint64_t kHeadWords = kTagWord + 1;
static_assert(proto::Batch::_capnpPrivate::pointerCount == 1, "calls is Batch's only pointer");

// Later segments hold kernel parameters and names: 64 KiB fits a few maximal parameter buffers.
constexpr uint64_t kLaterSegmentWords = 8192;

// Words are little-endian on the wire, and so in memory here.
static_assert(std::endian::native == std::endian::little);

void zero_words(capnp::word* words, size_t count) {
  std::memset(static_cast<void*>(words), 0, count * sizeof(capnp::word));
}

// Sets the length of the composite (struct) list whose pointer and tag are given, per the Cap'n
// Proto encoding spec: the pointer holds the list's size in words in bits 35..63, the tag (a
// struct pointer) holds the element count in bits 2..31. Everything else in them stays.
void set_list_length(capnp::word& pointer_word, capnp::word& tag_word, uint64_t elements,
                     uint64_t words_per_element) {
  uint64_t pointer, tag;
  std::memcpy(&pointer, &pointer_word, sizeof(pointer));
  std::memcpy(&tag, &tag_word, sizeof(tag));
  pointer = (pointer & ((uint64_t{1} << 35) - 1)) | (elements * words_per_element << 35);
  tag = (tag & ~(uint64_t{0x3fffffff} << 2)) | (elements << 2);
  std::memcpy(static_cast<void*>(&pointer_word), &pointer, sizeof(pointer));
  std::memcpy(static_cast<void*>(&tag_word), &tag, sizeof(tag));
}

}  // namespace

// Owns the segment memory and the capnp MessageBuilder that allocates from it. The builder
// itself cannot be reset, so each batch destroys it and constructs a new one in place; the
// memory stays, zeroed again where the last batch wrote.
//
// finish() does not use Cap'n Proto's Orphan::truncate: that zeroes every dropped element one by
// one (tens of microseconds for a mostly empty batch of 4096), although they were never written.
// It rewrites the list's length in its pointer and tag instead, and sends the first segment only
// up to the last call; the unsent rest is still zero.
class BatchBuilder::Arena {
 public:
  explicit Arena(uint32_t max_calls)
      : max_calls_(max_calls), first_(kHeadWords + max_calls * kCallWords) {}

  ~Arena() { discard(); }

  void start(uint64_t first_seq) {
    discard();
    message_.emplace(*this);
    auto root = message_->initRoot<proto::Batch>();
    root.setFirstSeq(first_seq);
    // Allocated right after the root, filling the first segment exactly (see allocate()).
    list_ = root.initCalls(max_calls_);
    DCHECK_EQ(static_cast<const void*>(capnp::toAny(list_[0]).getDataSection().begin()),
              static_cast<const void*>(first_.data() + kHeadWords))
        << "the call list is not where finish() expects it";
    calls_written_ = 0;
    finished_ = false;
  }

  proto::Call::Builder call(uint32_t index) {
    CHECK(!finished_) << "BatchBuilder::add_call() after finish() and before reset()";
    calls_written_ = index + 1;
    return list_[index];
  }

  uint64_t encoded_words(uint32_t count) {
    const auto segments = message_->getSegmentsForOutput();
    uint64_t words = segments.size() / 2 + 1 + first_segment_words(count);
    for (size_t i = 1; i < segments.size(); ++i) words += segments[i].size();
    return words;
  }

  std::span<const std::span<const std::byte>> finish(uint32_t count) {
    CHECK(!finished_) << "BatchBuilder::finish() called twice without reset()";
    finished_ = true;
    set_list_length(first_[kCallsPointerWord], first_[kTagWord], count, kCallWords);

    const auto segments = message_->getSegmentsForOutput();
    table_.assign(segments.size() / 2 + 1);
    auto* table = reinterpret_cast<std::byte*>(table_.data());
    const auto put_u32 = [&](size_t index, size_t value) {
      const auto v = static_cast<uint32_t>(value);
      std::memcpy(table + index * sizeof(v), &v, sizeof(v));
    };
    put_u32(0, segments.size() - 1);
    pieces_.clear();
    pieces_.push_back(std::as_bytes(table_.span()));
    const std::span<const capnp::word> first(first_.data(), first_segment_words(count));
    put_u32(1, first.size());
    pieces_.push_back(std::as_bytes(first));
    for (size_t i = 1; i < segments.size(); ++i) {
      put_u32(1 + i, segments[i].size());
      pieces_.push_back(std::as_bytes(std::span(segments[i].begin(), segments[i].size())));
    }
    return pieces_;
  }

  // capnp asks for segment memory here: first for the root pointer (which gets the exactly
  // sized first segment), then whenever the current segment is full.
  kj::ArrayPtr<capnp::word> allocate(uint minimum_words) {
    if (!first_given_) {
      CHECK_LE(minimum_words, first_.size());
      first_given_ = true;
      return kj::arrayPtr(first_.data(), first_.size());
    }
    if (later_given_ == later_.size()) later_.emplace_back();
    WordBuffer& segment = later_[later_given_++];
    if (segment.size() < minimum_words) {
      segment.assign(std::max<uint64_t>(minimum_words, kLaterSegmentWords));
    }
    return kj::arrayPtr(segment.data(), segment.size());
  }

 private:
  class Segments final : public capnp::MessageBuilder {
   public:
    explicit Segments(Arena& arena) : arena_(arena) {}
    kj::ArrayPtr<capnp::word> allocateSegment(uint minimum_words) override {
      return arena_.allocate(minimum_words);
    }

   private:
    Arena& arena_;
  };

  static uint64_t first_segment_words(uint32_t calls) { return kHeadWords + calls * kCallWords; }

  // Drops the current message and zeroes exactly what it wrote: capnp needs zeroed segments.
  void discard() {
    if (!message_) return;
    const auto segments = message_->getSegmentsForOutput();
    zero_words(first_.data(), first_segment_words(calls_written_));
    // Segment i > 0 is later_[i - 1]: capnp numbers segments in the order it asked for them.
    for (size_t i = 1; i < segments.size(); ++i)
      zero_words(later_[i - 1].data(), segments[i].size());
    list_ = nullptr;
    message_.reset();
    first_given_ = false;
    later_given_ = 0;
  }

  const uint32_t max_calls_;
  WordBuffer first_;
  bool first_given_ = false;
  std::vector<WordBuffer> later_;
  size_t later_given_ = 0;
  std::optional<Segments> message_;
  capnp::List<proto::Call>::Builder list_ = nullptr;
  uint32_t calls_written_ = 0;  // calls handed out: the part of the list that needs zeroing
  bool finished_ = false;
  WordBuffer table_;
  std::vector<std::span<const std::byte>> pieces_;
};

BatchBuilder::BatchBuilder(uint32_t max_calls) : max_calls_(max_calls) {
  CHECK(max_calls >= 1 && max_calls <= kMaxCallsPerBatch)
      << "BatchBuilder: max_calls " << max_calls << " is not in [1, " << kMaxCallsPerBatch << "]";
  arena_ = std::make_unique<Arena>(max_calls);
  reset(0);
}

BatchBuilder::~BatchBuilder() = default;

void BatchBuilder::reset(uint64_t first_seq) {
  arena_->start(first_seq);
  first_seq_ = first_seq;
  count_ = 0;
}

proto::Call::Builder BatchBuilder::add_call() {
  CHECK(!full()) << "BatchBuilder::add_call() on a full batch of " << max_calls_;
  return arena_->call(count_++);
}

uint64_t BatchBuilder::encoded_bytes() const {
  return arena_->encoded_words(count_) * sizeof(capnp::word);
}

std::span<const std::span<const std::byte>> BatchBuilder::finish() {
  CHECK(!empty()) << "BatchBuilder::finish() on an empty batch";
  return arena_->finish(count_);
}

}  // namespace hiber::wire
