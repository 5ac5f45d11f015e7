#include "library_ops/blas_ops.h"

#include <algorithm>
#include <climits>

namespace hiber::library_ops::blas {
namespace {

// Values of cudaDataType_t (library_types.h) and cublasComputeType_t (cublas_api.h); the wire
// carries the API's numbers, and wire/ builds without the toolkit's headers.
enum DataType : int32_t {
  kR16F = 2,
  kC16F = 6,
  kR16BF = 14,
  kR32F = 0,
  kC32F = 4,
  kR64F = 1,
  kC64F = 5,
  kR8I = 3,
  kR32I = 10,
  kR8U = 8,
  kR8F_E4M3 = 28,
  kR8F_E5M2 = 29,
};
enum ComputeType : int32_t {
  k16F = 64,
  k16FPedantic = 65,
  k32F = 68,
  k32FPedantic = 69,
  k32FFast16F = 74,
  k32FFast16BF = 75,
  k32FFastTF32 = 77,
  k64F = 70,
  k64FPedantic = 71,
  k32I = 72,
  k32IPedantic = 73,
};

constexpr int64_t kMaxExtent = int64_t{1} << 48;

}  // namespace

Result<uint64_t> element_bytes(int32_t data_type, std::string_view what) {
  switch (data_type) {
    case kR8I:
    case kR8U:
    case kR8F_E4M3:
    case kR8F_E5M2: return 1;
    case kR16F:
    case kR16BF: return 2;
    case kR32F:
    case kR32I:
    case kC16F: return 4;
    case kR64F:
    case kC32F: return 8;
    case kC64F: return 16;
  }
  return error(ErrorCode::kNotSupported, what, ": data type ", data_type,
               " is not a cudaDataType_t Hiber remotes");
}

Result<uint64_t> scale_bytes(int32_t compute_type, int32_t c_type) {
  const bool complex = c_type == kC32F || c_type == kC64F || c_type == kC16F;
  switch (compute_type) {
    case k16F:
    case k16FPedantic: return complex ? 4 : 2;
    case k32F:
    case k32FPedantic:
    case k32FFast16F:
    case k32FFast16BF:
    case k32FFastTF32: return complex ? 8 : 4;
    case k64F:
    case k64FPedantic: return complex ? 16 : 8;
    case k32I:
    case k32IPedantic: return 4;
    // Legacy calls name a cudaDataType_t as the compute type.
    case kR16F: return 2;
    case kR32F: return 4;
    case kR64F: return 8;
    case kC32F: return 8;
    case kC64F: return 16;
  }
  return error(ErrorCode::kNotSupported, "compute type ", compute_type,
               " is not a cublasComputeType_t Hiber remotes");
}

Status check_shape(const MatrixShape& s) {
  if (s.rows < 0 || s.cols < 0 || s.ld < std::max<int64_t>(1, s.rows))
    return error(ErrorCode::kInvalidValue, s.what, ": ", s.rows, " x ", s.cols,
                 " with leading dimension ", s.ld, " (it must be at least max(1, rows))");
  return Status();
}

Result<uint64_t> batched_extent(const MatrixShape& s, int64_t batches, int64_t stride) {
  HIBER_RETURN_IF_ERROR(check_shape(s));
  if (batches < 0 || stride < 0)
    return error(ErrorCode::kInvalidValue, s.what, ": ", batches, " batches ", stride,
                 " elements apart");
  if (s.rows == 0 || s.cols == 0 || batches == 0) return 0;
  // In 128 bits, so no client's numbers overflow the check.
  const __int128 one = static_cast<__int128>(s.cols - 1) * s.ld + s.rows;
  const __int128 elements = static_cast<__int128>(batches - 1) * stride + one;
  const __int128 bytes = elements * static_cast<__int128>(s.element_bytes);
  if (bytes > kMaxExtent)
    return error(ErrorCode::kInvalidValue, s.what, ": ", s.rows, " x ", s.cols, " (ld ", s.ld,
                 ") times ", batches, " spans more than 2^48 bytes");
  return static_cast<uint64_t>(bytes);
}

uint64_t lt_problem_hash(const LtProblem& problem) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (std::byte byte : op_bytes(problem)) {
    hash ^= static_cast<uint8_t>(byte);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

Result<LtDims> check_lt_problem(const LtProblem& p) {
  const LtLayout* layouts[] = {&p.a, &p.b, &p.c, &p.d};
  const char* names[] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    const LtLayout& l = *layouts[i];
    if (l.order != 0)
      return error(ErrorCode::kNotSupported, "cuBLASLt matmul: ", names[i], " has order ", l.order,
                   "; Hiber remotes column order (CUBLASLT_ORDER_COL) only");
    if (l.rows < 0 || l.cols < 0 || l.ld < std::max<int64_t>(1, l.rows) || l.batch_count < 1 ||
        l.batch_offset < 0)
      return error(ErrorCode::kInvalidValue, "cuBLASLt matmul: ", names[i], " is ", l.rows, " x ",
                   l.cols, " with leading dimension ", l.ld, ", ", l.batch_count,
                   " batches at offset ", l.batch_offset);
    HIBER_RETURN_IF_ERROR(element_bytes(l.type, names[i]).status());
  }
  if (p.transa > 2 || p.transb > 2 || p.transc != 0)
    return error(ErrorCode::kInvalidValue, "cuBLASLt matmul: transa ", unsigned{p.transa},
                 ", transb ", unsigned{p.transb}, ", transc ", unsigned{p.transc},
                 " (C is never transposed)");
  if (p.pointer_mode != 0 && p.pointer_mode != 1)
    return error(ErrorCode::kNotSupported, "cuBLASLt matmul: pointer mode ", p.pointer_mode,
                 "; Hiber remotes host and device scalars");
  switch (p.epilogue) {
    case kEpilogueDefault:
    case kEpilogueRelu:
    case kEpilogueBias:
    case kEpilogueReluBias:
    case kEpilogueGelu:
    case kEpilogueGeluBias: break;
    default:
      return error(ErrorCode::kNotSupported, "cuBLASLt matmul: epilogue ", p.epilogue,
                   "; Hiber remotes DEFAULT, RELU, BIAS, RELU_BIAS, GELU and GELU_BIAS");
  }
  if (p.epilogue & kEpilogueBias)
    HIBER_RETURN_IF_ERROR(element_bytes(p.bias_type, "bias").status());
  HIBER_RETURN_IF_ERROR(element_bytes(p.scale_type, "scale type").status());
  HIBER_RETURN_IF_ERROR(scale_bytes(p.compute_type, p.d.type).status());
  LtDims dims;
  dims.m = p.d.rows;
  dims.n = p.d.cols;
  dims.k = p.transa ? p.a.rows : p.a.cols;
  const int64_t a_m = p.transa ? p.a.cols : p.a.rows;
  const int64_t b_k = p.transb ? p.b.cols : p.b.rows;
  const int64_t b_n = p.transb ? p.b.rows : p.b.cols;
  if (a_m != dims.m || b_k != dims.k || b_n != dims.n || p.c.rows != dims.m || p.c.cols != dims.n)
    return error(ErrorCode::kInvalidValue, "cuBLASLt matmul: shapes disagree: op(A) ", a_m, " x ",
                 dims.k, ", op(B) ", b_k, " x ", b_n, ", C ", p.c.rows, " x ", p.c.cols, ", D ",
                 dims.m, " x ", dims.n);
  if (dims.m > INT32_MAX || dims.n > INT32_MAX || dims.k > INT32_MAX)
    return error(ErrorCode::kNotSupported, "cuBLASLt matmul: ", dims.m, " x ", dims.n, " x ",
                 dims.k, " exceeds 32-bit sizes");
  if (p.a.batch_count != p.d.batch_count || p.b.batch_count != p.d.batch_count ||
      p.c.batch_count != p.d.batch_count)
    return error(ErrorCode::kInvalidValue, "cuBLASLt matmul: batch counts differ (A ",
                 p.a.batch_count, ", B ", p.b.batch_count, ", C ", p.c.batch_count, ", D ",
                 p.d.batch_count, ")");
  dims.batch_count = p.d.batch_count;
  return dims;
}

}  // namespace hiber::library_ops::blas
