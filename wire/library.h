// Remoted libraries (cuBLAS, cuBLASLt, cuDNN) on the wire: what is common to all of them.
//
// The client keeps the libraries' descriptors and settings itself and sends each compute call
// whole, with everything hiberd needs to run it: one call-table entry carries them all
// (calls::LibraryCall, a GPU call ordered on a stream like a launch), another asks hiberd a
// question whose answer the client waits for (calls::LibraryQuery: heuristics, plan finalizing).
// Each carries an operation number and its arguments as library_ops/ defines them (the
// operation table, HIBER_LIBRARY_OPS, and the argument structs): the server checks the size and
// every value before it acts. Encoding them field by field in Cap'n Proto would cost a builder
// per call for no gain in safety: the struct is as checkable as a Cap'n Proto group.
//
// Handles: the client names each library handle it creates (calls::LibraryHandleCreate); every
// call names the handle it runs under, and hiberd refuses a handle the session did not create.
#pragma once

#include <cstddef>
#include <vector>

#include "library_ops/library_ops.h"
#include "wire/call_table.h"

namespace hiber::wire {

// A query's answer, as the completion carries it.
struct LibraryAnswer {
  std::vector<std::byte> bytes;
};

// Limits hiberd enforces on library calls (the client's own checks use them too).
inline constexpr size_t kMaxLibraryArgBytes = 1 << 20;
inline constexpr size_t kMaxLibraryHandles = 1 << 12;

}  // namespace hiber::wire
