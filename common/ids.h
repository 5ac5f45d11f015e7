// The ids every part of the node shares. Each is its own type (common/strong_id.h): the compiler
// rejects a session id where a function id is expected. "None" is std::optional<...>.
#pragma once

#include <cstdint>

#include "common/strong_id.h"

namespace hiber {

// A function: one tenant of the node, one model. The caller of the node core numbers them.
using FunctionId = StrongId<struct FunctionIdTag, uint32_t>;

// An instance of a function: one process serving it (in hiberd, one session), with its own
// address range, blocks and copy of the model, its handles and its contexts. A function may have
// several at once, each running one request at a time on a GPU of its own. The caller of the
// node core numbers them and never reuses a number.
using InstanceId = StrongId<struct InstanceIdTag, uint32_t>;

// A request the scheduler accepted. The scheduler builds it: the low 32 bits are a slot, the
// high 32 bits a generation, so a stale id never names a later request.
using RequestId = StrongId<struct RequestIdTag, uint64_t>;

// One client connection to hiberd.
using SessionId = StrongId<struct SessionIdTag, uint64_t>;

// A GPU of the node: its index in the node's configuration, 0-based.
using GpuId = StrongId<struct GpuIdTag, int32_t>;

}  // namespace hiber
