// The operations of the remoted libraries (cuBLAS, cuBLASLt, cuDNN): one table, HIBER_LIBRARY_OPS,
// names each operation once, with its number, its library, whether it is a compute call or a
// query, its arguments and the API call it stands for. From it come the operation enum, the
// binding of each argument struct to its operation (op_of) with the struct's checks, and the
// dispatch every consumer goes through (library_ops/dispatch.h): hiberd's checks
// (server/*_checks.cc), the CUDA backends (server/device/cuda_*.cc) and the simulated GPU's host
// implementations (server/device/sim/*_host.cc). Adding an operation is one row, its arguments,
// and one handler in each of those: a consumer without one does not compile.
//
// The semantics the client, the wire and the device backends share live here (the argument
// structs and their checks: blas_ops.h, dnn_ops.h), with no I/O and no CUDA, so that the device
// layer depends on what an operation means and not on how it travels.
//
// Arguments travel as a plain struct of fixed-width fields per operation, copied byte for byte
// (both ends are built from this source, the handshake checks the protocol version, and the
// receiver checks the size and every value before it acts), or, for the cuDNN graph operations,
// in their own encoding (Encoded: dnn_ops.h decodes and checks them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include "common/status.h"
#include "common/strong_id.h"

namespace hiber::library_ops {

// cuBLAS and cuBLASLt share handles (PyTorch passes a cublasHandle_t as a cublasLtHandle_t), so
// they are one library here: kBlas.
enum class Library : uint8_t {
  kBlas = 1,  // cuBLAS and cuBLASLt
  kDnn = 2,   // cuDNN
};
std::string_view library_name(Library library);
inline bool is_library(uint8_t value) { return value == 1 || value == 2; }

// The client's name for a library handle it made (hiberd's backends keep the library's own
// handles under it).
using LibraryHandle = StrongId<struct LibraryHandleTag, uint64_t>;

// kCall: a compute call, ordered on a stream like a launch; kQuery: a question hiberd answers
// and the client waits for (heuristics, finalizing a plan).
enum class Kind : uint8_t { kCall, kQuery };

// Arguments in their own encoding rather than a fixed struct.
struct Encoded {};

// X(name, number, library, kind, arguments, api call). Numbers are in ranges per library
// (cuBLAS 1..99, cuBLASLt 100..199, cuDNN 200..399) and never reused.
// clang-format off
#define HIBER_LIBRARY_OPS(X)                                                                      \
  X(BlasGemm, 1, kBlas, kCall, blas::Gemm, "cuBLAS gemm")                                         \
  X(LtMatmul, 100, kBlas, kCall, blas::LtMatmul, "cublasLtMatmul")                                \
  X(LtHeuristic, 101, kBlas, kQuery, blas::LtHeuristic, "cublasLtMatmulAlgoGetHeuristic")         \
  X(DnnDefineGraph, 200, kDnn, kCall, Encoded, "cuDNN define graph")                              \
  X(DnnFinalize, 201, kDnn, kQuery, Encoded, "cudnnBackendFinalize")                              \
  X(DnnExecute, 202, kDnn, kCall, Encoded, "cudnnBackendExecute")                                 \
  X(DnnBatchNormInference, 210, kDnn, kCall, dnn::BatchNormInference,                             \
    "cudnnBatchNormalizationForwardInference")                                                    \
  X(DnnPooling, 211, kDnn, kCall, dnn::Pooling, "cudnnPoolingForward")                            \
  X(DnnActivation, 212, kDnn, kCall, dnn::Activation, "cudnnActivationForward")                   \
  X(DnnSoftmax, 213, kDnn, kCall, dnn::Softmax, "cudnnSoftmaxForward")                            \
  X(DnnAddTensor, 214, kDnn, kCall, dnn::AddTensor, "cudnnAddTensor")
// clang-format on

enum class LibraryOp : uint16_t {
#define HIBER_OP_ENUM_(name, number, library, kind, args, api) k##name = number,
  HIBER_LIBRARY_OPS(HIBER_OP_ENUM_)
#undef HIBER_OP_ENUM_
};

// Whether `op` leaves state in hiberd's session (a cuDNN graph's definition, kept until the
// handle goes): a client resuming its session after hiberd restarts sends it again.
constexpr bool defines_session_state(LibraryOp op) { return op == LibraryOp::kDnnDefineGraph; }

// The row of `op`; false for a number no row has.
struct OpRow {
  Library library;
  Kind kind;
  std::string_view api;
};
constexpr bool op_row(uint16_t op, OpRow* row) {
  switch (op) {
#define HIBER_OP_ROW_(name, number, library, kind, args, api) \
  case number: *row = {Library::library, Kind::kind, api}; return true;
    HIBER_LIBRARY_OPS(HIBER_OP_ROW_)
#undef HIBER_OP_ROW_
  }
  return false;
}

// The library of an operation of the table.
constexpr Library library_of(LibraryOp op) {
  OpRow row{};
  (void)op_row(static_cast<uint16_t>(op), &row);
  return row.library;
}

// The API call `op` stands for, for messages ("cublasLtMatmul").
std::string_view op_name(LibraryOp op);

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

}  // namespace hiber::library_ops
