// A session's remoted-library state and the checks its library calls pass before they run.
//
// The session owns one LibraryCalls. It knows the library handles the client created (a call
// naming any other is refused, so a handle of another session is worth nothing), and for each
// call it returns the device ranges the call reads and writes, after checking every value the
// client sent against the operation's rules. The session then checks the ranges against its
// memory and waits for their swap groups before the device runs the call. Where an operation
// reaches memory through device-resident pointers (batched GEMM's pointer arrays), it says so,
// and the session waits for the whole model.
//
// Not thread-safe: the session thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "library_ops/dnn_ops.h"
#include "wire/library.h"

namespace hiber::server {

// A device range a library call reads or writes.
struct LibraryOperand {
  uint64_t ptr = 0;
  uint64_t bytes = 0;
  bool write = false;
  const char* what = "";  // for errors: "A", "B", "bias", ...
};

struct LibraryAccess {
  std::vector<LibraryOperand> operands;
  // Reaches memory through pointers stored in device memory: every block may be used.
  bool through_pointers = false;
};

// The cuDNN plans the session defined (kDnnDefineGraph), by the client's graph id: what its
// kDnnExecute calls name, and what their variant packs are checked against.
using DnnGraphs = std::unordered_map<uint64_t, std::shared_ptr<const library_ops::dnn::Plan>>;

class LibraryCalls {
 public:
  Status create_handle(wire::LibraryHandle handle, uint8_t library);
  Status destroy_handle(wire::LibraryHandle handle);
  // The library of a handle the session created; kInvalidHandle otherwise.
  Result<library_ops::Library> library(wire::LibraryHandle handle) const;
  const std::unordered_map<wire::LibraryHandle, library_ops::Library>& handles() const {
    return handles_;
  }

  // Checks a compute call (calls::LibraryCall) of `op` under `handle`; its operands.
  Result<LibraryAccess> check_call(wire::LibraryHandle handle, uint16_t op,
                                   std::span<const std::byte> args);
  // Checks a query (calls::LibraryQuery).
  Status check_query(wire::LibraryHandle handle, uint16_t op, std::span<const std::byte> args);

 private:
  Result<library_ops::LibraryOp> check_op(wire::LibraryHandle handle, uint16_t op,
                                          std::span<const std::byte> args, const char* kind) const;

  std::unordered_map<wire::LibraryHandle, library_ops::Library> handles_;
  DnnGraphs dnn_graphs_;
};

// Per library (server/blas_checks.cc, server/dnn_checks.cc): the operands of a compute call,
// after checking its values. kInvalidValue naming the value otherwise; kNotSupported for an
// operation that is not a compute call of the library.
Result<LibraryAccess> check_blas_call(library_ops::LibraryOp op, std::span<const std::byte> args);
Status check_blas_query(library_ops::LibraryOp op, std::span<const std::byte> args);
// cuDNN's calls use and extend the session's defined graphs.
Result<LibraryAccess> check_dnn_call(library_ops::LibraryOp op, std::span<const std::byte> args,
                                     DnnGraphs& graphs);
Status check_dnn_query(library_ops::LibraryOp op, std::span<const std::byte> args);

}  // namespace hiber::server
