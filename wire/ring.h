// A single-producer, single-consumer ring of messages in shared memory.
//
// Layout (docs/wire-format.md has the full picture): a RingHeader page, then `capacity` bytes of
// data, a power of two. Positions are 64-bit byte counts that only grow; position p lives at
// data[p % capacity]. The data holds records, each an 8-byte RecordHeader and a payload padded to
// 8 bytes. A record never wraps: if it does not fit before the end, a padding record fills the
// rest. A message that is larger than a quarter of the ring travels as several fragments, so any
// message up to the channel's max_message_bytes gets through a ring of any size, with the
// producer waiting for space (back-pressure) and nothing lost.
//
// The consumer never trusts the producer: every position, length and flag it reads is checked,
// and any inconsistency is reported as a corrupt ring (kInvalidValue) naming what was wrong.
// A consumer copies each message out of shared memory before anybody parses it, so the producer
// cannot change bytes under the parser.
//
// Thread safety: one thread produces and one thread consumes at a time (callers serialise).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "wire/doorbell.h"
#include "wire/message.h"

namespace hiber::wire {

struct alignas(64) RingHeader {
  alignas(64) std::atomic<uint64_t> tail{0};  // written by the producer: bytes published
  alignas(64) std::atomic<uint64_t> head{0};  // written by the consumer: bytes consumed
  alignas(64) Doorbell not_empty;             // the consumer sleeps here
  alignas(64) Doorbell not_full;              // the producer sleeps here
};
static_assert(sizeof(RingHeader) <= 4096, "the ring header must fit its page");

struct RecordHeader {
  uint32_t length;  // payload bytes, not counting padding
  uint32_t flags;   // RecordFlags
};
static_assert(sizeof(RecordHeader) == 8);

enum RecordFlags : uint32_t {
  kRecordPadding = 1u << 0,  // skip to the end of the data region; length is 0
  kRecordFirst = 1u << 1,    // first fragment; the payload starts with the message length (u64)
  kRecordLast = 1u << 2,     // last fragment; a whole message in one record is kFirst|kLast
};

// Where a ring lives: its header, its data and their size. Both sides build one from the
// channel layout; the capacity always comes from the layout, never from shared memory.
struct RingView {
  RingHeader* header = nullptr;
  std::byte* data = nullptr;
  uint64_t capacity = 0;  // a power of two
  uint64_t max_message_bytes = 0;
};

// Initialises a ring in fresh memory (the creator of the channel does this once).
void init_ring(RingView ring);

// A record, header included, is at most a quarter of the ring, so a record and the padding before
// it always fit in an empty ring, and a producer waiting for space always gets it eventually.
inline uint64_t max_record_bytes(uint64_t capacity) { return capacity / 4; }

// The largest message that travels as a single record: it is written whole or not at all.
inline uint64_t max_unfragmented_message_bytes(uint64_t capacity) {
  return max_record_bytes(capacity) - sizeof(RecordHeader) - sizeof(uint64_t);
}

// The bytes a record with `payload` bytes of payload takes: its header, then the payload padded
// to 8 bytes.
inline uint64_t record_bytes(uint64_t payload) {
  return sizeof(RecordHeader) + ((payload + 7) & ~uint64_t{7});
}

// How long a producer sleeps at most before re-checking can_continue() and calling
// while_waiting(): a peer that died without ringing is noticed within this time.
inline constexpr std::chrono::milliseconds kProducerWaitSlice{50};

class RingProducer {
 public:
  explicit RingProducer(RingView ring);

  // Writes the concatenation of `pieces` as one message. If the ring lacks space, waits for the
  // consumer (spinning, then sleeping on not_full for at most kProducerWaitSlice at a time) while
  // can_continue() is true, calling while_waiting() between waits (the client uses it to drain
  // its completion ring). interrupt() is checked with the space condition and ends a wait early
  // when true, so while_waiting() can act at once (the client: completions arrived).
  // can_continue() and interrupt() are called on every spin: they must be cheap.
  // Errors: kInvalidValue if the message is empty or larger than max_message_bytes (nothing is
  // written), or if the consumer's position in shared memory is impossible (a corrupt ring);
  // kDeinitialized if can_continue() turned false (the ring may hold a partial fragmented
  // message; the peer discards it when it sees the channel closed).
  template <typename CanContinue, typename WhileWaiting, typename Interrupt>
  Status write(std::span<const std::span<const std::byte>> pieces, CanContinue&& can_continue,
               WhileWaiting&& while_waiting, Interrupt&& interrupt);

  // As above, never interrupted.
  template <typename CanContinue, typename WhileWaiting>
  Status write(std::span<const std::span<const std::byte>> pieces, CanContinue&& can_continue,
               WhileWaiting&& while_waiting) {
    return write(pieces, can_continue, while_waiting, [] { return false; });
  }

  // As above, with nothing to do between waits.
  template <typename CanContinue>
  Status write(std::span<const std::span<const std::byte>> pieces, CanContinue&& can_continue) {
    return write(
        pieces, can_continue, [] {}, [] { return false; });
  }

  // Bytes that can be written now without waiting (for tests and flush heuristics); 0 while the
  // consumer's position is impossible.
  uint64_t free_bytes() const;

 private:
  // kInvalidValue if the consumer's position cannot be right: ahead of ours, or more than the
  // capacity behind, or not on a record boundary.
  Status check_consumer() const;
  // The free space a record of `record_bytes` needs now, counting the padding before it.
  uint64_t space_needed(uint64_t record_bytes) const;
  // Writes one record of `length` bytes of the pieces' concatenation, starting `skip` bytes in,
  // after `prefix`, if it fits now; false if the consumer must make room first.
  bool try_write_record(uint32_t flags, std::span<const std::byte> prefix,
                        std::span<const std::span<const std::byte>> pieces, uint64_t skip,
                        uint64_t length);

  RingView ring_;
  AdaptiveSpin spin_;
  // Our own copy of the tail: the consumer can write the shared one, so we never read it back.
  uint64_t tail_ = 0;
};

class RingConsumer {
 public:
  explicit RingConsumer(RingView ring);

  // Takes the next complete message, copying it into `out`.
  // Returns kNotReady when no complete message is available yet (a fragmented message may be
  // half-read; the rest is picked up by the next call), kInvalidValue if the ring is corrupt.
  Status try_read(Message& out);

  // As try_read, but waits (spin, then sleep on not_empty) while no message is complete and
  // cancelled() is false, for at most `timeout`. Returns kDeinitialized when cancelled and
  // kTimeout when the time ran out.
  template <typename Cancelled>
  Status read(Message& out, Cancelled&& cancelled, std::chrono::nanoseconds timeout);

  // True if bytes are waiting to be consumed (cheap; for wait predicates). Also true when the
  // producer's position is garbage, so that a waiter goes on to find the corruption.
  bool has_data() const;

 private:
  // Records `what` as the ring's corruption (sticky: the ring is never read again) and returns it.
  Status corrupt(std::string what);
  // Moves the head past a consumed record and tells a waiting producer.
  void advance(uint64_t bytes);

  RingView ring_;
  AdaptiveSpin spin_;
  // Our own copy of the head: the producer can write the shared one, so we never read it back.
  uint64_t head_ = 0;
  Status corrupt_;
  // A fragmented message being reassembled; swapped into the caller's Message when complete.
  bool assembling_ = false;
  uint64_t expected_bytes_ = 0;
  uint64_t received_bytes_ = 0;
  Message partial_;
};

}  // namespace hiber::wire

#include "wire/ring_inl.h"
