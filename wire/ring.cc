#include "wire/ring.h"

#include <bit>
#include <cstddef>
#include <cstring>
#include <new>

#include <glog/logging.h>

namespace hiber::wire {
namespace {

// The message length in a first record is a host-order u64: both ends run on the same machine.
static_assert(std::endian::native == std::endian::little, "docs/wire-format.md says little-endian");

// Both processes map these structures; docs/wire-format.md gives the offsets.
static_assert(offsetof(RingHeader, tail) == 0 && offsetof(RingHeader, head) == 64 &&
              offsetof(RingHeader, not_empty) == 128 && offsetof(RingHeader, not_full) == 192);
static_assert(offsetof(Doorbell, epoch) == 0 && offsetof(Doorbell, sleepers) == 4);

}  // namespace

void init_ring(RingView ring) {
  CHECK(std::has_single_bit(ring.capacity)) << "ring capacity " << ring.capacity;
  new (ring.header) RingHeader();
}

// --- Producer -------------------------------------------------------------------------------

RingProducer::RingProducer(RingView ring)
    : ring_(ring), tail_(ring.header->tail.load(std::memory_order_relaxed)) {}

Status RingProducer::check_consumer() const {
  const uint64_t head = ring_.header->head.load(std::memory_order_acquire);
  if (tail_ - head <= ring_.capacity && head % 8 == 0) return Status();
  return error(ErrorCode::kInvalidValue, "corrupt ring: the consumer's position ", head,
               " is not a record boundary within ", ring_.capacity,
               " bytes behind the producer's position ", tail_);
}

uint64_t RingProducer::free_bytes() const {
  const uint64_t head = ring_.header->head.load(std::memory_order_acquire);
  const uint64_t used = tail_ - head;
  return used <= ring_.capacity && head % 8 == 0 ? ring_.capacity - used : 0;
}

uint64_t RingProducer::space_needed(uint64_t record_bytes) const {
  const uint64_t to_end = ring_.capacity - (tail_ & (ring_.capacity - 1));
  return record_bytes > to_end ? to_end + record_bytes : record_bytes;
}

bool RingProducer::try_write_record(uint32_t flags, std::span<const std::byte> prefix,
                                    std::span<const std::span<const std::byte>> pieces,
                                    uint64_t skip, uint64_t length) {
  const uint64_t payload = prefix.size() + length;
  const uint64_t record = record_bytes(payload);
  if (free_bytes() < space_needed(record)) return false;

  const uint64_t mask = ring_.capacity - 1;
  uint64_t position = tail_;
  const uint64_t to_end = ring_.capacity - (position & mask);
  if (record > to_end) {
    // Records never wrap: pad to the end of the data and start again at offset 0.
    const RecordHeader padding{0, kRecordPadding};
    std::memcpy(ring_.data + (position & mask), &padding, sizeof(padding));
    position += to_end;
  }
  std::byte* out = ring_.data + (position & mask);
  const RecordHeader header{static_cast<uint32_t>(payload), flags};
  std::memcpy(out, &header, sizeof(header));
  out += sizeof(header);
  if (!prefix.empty()) {
    std::memcpy(out, prefix.data(), prefix.size());
    out += prefix.size();
  }
  // Gather `length` bytes of the concatenated pieces, starting `skip` bytes in.
  for (const auto& piece : pieces) {
    if (length == 0) break;
    if (skip >= piece.size()) {
      skip -= piece.size();
      continue;
    }
    const uint64_t n = std::min<uint64_t>(piece.size() - skip, length);
    std::memcpy(out, piece.data() + skip, n);
    out += n;
    length -= n;
    skip = 0;
  }
  DCHECK_EQ(length, 0u) << "pieces shorter than the message";

  tail_ = position + record;
  ring_.header->tail.store(tail_, std::memory_order_release);
  ring(ring_.header->not_empty);
  return true;
}

// --- Consumer -------------------------------------------------------------------------------

RingConsumer::RingConsumer(RingView ring)
    : ring_(ring), head_(ring.header->head.load(std::memory_order_relaxed)) {}

bool RingConsumer::has_data() const {
  return ring_.header->tail.load(std::memory_order_acquire) != head_;
}

Status RingConsumer::corrupt(std::string what) {
  corrupt_ = Status(ErrorCode::kInvalidValue, "corrupt ring: " + std::move(what));
  return corrupt_;
}

void RingConsumer::advance(uint64_t bytes) {
  head_ += bytes;
  ring_.header->head.store(head_, std::memory_order_release);
  ring(ring_.header->not_full);
}

Status RingConsumer::try_read(Message& out) {
  if (!corrupt_.ok()) return corrupt_;
  const uint64_t capacity = ring_.capacity;
  const uint64_t mask = capacity - 1;
  const uint64_t max_record = max_record_bytes(capacity);
  const uint64_t tail = ring_.header->tail.load(std::memory_order_acquire);
  if (tail - head_ > capacity || tail % 8 != 0) {
    return corrupt(str_cat("the producer's position ", tail, " is not a record boundary within ",
                           capacity, " bytes ahead of the consumer's position ", head_));
  }

  while (head_ != tail) {
    const uint64_t offset = head_ & mask;
    const uint64_t to_end = capacity - offset;
    const uint64_t published = tail - head_;
    // Every field is read once, into local copies, and judged there.
    RecordHeader header;
    std::memcpy(&header, ring_.data + offset, sizeof(header));

    if (header.flags & kRecordPadding) {
      if (header.flags != kRecordPadding || header.length != 0) {
        return corrupt(str_cat("padding record at position ", head_, " has flags ", header.flags,
                               " and length ", header.length,
                               "; expected only the padding flag "
                               "and length 0"));
      }
      if (to_end >= max_record) {
        return corrupt(str_cat("padding record at position ", head_, " covers ", to_end,
                               " bytes, but padding is only needed before a record of at most ",
                               max_record, " bytes"));
      }
      if (to_end > published) {
        return corrupt(str_cat("padding record at position ", head_, " covers ", to_end,
                               " bytes but only ", published, " bytes are published"));
      }
      advance(to_end);
      continue;
    }

    if ((header.flags & ~uint32_t{kRecordFirst | kRecordLast}) != 0) {
      return corrupt(str_cat("record at position ", head_, " has unknown flags ", header.flags));
    }
    const uint64_t record = record_bytes(header.length);
    if (record > max_record) {
      return corrupt(str_cat("record at position ", head_, " has ", header.length,
                             " payload bytes; records are at most ", max_record,
                             " bytes with their header"));
    }
    if (record > to_end) {
      return corrupt(str_cat("record at position ", head_, " (", record,
                             " bytes) crosses the end of the ring"));
    }
    if (record > published) {
      return corrupt(str_cat("record at position ", head_, " (", record,
                             " bytes) extends past the ", published, " published bytes"));
    }

    const bool first = header.flags & kRecordFirst;
    const bool last = header.flags & kRecordLast;
    const std::byte* payload = ring_.data + offset + sizeof(RecordHeader);
    uint64_t chunk = header.length;
    if (first) {
      if (assembling_) {
        return corrupt(str_cat("a message starts at position ", head_, " after ", received_bytes_,
                               " of the previous message's ", expected_bytes_, " bytes"));
      }
      uint64_t total = 0;
      if (chunk <= sizeof(total)) {
        return corrupt(str_cat("first record at position ", head_, " has ", chunk,
                               " payload bytes, too few for the message length and data"));
      }
      std::memcpy(&total, payload, sizeof(total));
      payload += sizeof(total);
      chunk -= sizeof(total);
      if (total > ring_.max_message_bytes) {
        return corrupt(str_cat("message at position ", head_, " claims ", total,
                               " bytes; the limit is ", ring_.max_message_bytes));
      }
      if (last ? total != chunk : chunk >= total) {
        return corrupt(str_cat("message at position ", head_, " claims ", total, " bytes but its ",
                               last ? "only record" : "first fragment", " carries ", chunk));
      }
      if (last) {
        std::memcpy(out.resize(total).data(), payload, total);
        advance(record);
        return Status();
      }
      std::memcpy(partial_.resize(total).data(), payload, chunk);
      assembling_ = true;
      expected_bytes_ = total;
      received_bytes_ = chunk;
      advance(record);
      continue;
    }

    if (!assembling_) {
      return corrupt(str_cat("fragment at position ", head_, " continues no message"));
    }
    if (chunk == 0) return corrupt(str_cat("empty fragment at position ", head_));
    const uint64_t received = received_bytes_ + chunk;
    if (received > expected_bytes_) {
      return corrupt(str_cat("fragment at position ", head_, " brings the message to ", received,
                             " bytes, more than its ", expected_bytes_));
    }
    if (last && received < expected_bytes_) {
      return corrupt(str_cat("message ends at position ", head_, " after ", received, " of its ",
                             expected_bytes_, " bytes"));
    }
    if (!last && received == expected_bytes_) {
      return corrupt(str_cat("fragment at position ", head_, " completes the message's ",
                             expected_bytes_, " bytes but is not marked last"));
    }
    std::memcpy(partial_.resize(expected_bytes_).data() + received_bytes_, payload, chunk);
    received_bytes_ = received;
    advance(record);
    if (last) {
      assembling_ = false;
      std::swap(out, partial_);
      return Status();
    }
  }
  return Status(ErrorCode::kNotReady, "ring empty");
}

}  // namespace hiber::wire
