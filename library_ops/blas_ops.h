// cuBLAS and cuBLASLt operations (library_ops.h): one argument struct per operation. Enumerations
// carry the API's own values (cublasOperation_t, cudaDataType_t, cublasComputeType_t, ...), so no
// table translates them and the CUDA backend passes them on. Structs have no implicit padding
// (checked below), so what is sent is exactly the fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "common/status.h"
#include "library_ops/library_ops.h"

namespace hiber::library_ops::blas {

// A host scalar (alpha, beta) by value, in the call's scale type: up to a double complex.
struct Scalar {
  std::byte bytes[16];
};

enum class BatchKind : uint8_t {
  kSingle = 0,
  kStrided = 1,       // matrix i at base + i * stride
  kPointerArray = 2,  // a, b, c are device arrays of batch_count device pointers
};

// kBlasGemm: every cuBLAS GEMM form (cublas{S,D,H}gemm, GemmEx and their batched forms):
// C = alpha * op(A) op(B) + beta * C, column-major, op(A) m x k, op(B) k x n.
struct Gemm {
  uint64_t a = 0, b = 0, c = 0;  // device addresses (kPointerArray: of the pointer arrays)
  // Pointer mode device: the addresses of alpha and beta, read when the call runs.
  uint64_t alpha_ptr = 0, beta_ptr = 0;
  uint64_t workspace = 0, workspace_bytes = 0;  // cublasSetWorkspace's, 0 for cuBLAS's own
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // kStrided, in elements
  Scalar alpha{}, beta{};                            // pointer mode host
  int32_t m = 0, n = 0, k = 0;
  int32_t batch_count = 1;
  int32_t a_type = 0, b_type = 0, c_type = 0;  // cudaDataType_t
  int32_t compute_type = 0;                    // cublasComputeType_t
  int32_t algo = -1;                           // cublasGemmAlgo_t (CUBLAS_GEMM_DEFAULT)
  int32_t math_mode = 0;                       // cublasMath_t of the handle
  int32_t atomics_mode = 0;                    // cublasAtomicsMode_t of the handle
  uint8_t transa = 0, transb = 0;              // cublasOperation_t
  uint8_t pointer_mode = 0;                    // cublasPointerMode_t: 0 host, 1 device
  BatchKind batch = BatchKind::kSingle;
  uint8_t reserved[8] = {};
};
static_assert(std::has_unique_object_representations_v<Gemm>, "no padding on the wire");

// ---- cuBLASLt ----
// cuBLASLt descriptors live in the client (client_shim/cublaslt_api.cc); a matmul and a heuristic
// query carry their contents, as an LtProblem: what decides the algorithm and its arithmetic.

// A cublasLtMatrixLayout_t's contents.
struct LtLayout {
  int64_t rows = 0, cols = 0, ld = 0;  // as stored (before transa/transb)
  int64_t batch_offset = 0;            // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, elements
  int32_t type = 0;                    // cudaDataType_t
  int32_t batch_count = 1;
  int32_t order = 0;  // cublasLtOrder_t: 0 CUBLASLT_ORDER_COL
  int32_t reserved = 0;
};
static_assert(std::has_unique_object_representations_v<LtLayout>, "no padding on the wire");

// cublasLtEpilogue_t values the remoted matmul accepts.
enum LtEpilogue : int32_t {
  kEpilogueDefault = 1,
  kEpilogueRelu = 2,
  kEpilogueBias = 4,
  kEpilogueReluBias = 6,
  kEpilogueGelu = 32,
  kEpilogueGeluBias = 36,
};

// A matmul's descriptors: D = epilogue(alpha * op(A) op(B) + beta * C [+ bias]).
struct LtProblem {
  LtLayout a, b, c, d;
  int32_t compute_type = 0;  // cublasComputeType_t
  int32_t scale_type = 0;    // cudaDataType_t of alpha, beta (and of a fp32 bias default)
  int32_t epilogue = kEpilogueDefault;
  int32_t bias_type = 0;                       // cudaDataType_t of the bias vector
  int32_t pointer_mode = 0;                    // cublasLtPointerMode_t: 0 host, 1 device
  uint8_t transa = 0, transb = 0, transc = 0;  // cublasOperation_t
  uint8_t reserved = 0;
};
static_assert(std::has_unique_object_representations_v<LtProblem>, "no padding on the wire");

// The 64 bytes of a cublasLtMatmulAlgo_t as hiberd fills them (a heuristic's answer) and reads
// them back (a matmul). The client reads `id` only (cublasLtMatmulAlgoConfigGetAttribute).
struct LtAlgo {
  int32_t id = 0;            // CUBLASLT_ALGO_CONFIG_ID
  uint32_t magic = 0;        // kLtAlgoMagic: hiberd made it
  uint64_t problem = 0;      // lt_problem_hash of the problem it was chosen for
  uint64_t backend[6] = {};  // the backend's own
};
static_assert(sizeof(LtAlgo) == 64 && std::has_unique_object_representations_v<LtAlgo>);
inline constexpr uint32_t kLtAlgoMagic = 0x48424c54;  // "HBLT"

// FNV-1a of the problem's bytes: an algo answers for the problem it was chosen for only.
uint64_t lt_problem_hash(const LtProblem& problem);

// kLtMatmul: cublasLtMatmul, with everything hiberd needs to run it.
struct LtMatmul {
  LtProblem problem;
  uint64_t a = 0, b = 0, c = 0, d = 0;   // device addresses
  uint64_t bias = 0;                     // CUBLASLT_MATMUL_DESC_BIAS_POINTER
  int64_t bias_batch_stride = 0;         // CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, elements
  uint64_t alpha_ptr = 0, beta_ptr = 0;  // pointer mode device
  uint64_t workspace = 0, workspace_bytes = 0;
  Scalar alpha{}, beta{};  // pointer mode host, in the scale type
  LtAlgo algo{};           // all zero: no algo given (the library picks)
  uint8_t has_algo = 0;
  uint8_t reserved[7] = {};
};
static_assert(std::has_unique_object_representations_v<LtMatmul>, "no padding on the wire");

// kLtHeuristic (a query): cublasLtMatmulAlgoGetHeuristic. The answer is up to `requested`
// LtHeuristicResult back to back.
struct LtHeuristic {
  LtProblem problem;
  uint64_t max_workspace_bytes = 0;  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
  int32_t requested = 1;
  // CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: the split-K reduction schemes the caller allows
  // (PyTorch narrows it for fp16 and bf16 when reduced-precision reductions are disallowed); an
  // algorithm chosen without it could reduce in lower precision than asked. Every scheme
  // (kLtReductionSchemeAll, the library's default) where unset.
  uint32_t reduction_scheme_mask = 0x7;
  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES: the alignment the caller guarantees for
  // each operand (PyTorch sets them from its tensors' addresses); an algorithm chosen for more
  // would fail on the caller's operands. 256, the library's default, where unset. At most
  // kMaxLtAlignment (a power of two or not, as the library takes any value).
  uint32_t min_alignment[4] = {256, 256, 256, 256};
};
inline constexpr uint32_t kMaxLtAlignment = 1 << 15;
inline constexpr uint32_t kLtReductionSchemeAll = 0x7;  // CUBLASLT_REDUCTION_SCHEME_MASK
static_assert(std::has_unique_object_representations_v<LtHeuristic>, "no padding on the wire");

struct LtHeuristicResult {
  LtAlgo algo;
  uint64_t workspace_bytes = 0;
  uint32_t waves_bits = 0;  // wavesCount, a float's bits (a float has no unique representation)
  int32_t reserved = 0;
};
static_assert(std::has_unique_object_representations_v<LtHeuristicResult>);
inline constexpr int32_t kMaxLtHeuristicResults = 64;

// Checks an LtProblem as cuBLASLt does (kInvalidValue, kNotSupported naming the value): shapes
// agree (op(A) m x k, op(B) k x n, C and D m x n), column order, equal batch counts, known
// transposes and epilogue. Returns m, n, k.
struct LtDims {
  int64_t m = 0, n = 0, k = 0;
  int32_t batch_count = 1;
};
Result<LtDims> check_lt_problem(const LtProblem& problem);

// ---- Shapes, shared by the client's checks, hiberd's and the host implementations ----

// Bytes of one element of a cudaDataType_t; kNotSupported for a type no remoted call takes.
Result<uint64_t> element_bytes(int32_t data_type, std::string_view what);
// Bytes of alpha and beta for a cublasComputeType_t (or, for the legacy calls that name none, a
// cudaDataType_t compute type) with output type `c_type`.
Result<uint64_t> scale_bytes(int32_t compute_type, int32_t c_type);

// A column-major matrix as stored: rows x cols, leading dimension ld, in elements.
struct MatrixShape {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  uint64_t element_bytes = 0;
  const char* what = "";
};
// ld >= max(1, rows); kInvalidValue naming the matrix otherwise.
Status check_shape(const MatrixShape& shape);
// Bytes from the first element of the first matrix to the end of the last of `batches`
// matrices `stride` elements apart; kInvalidValue for a bad shape or a size beyond 2^48.
Result<uint64_t> batched_extent(const MatrixShape& shape, int64_t batches, int64_t stride);

}  // namespace hiber::library_ops::blas
