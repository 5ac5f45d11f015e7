// The checks of cuBLAS and cuBLASLt calls: values in range, and the device ranges each call
// reads and writes, computed from its shapes the way the libraries address memory.
#include "library_ops/dispatch.h"
#include "server/library_calls.h"

namespace hiber::server {
namespace {

using library_ops::blas::BatchKind;
using library_ops::blas::Gemm;
using library_ops::blas::LtHeuristic;
using library_ops::blas::LtMatmul;

Result<LibraryAccess> check_gemm(const Gemm& g) {
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch_count < 0)
    return error(ErrorCode::kInvalidValue, "cuBLAS gemm: negative size (m ", g.m, ", n ", g.n,
                 ", k ", g.k, ", batch ", g.batch_count, ")");
  if (g.transa > 2 || g.transb > 2)
    return error(ErrorCode::kInvalidValue, "cuBLAS gemm: transa ", unsigned{g.transa},
                 " or transb ", unsigned{g.transb}, " is not a cublasOperation_t");
  if (g.pointer_mode > 1)
    return error(ErrorCode::kInvalidValue, "cuBLAS gemm: pointer mode ", unsigned{g.pointer_mode});
  if (g.batch != BatchKind::kSingle && g.batch != BatchKind::kStrided &&
      g.batch != BatchKind::kPointerArray)
    return error(ErrorCode::kInvalidValue, "cuBLAS gemm: batch kind ",
                 static_cast<unsigned>(g.batch));
  HIBER_ASSIGN_OR_RETURN(uint64_t a_size, library_ops::blas::element_bytes(g.a_type, "A"));
  HIBER_ASSIGN_OR_RETURN(uint64_t b_size, library_ops::blas::element_bytes(g.b_type, "B"));
  HIBER_ASSIGN_OR_RETURN(uint64_t c_size, library_ops::blas::element_bytes(g.c_type, "C"));
  HIBER_ASSIGN_OR_RETURN(uint64_t scale_size,
                         library_ops::blas::scale_bytes(g.compute_type, g.c_type));

  LibraryAccess access;
  if (g.pointer_mode == 1) {
    access.operands.push_back({g.alpha_ptr, scale_size, false, "alpha"});
    access.operands.push_back({g.beta_ptr, scale_size, false, "beta"});
  }
  if (g.workspace_bytes > 0)
    access.operands.push_back({g.workspace, g.workspace_bytes, true, "workspace"});
  if (g.m == 0 || g.n == 0 || g.batch_count == 0) return access;  // nothing to touch

  const bool ta = g.transa != 0;
  const bool tb = g.transb != 0;
  // Stored shapes: op(A) is m x k, so A is m x k, or k x m when transposed.
  const library_ops::blas::MatrixShape a{ta ? g.k : g.m, ta ? g.m : g.k, g.lda, a_size, "A"};
  const library_ops::blas::MatrixShape b{tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, b_size, "B"};
  const library_ops::blas::MatrixShape c{g.m, g.n, g.ldc, c_size, "C"};
  if (g.batch == BatchKind::kPointerArray) {
    // The arrays are read here; the matrices they point to are reached through them.
    HIBER_RETURN_IF_ERROR(library_ops::blas::check_shape(a));
    HIBER_RETURN_IF_ERROR(library_ops::blas::check_shape(b));
    HIBER_RETURN_IF_ERROR(library_ops::blas::check_shape(c));
    const uint64_t array_bytes = uint64_t{8} * static_cast<uint64_t>(g.batch_count);
    access.operands.push_back({g.a, array_bytes, false, "the A pointer array"});
    access.operands.push_back({g.b, array_bytes, false, "the B pointer array"});
    access.operands.push_back({g.c, array_bytes, false, "the C pointer array"});
    access.through_pointers = true;
    return access;
  }
  const int32_t batches = g.batch == BatchKind::kStrided ? g.batch_count : 1;
  // g.k == 0: C = beta * C, A and B are not read.
  if (g.k > 0) {
    HIBER_ASSIGN_OR_RETURN(uint64_t a_bytes,
                           library_ops::blas::batched_extent(a, batches, g.stride_a));
    HIBER_ASSIGN_OR_RETURN(uint64_t b_bytes,
                           library_ops::blas::batched_extent(b, batches, g.stride_b));
    access.operands.push_back({g.a, a_bytes, false, "A"});
    access.operands.push_back({g.b, b_bytes, false, "B"});
  }
  HIBER_ASSIGN_OR_RETURN(uint64_t c_bytes,
                         library_ops::blas::batched_extent(c, batches, g.stride_c));
  access.operands.push_back({g.c, c_bytes, true, "C"});
  return access;
}

// The device range of `batches` matrices of `layout` (stored shape, no transpose).
Result<uint64_t> layout_extent(const library_ops::blas::LtLayout& l, const char* what) {
  HIBER_ASSIGN_OR_RETURN(uint64_t size, library_ops::blas::element_bytes(l.type, what));
  return library_ops::blas::batched_extent({l.rows, l.cols, l.ld, size, what}, l.batch_count,
                                           l.batch_offset);
}

Result<LibraryAccess> check_lt_matmul(const LtMatmul& mm) {
  HIBER_ASSIGN_OR_RETURN(library_ops::blas::LtDims dims,
                         library_ops::blas::check_lt_problem(mm.problem));
  const library_ops::blas::LtProblem& p = mm.problem;
  if (mm.has_algo > 1 || (mm.has_algo == 1 && mm.algo.magic != library_ops::blas::kLtAlgoMagic))
    return error(ErrorCode::kInvalidValue,
                 "cuBLASLt matmul: the algo was not returned by cublasLtMatmulAlgoGetHeuristic");
  HIBER_ASSIGN_OR_RETURN(uint64_t scale_size,
                         library_ops::blas::element_bytes(p.scale_type, "scale"));
  LibraryAccess access;
  if (p.pointer_mode == 1) {
    access.operands.push_back({mm.alpha_ptr, scale_size, false, "alpha"});
    access.operands.push_back({mm.beta_ptr, scale_size, false, "beta"});
  }
  if (mm.workspace_bytes > 0)
    access.operands.push_back({mm.workspace, mm.workspace_bytes, true, "workspace"});
  if (dims.m == 0 || dims.n == 0) return access;
  if (dims.k > 0) {
    HIBER_ASSIGN_OR_RETURN(uint64_t a_bytes, layout_extent(p.a, "A"));
    HIBER_ASSIGN_OR_RETURN(uint64_t b_bytes, layout_extent(p.b, "B"));
    access.operands.push_back({mm.a, a_bytes, false, "A"});
    access.operands.push_back({mm.b, b_bytes, false, "B"});
  }
  // C is read unless beta is 0, which under device pointers is known only when the call runs.
  HIBER_ASSIGN_OR_RETURN(uint64_t c_bytes, layout_extent(p.c, "C"));
  HIBER_ASSIGN_OR_RETURN(uint64_t d_bytes, layout_extent(p.d, "D"));
  access.operands.push_back({mm.c, c_bytes, false, "C"});
  access.operands.push_back({mm.d, d_bytes, true, "D"});
  if (p.epilogue & library_ops::blas::kEpilogueBias) {
    if (mm.bias == 0)
      return error(ErrorCode::kInvalidValue,
                   "cuBLASLt matmul: a bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
    if (mm.bias_batch_stride < 0)
      return error(ErrorCode::kInvalidValue, "cuBLASLt matmul: bias batch stride ",
                   mm.bias_batch_stride);
    // One bias per row of D (m entries), per batch `bias_batch_stride` elements apart.
    HIBER_ASSIGN_OR_RETURN(uint64_t bias_size,
                           library_ops::blas::element_bytes(p.bias_type, "bias"));
    HIBER_ASSIGN_OR_RETURN(uint64_t bias_bytes,
                           library_ops::blas::batched_extent(
                               {dims.m, 1, std::max<int64_t>(1, dims.m), bias_size, "bias"},
                               dims.batch_count, mm.bias_batch_stride));
    access.operands.push_back({mm.bias, bias_bytes, false, "bias"});
  }
  return access;
}

Status check_lt_heuristic(const LtHeuristic& h) {
  if (h.requested < 1 || h.requested > library_ops::blas::kMaxLtHeuristicResults)
    return error(ErrorCode::kInvalidValue, "cuBLASLt heuristic: ", h.requested,
                 " algorithms requested (1 to ", library_ops::blas::kMaxLtHeuristicResults, ")");
  if ((h.reduction_scheme_mask & ~library_ops::blas::kLtReductionSchemeAll) != 0)
    return error(ErrorCode::kInvalidValue, "cuBLASLt heuristic: reduction scheme mask ",
                 h.reduction_scheme_mask, " has bits outside CUBLASLT_REDUCTION_SCHEME_MASK");
  for (uint32_t alignment : h.min_alignment) {
    if (alignment > library_ops::blas::kMaxLtAlignment)
      return error(ErrorCode::kInvalidValue, "cuBLASLt heuristic: a minimum alignment of ",
                   alignment, " bytes (at most ", library_ops::blas::kMaxLtAlignment, ")");
  }
  return library_ops::blas::check_lt_problem(h.problem).status();
}

}  // namespace

Result<LibraryAccess> check_blas_call(library_ops::LibraryOp op, std::span<const std::byte> args) {
  using library_ops::LibraryOp;
  using library_ops::OpTag;
  return library_ops::dispatch<Result<LibraryAccess>, library_ops::Library::kBlas,
                               library_ops::Kind::kCall>(
      op, args, "hiberd",
      library_ops::Handlers{
          [](OpTag<LibraryOp::kBlasGemm>, const Gemm& g) { return check_gemm(g); },
          [](OpTag<LibraryOp::kLtMatmul>, const LtMatmul& mm) { return check_lt_matmul(mm); }});
}

Status check_blas_query(library_ops::LibraryOp op, std::span<const std::byte> args) {
  using library_ops::LibraryOp;
  using library_ops::OpTag;
  return library_ops::dispatch<Status, library_ops::Library::kBlas, library_ops::Kind::kQuery>(
      op, args, "hiberd",
      library_ops::Handlers{[](OpTag<LibraryOp::kLtHeuristic>, const LtHeuristic& h) {
        return check_lt_heuristic(h);
      }});
}

}  // namespace hiber::server
