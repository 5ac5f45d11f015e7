// The client side of the call protocol on top of a ClientChannel: numbers calls, batches them,
// waits for replies, keeps the session's sticky error, and manages the arena's staging FIFO.
//
// Tools and tests use it directly. The CUDA shim builds its flush policy (N calls, B bytes,
// T microseconds of quiet) on top.
//
// Errors. A call sent without reply that fails comes back as a completion with its error; the
// first such error is kept (sticky) until take_error(), as CUDA keeps its last error. A reply
// carries its own call's status. A session-level error (a malformed batch, seq 0) or the server
// closing the session is sticky too.
//
// Staging. stage() hands out room in the arena for data that one call needs (a pageable
// source, a destination the client reads after the reply). Positions grow monotonically; the
// call names its end (stagingEnd) and the server releases the bytes once the call is done.
//
// Thread safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <variant>

#include "common/kernel_info.h"
#include "common/status.h"
#include "wire/batch_builder.h"
#include "wire/call_codec.h"
#include "wire/client_channel.h"
#include "wire/library.h"
#include "wire/schema/calls.capnp.h"

namespace hiber::wire {

struct CallClientOptions {
  uint32_t max_batch_calls = 256;                  // a batch is sent when it holds this many
  std::chrono::milliseconds reply_timeout{60000};  // kTimeout after this long without a reply
  // The staging FIFO uses the first staging_bytes of the arena (0: all of it); the rest is the
  // client's own, e.g. the shim's pinned host memory.
  uint64_t staging_bytes = 0;
};

// What a reply carries besides its status.
using CallResult =
    std::variant<std::monostate, uint64_t /*ping*/, float /*elapsedMs*/, KernelInfo, LibraryAnswer>;

class CallClient {
 public:
  static Result<std::unique_ptr<CallClient>> connect(const ClientOptions& options,
                                                     CallClientOptions call_options = {});
  CallClient(std::unique_ptr<ClientChannel> channel, CallClientOptions options);

  const SessionInfo& session() const { return channel_->session(); }
  ClientChannel& channel() { return *channel_; }

  // Appends an asynchronous call: `fill` is its argument struct (wire/call_table.h), or sets a
  // proto::Call::Builder itself. Sends the batch when full.
  template <typename Fill>
  Status enqueue(Fill&& fill) {
    if (batch_.empty()) batch_.reset(next_seq_);
    fill_call(batch_.add_call(), fill);
    ++next_seq_;
    return batch_.full() ? flush() : Status();
  }

  // Appends a call with reply = true, sends the batch and waits for the call's completion.
  // The status is the call's own; the sticky error is not consumed. A failure also becomes the
  // sticky error unless `sticky` is false (a probe whose failure is an answer, not an error).
  template <typename Fill>
  Result<CallResult> call(Fill&& fill, bool sticky = true) {
    HIBER_ASSIGN_OR_RETURN(uint64_t seq, append_awaited(std::forward<Fill>(fill), sticky));
    Status sent = flush();
    if (!sent.ok()) {
      awaited_.erase(seq);
      return sent;
    }
    return wait_reply(seq);
  }

  // The two halves of call(), for pipelining: append a call whose reply will be awaited (sent
  // with the batch: when full, or at flush()), and later wait for it. Every awaited call must
  // be waited for.
  template <typename Fill>
  Result<uint64_t> append_awaited(Fill&& fill, bool sticky = true) {
    if (batch_.full()) HIBER_RETURN_IF_ERROR(flush());
    if (batch_.empty()) batch_.reset(next_seq_);
    const uint64_t seq = next_seq_++;
    proto::Call::Builder c = batch_.add_call();
    fill_call(c, fill);
    c.setReply(true);
    awaited_.emplace(seq, sticky);
    return seq;
  }
  Result<CallResult> wait(uint64_t seq) { return wait_reply(seq); }

  // What this client has sent and waited for, for reports (the shim's HIBER_STATS) and for
  // tests that count a workload's synchronous round trips.
  struct Stats {
    uint64_t batches = 0;  // batches sent
    uint64_t calls = 0;    // calls in them
    uint64_t waits = 0;    // replies waited for: each a synchronous round trip
  };
  const Stats& stats() const { return stats_; }

  // The batch being built: its calls, and an upper bound of its encoded size.
  uint32_t batched_calls() const { return batch_.size(); }
  uint64_t batched_bytes() const { return batch_.encoded_bytes(); }
  // Bytes stage() can hand out at once.
  uint64_t staging_capacity() const;

  // Sends the calls added so far (nothing if none). If hiberd refuses the batch before any of
  // it is sent (too large), its calls are dropped, their sequence numbers are given back, and
  // the error is returned (and kept as the sticky error).
  Status flush();

  // Sends a ping and waits for it: a full synchronous round trip.
  Status ping();

  // The sticky error: the first failure of an asynchronous call not yet taken. Reading it first
  // collects every completion already waiting.
  Status peek_error();
  Status take_error();
  // Makes `status` the sticky error unless one is kept already (a failure the client learned of
  // another way: work lost with a session hiberd did not survive).
  void set_error(Status status) { keep_error(std::move(status)); }

  struct Staged {
    uint64_t offset = 0;         // in the arena
    std::span<std::byte> bytes;  // where to write (or, after the reply, read)
    uint64_t staging_end = 0;    // for the call's stagingEnd
  };
  // Room for `bytes` in the staging FIFO, waiting (after sending what is batched) for the server
  // to release space. kInvalidValue if bytes is 0 or larger than the arena.
  Result<Staged> stage(uint64_t bytes);

 private:
  Result<CallResult> wait_reply(uint64_t seq);
  // Reads one completion message (waiting up to `timeout`) and files its completions.
  Status collect(std::chrono::nanoseconds timeout);
  void keep_error(Status status);

  std::unique_ptr<ClientChannel> channel_;
  CallClientOptions options_;
  Stats stats_;
  BatchBuilder batch_;
  uint64_t next_seq_ = 1;
  Status sticky_;
  // Calls sent with reply = true whose reply has not been taken -> whether a failure is sticky.
  std::map<uint64_t, bool> awaited_;
  std::map<uint64_t, std::pair<Status, CallResult>> replies_;  // arrived, not yet waited for
  // Batches hiberd refused as a whole (a completion with sequence 0), and the last reason: a
  // call of such a batch will never get its reply.
  uint64_t rejections_ = 0;
  Status last_rejection_;
  Message message_;
  uint64_t staging_head_ = 0;  // staging bytes handed out, monotonic
};

}  // namespace hiber::wire
