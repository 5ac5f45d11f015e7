// Remoted libraries (cuBLAS, cuBLASLt, cuDNN) on the wire: what is common to all of them.
//
// The client keeps the libraries' descriptors and settings itself and sends each compute call
// whole, with everything hiberd needs to run it: one call-table entry carries them all
// (calls::LibraryCall, a GPU call ordered on a stream like a launch), another asks hiberd a
// question whose answer the client waits for (calls::LibraryQuery: heuristics, plan finalizing).
// Each carries an operation number and its arguments, a plain struct of fixed-width fields per
// operation (wire/blas_ops.h, wire/dnn_ops.h), copied byte for byte: both ends are built from
// this source, the handshake checks the protocol version, and the server checks the size and
// every value before it acts. Encoding them field by field in Cap'n Proto would cost a builder
// per call for no gain in safety: the struct is as checkable as a Cap'n Proto group.
//
// Handles: the client names each library handle it creates (calls::LibraryHandleCreate); every
// call names the handle it runs under, and hiberd refuses a handle the session did not create.
// cuBLAS and cuBLASLt share handles (PyTorch passes a cublasHandle_t as a cublasLtHandle_t), so
// they are one library here: kBlas.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "wire/call_table.h"

namespace hiber::wire {

enum class Library : uint8_t {
  kBlas = 1,  // cuBLAS and cuBLASLt
  kDnn = 2,   // cuDNN
};
std::string_view library_name(Library library);
inline bool is_library(uint8_t value) { return value == 1 || value == 2; }

// Operation numbers, in ranges per library so that a number names its library.
enum class LibraryOp : uint16_t {
  // cuBLAS, 1..99 (wire/blas_ops.h)
  kBlasGemm = 1,
  kBlasGemv = 2,
  // cuBLASLt, 100..199
  kLtMatmul = 100,
  kLtHeuristic = 101,  // a query
  // cuDNN, 200..399 (wire/dnn_ops.h)
  kDnnDefineGraph = 200,  // ships a finalized descriptor graph once; later calls name it
  kDnnFinalize = 201,     // a query: engine heuristics, engines, plans
  kDnnExecute = 202,
  kDnnBatchNormInference = 210,
  kDnnPooling = 211,
  kDnnActivation = 212,
  kDnnSoftmax = 213,
  kDnnAddTensor = 214,
};
inline Library library_of(LibraryOp op) {
  return static_cast<uint16_t>(op) < 200 ? Library::kBlas : Library::kDnn;
}

// The bytes of an operation's argument struct, as sent.
template <typename Args>
std::span<const std::byte> op_bytes(const Args& args) {
  static_assert(std::is_trivially_copyable_v<Args>);
  return std::as_bytes(std::span(&args, 1));
}

// An operation's argument struct from the bytes a call carried: kInvalidValue naming `what` if
// the size is not the struct's (a client built from other sources).
template <typename Args>
Result<Args> read_op(std::span<const std::byte> bytes, std::string_view what) {
  static_assert(std::is_trivially_copyable_v<Args>);
  if (bytes.size() != sizeof(Args)) {
    return error(ErrorCode::kInvalidValue, what, ": ", bytes.size(), " bytes of arguments, ",
                 sizeof(Args), " expected");
  }
  Args args;
  std::memcpy(&args, bytes.data(), sizeof(Args));
  return args;
}

// A query's answer, as the completion carries it.
struct LibraryAnswer {
  std::vector<std::byte> bytes;
};

// Limits hiberd enforces on library calls (the client's own checks use them too).
inline constexpr size_t kMaxLibraryArgBytes = 1 << 20;
inline constexpr size_t kMaxLibraryHandles = 1 << 12;

}  // namespace hiber::wire
