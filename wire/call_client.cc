#include "wire/call_client.h"

#include "wire/message.h"

namespace hiber::wire {
namespace {

// Staged ranges start on a cache line, so two calls never share one.
constexpr uint64_t kStagingAlignment = 64;

CallResult result_of(proto::Completion::Reader c) {
  auto r = c.getResult();
  switch (r.which()) {
    case proto::Completion::Result::PING: return r.getPing();
    case proto::Completion::Result::ELAPSED_MS: return r.getElapsedMs();
    case proto::Completion::Result::KERNEL: {
      KernelInfo info;
      info.name = r.getKernel().getName();
      for (auto p : r.getKernel().getParams()) info.params.push_back({p.getOffset(), p.getBytes()});
      return info;
    }
    case proto::Completion::Result::LIBRARY: {
      auto data = r.getLibrary();
      auto bytes = std::as_bytes(std::span(data.begin(), data.size()));
      return LibraryAnswer{std::vector<std::byte>(bytes.begin(), bytes.end())};
    }
    default: return std::monostate{};
  }
}

}  // namespace

Result<std::unique_ptr<CallClient>> CallClient::connect(const ClientOptions& options,
                                                        CallClientOptions call_options) {
  auto channel = ClientChannel::connect(options);
  if (!channel.ok()) return channel.status();
  return std::make_unique<CallClient>(std::move(channel).value(), call_options);
}

CallClient::CallClient(std::unique_ptr<ClientChannel> channel, CallClientOptions options)
    : channel_(std::move(channel)), options_(options), batch_(options.max_batch_calls) {}

Status CallClient::flush() {
  if (batch_.empty()) return Status();
  const uint32_t calls = batch_.size();
  Status sent = channel_->send_pieces(batch_.finish());
  if (sent.ok()) {
    ++stats_.batches;
    stats_.calls += calls;
  }
  if (!sent.ok() && sent.code() != ErrorCode::kDeinitialized) {
    // Nothing of the batch reached hiberd: reuse its numbers, or every later batch would start
    // after a gap hiberd refuses.
    next_seq_ = batch_.first_seq();
  }
  batch_.reset(next_seq_);
  if (!sent.ok()) keep_error(sent);
  return sent;
}

Status CallClient::ping() {
  auto reply = call(calls::Ping{.value = 0x70696e67});
  return reply.status();
}

Status CallClient::peek_error() {
  // File whatever has already arrived, without waiting.
  while (true) {
    Status got = collect(std::chrono::nanoseconds(0));
    if (!got.ok()) break;
  }
  return sticky_;
}

Status CallClient::take_error() {
  Status error = peek_error();
  sticky_ = Status();
  return error;
}

void CallClient::keep_error(Status status) {
  // Not ready is an answer (a query of pending work), not an error, as in CUDA.
  if (status.code() == ErrorCode::kNotReady) return;
  if (sticky_.ok() && !status.ok()) sticky_ = std::move(status);
}

Status CallClient::collect(std::chrono::nanoseconds timeout) {
  Status received = channel_->receive(message_, timeout);
  if (!received.ok()) {
    if (received.code() == ErrorCode::kDeinitialized) keep_error(received);
    return received;
  }
  return read_message<proto::ServerMessage>(
      message_, "completion message", [&](proto::ServerMessage::Reader m) -> Status {
        if (m.isClosing()) {
          Status closed(static_cast<ErrorCode>(m.getClosing().getCode()),
                        str_cat("hiberd closed the session: ", m.getClosing().getMessage().cStr()));
          keep_error(closed);
          return Status();
        }
        for (auto c : m.getCompletions()) {
          Status status;
          if (c.getCode() != 0) {
            status = Status(static_cast<ErrorCode>(c.getCode()), c.getMessage());
          }
          const uint64_t seq = c.getSeq();
          bool sticky = true;
          if (auto awaited = awaited_.find(seq); awaited != awaited_.end()) {
            replies_[seq] = {status, result_of(c)};
            sticky = awaited->second;
          } else if (seq == 0 && !status.ok()) {
            ++rejections_;
            last_rejection_ = status;
          }
          // A failed call is the sticky error even if somebody waits for its reply, as with
          // CUDA, where a failing synchronous call also becomes the last error.
          if (sticky) keep_error(status);
        }
        return Status();
      });
}

Result<CallResult> CallClient::wait_reply(uint64_t seq) {
  ++stats_.waits;
  const auto deadline = std::chrono::steady_clock::now() + options_.reply_timeout;
  const uint64_t rejections_before = rejections_;
  Result<CallResult> outcome = Status(ErrorCode::kUnknown, "unset");
  while (true) {
    auto it = replies_.find(seq);
    if (it != replies_.end()) {
      auto [status, result] = std::move(it->second);
      replies_.erase(it);
      outcome = status.ok() ? Result<CallResult>(std::move(result)) : Result<CallResult>(status);
      break;
    }
    if (rejections_ != rejections_before) {
      // hiberd refused the batch this call was in; its reply will never come.
      outcome = last_rejection_;
      break;
    }
    if (sticky_.code() == ErrorCode::kDeinitialized) {
      outcome = sticky_;
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      outcome = error(ErrorCode::kTimeout, "no reply to call ", seq, " within ",
                      options_.reply_timeout.count(), " ms");
      break;
    }
    Status got = collect(deadline - now);
    if (!got.ok() && got.code() != ErrorCode::kTimeout) {
      outcome = got;
      break;
    }
  }
  awaited_.erase(seq);
  return outcome;
}

uint64_t CallClient::staging_capacity() const {
  const uint64_t arena = channel_->arena().size();
  return options_.staging_bytes == 0 ? arena : std::min(options_.staging_bytes, arena);
}

Result<CallClient::Staged> CallClient::stage(uint64_t bytes) {
  const uint64_t capacity = staging_capacity();
  if (bytes == 0 || bytes > capacity) {
    return error(ErrorCode::kInvalidValue, "cannot stage ", bytes, " bytes in a staging area of ",
                 capacity);
  }
  const uint64_t rounded = (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  uint64_t start = staging_head_;
  const uint64_t offset_in_lap = start % capacity;
  if (rounded > capacity - offset_in_lap) start += capacity - offset_in_lap;  // no wrapping
  const uint64_t end = start + std::min(rounded, capacity);
  // Free once the server released everything up to `end - capacity`, or everything it was
  // given (then the whole arena is free, whatever a skipped tail counts for).
  const uint64_t needed = std::min(staging_head_, end > capacity ? end - capacity : 0);
  if (channel_->staging_released() < needed) {
    HIBER_RETURN_IF_ERROR(flush());
    HIBER_RETURN_IF_ERROR(channel_->wait_staging_released(needed, options_.reply_timeout));
  }
  staging_head_ = end;
  Staged staged;
  staged.offset = start % capacity;
  staged.bytes = channel_->arena().subspan(staged.offset, bytes);
  staged.staging_end = end;
  return staged;
}

}  // namespace hiber::wire
