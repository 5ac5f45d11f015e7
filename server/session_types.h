// Who a session serves and what it reports, apart from the session itself (server/session.h),
// so that status reports can name sessions without the call machinery.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/histogram.h"
#include "common/ids.h"
#include "server/auth.h"

namespace hiber::server {

struct SessionIdentity {
  SessionId id{0};  // set when the session is made
  std::string function_id;
  PeerCredentials peer;
  std::string instance = {};  // its Hello's instance key; "" when it gave none
};

// A point-in-time view for status reports.
struct SessionSnapshot {
  SessionIdentity identity;
  std::optional<GpuId> gpu;  // the lease's GPU; none between leases
  uint64_t allocated_bytes = 0;
  uint64_t quota_bytes = 0;
  uint64_t batches = 0;
  Histogram batch_sizes;  // calls per batch (accepted batches)
  uint64_t calls = 0;
  uint64_t failed_calls = 0;
  uint64_t malformed_messages = 0;
  uint64_t leases = 0;
  double connected_seconds = 0;
};

}  // namespace hiber::server
