// Builds Batch messages (wire/schema/calls.capnp) on the client's hot path.
//
// Calls are written straight into a Cap'n Proto list preallocated for max_calls, in a first
// segment sized for exactly that list; variable-size data (kernel parameters, names) goes to
// later segments. finish() shortens the list to the calls actually added and sends the first
// segment only up to its end, so a batch of one call is as small as a batch of one call can be,
// and finishing costs the same whatever max_calls is. Segment memory is kept between batches:
// batches of fixed-size calls allocate nothing; a batch with a second segment costs the few
// small allocations Cap'n Proto makes for any multi-segment message.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "wire/schema/calls.capnp.h"

namespace hiber::wire {

class BatchBuilder {
 public:
  explicit BatchBuilder(uint32_t max_calls);
  ~BatchBuilder();

  // Starts a new, empty batch whose first call will have sequence number first_seq.
  void reset(uint64_t first_seq);

  // Appends a call and returns it for the caller to fill in. REQUIRES: !full().
  proto::Call::Builder add_call();

  uint32_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  bool full() const { return count_ == max_calls_; }
  uint64_t first_seq() const { return first_seq_; }

  // Bytes the batch would take if finished now (an upper bound, for flush-at-B-bytes).
  uint64_t encoded_bytes() const;

  // Finishes the batch and returns it framed for a ring write (segment table, then segments).
  // The spans stay valid until the next reset(). REQUIRES: !empty().
  std::span<const std::span<const std::byte>> finish();

 private:
  class Arena;
  uint32_t max_calls_;
  uint64_t first_seq_ = 0;
  uint32_t count_ = 0;
  std::unique_ptr<Arena> arena_;
};

}  // namespace hiber::wire
