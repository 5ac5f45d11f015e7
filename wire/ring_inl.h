// Template part of wire/ring.h: the waiting loops around the non-blocking record code.
#pragma once

#include <algorithm>

namespace hiber::wire {

template <typename CanContinue, typename WhileWaiting, typename Interrupt>
Status RingProducer::write(std::span<const std::span<const std::byte>> pieces,
                           CanContinue&& can_continue, WhileWaiting&& while_waiting,
                           Interrupt&& interrupt) {
  uint64_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  if (total == 0) return Status(ErrorCode::kInvalidValue, "cannot write an empty message");
  if (total > ring_.max_message_bytes) {
    return error(ErrorCode::kInvalidValue, "message of ", total,
                 " bytes exceeds the channel's limit of ", ring_.max_message_bytes, " bytes");
  }

  // The first record carries the message length in front of its data.
  const uint64_t max_payload = max_record_bytes(ring_.capacity) - sizeof(RecordHeader);
  const uint64_t length_prefix = total;
  const auto prefix_bytes = std::as_bytes(std::span(&length_prefix, 1));
  uint64_t written = 0;
  while (written < total) {
    const bool first = written == 0;
    std::span<const std::byte> prefix = first ? prefix_bytes : std::span<const std::byte>();
    const uint64_t chunk = std::min(total - written, max_payload - prefix.size());
    const uint32_t flags =
        (first ? kRecordFirst : 0u) | (written + chunk == total ? kRecordLast : 0u);
    const uint64_t record = record_bytes(prefix.size() + chunk);
    while (!try_write_record(flags, prefix, pieces, written, chunk)) {
      HIBER_RETURN_IF_ERROR(check_consumer());
      if (!can_continue()) {
        return Status(ErrorCode::kDeinitialized, "the peer is gone; the message was not sent");
      }
      while_waiting();
      const uint64_t needed = space_needed(record);
      wait(
          ring_.header->not_full, spin_,
          [&] { return free_bytes() >= needed || !check_consumer().ok() || interrupt(); },
          [&] { return !can_continue(); }, kProducerWaitSlice);
    }
    written += chunk;
  }
  return Status();
}

template <typename Cancelled>
Status RingConsumer::read(Message& out, Cancelled&& cancelled, std::chrono::nanoseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = doorbell_internal::deadline_after(start, timeout);
  for (;;) {
    Status status = try_read(out);
    if (status.code() != ErrorCode::kNotReady) return status;
    const auto now = std::chrono::steady_clock::now();
    const auto remaining = deadline == std::chrono::steady_clock::time_point::max()
                               ? std::chrono::nanoseconds::max()
                               : std::chrono::nanoseconds(std::max(deadline, now) - now);
    switch (wait(
        ring_.header->not_empty, spin_, [this] { return has_data(); }, cancelled, remaining)) {
      case WaitResult::kReady: break;
      case WaitResult::kCancelled:
        return Status(ErrorCode::kDeinitialized, "the channel is closed");
      case WaitResult::kTimedOut:
        return error(ErrorCode::kTimeout, "no message within ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms");
    }
  }
}

}  // namespace hiber::wire
