// The real cuBLAS behind the remoted-library calls (cuDNN: cuda_dnn.cc). See cuda_libraries.h.
#include "server/device/cuda_libraries.h"

#include <cublas_api.h>

#include <climits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "common/cuda_abi.h"
#include "common/mutex.h"
#include "library_ops/blas_ops.h"
#include "server/device/cuda_blaslt.h"
#include "server/device/cuda_library_support.h"

namespace hiber::device {
namespace {

using cuda_lib::HandleKey;
using cuda_lib::HandleTable;
using cuda_lib::LazyLibrary;
using cuda_lib::open_library;
using cuda_lib::OpenedLibrary;
using cuda_lib::resolve;

// ---- cuBLAS entry points ----

// GemmEx and its batched forms have C++ overloads in cublas_api.h (taking a cudaDataType compute
// type, for old code), so their types are written out; the static_casts below pick the overload
// with exactly this signature, and fail to compile if the header's prototype differs.
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedExFn = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
    void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);
using GemmBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                           int, int, int, const void*, const void* const[],
                                           cudaDataType, int, const void* const[], cudaDataType,
                                           int, const void*, void* const[], cudaDataType, int, int,
                                           cublasComputeType_t, cublasGemmAlgo_t);

// (name, type): one row per entry point used, resolved by name into pfn_<name>; the type is
// decltype of the header's declaration where it has no overloads, so a prototype that changes
// fails to compile here rather than at run time.
// clang-format off
#define HIBER_CUBLAS_ENTRY_POINTS(X)                                \
  X(cublasGetStatusName, decltype(&cublasGetStatusName))            \
  X(cublasGetStatusString, decltype(&cublasGetStatusString))        \
  X(cublasCreate_v2, decltype(&cublasCreate_v2))                    \
  X(cublasDestroy_v2, decltype(&cublasDestroy_v2))                  \
  X(cublasSetStream_v2, decltype(&cublasSetStream_v2))              \
  X(cublasSetWorkspace_v2, decltype(&cublasSetWorkspace_v2))        \
  X(cublasSetPointerMode_v2, decltype(&cublasSetPointerMode_v2))    \
  X(cublasSetMathMode, decltype(&cublasSetMathMode))                \
  X(cublasSetAtomicsMode, decltype(&cublasSetAtomicsMode))          \
  X(cublasGemmEx, decltype(static_cast<GemmExFn>(&cublasGemmEx)))   \
  X(cublasGemmStridedBatchedEx,                                     \
    decltype(static_cast<GemmStridedBatchedExFn>(&cublasGemmStridedBatchedEx))) \
  X(cublasGemmBatchedEx, decltype(static_cast<GemmBatchedExFn>(&cublasGemmBatchedEx)))
// clang-format on

struct CublasApi {
#define HIBER_MEMBER_(name, type) type pfn_##name = nullptr;
  HIBER_CUBLAS_ENTRY_POINTS(HIBER_MEMBER_)
#undef HIBER_MEMBER_

  Status resolve_all(const OpenedLibrary& library) {
#define HIBER_RESOLVE_(name, type) \
  HIBER_RETURN_IF_ERROR(resolve(library, #name, reinterpret_cast<void**>(&pfn_##name)));
    HIBER_CUBLAS_ENTRY_POINTS(HIBER_RESOLVE_)
#undef HIBER_RESOLVE_
    return Status();
  }

  // "cublasGemmEx: CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)",
  // with the code the client turns back into the same cublasStatus_t.
  Status check(cublasStatus_t status, std::string_view call) const {
    if (status == CUBLAS_STATUS_SUCCESS) return Status();
    return cuda_lib::cublas_status(status, call, pfn_cublasGetStatusName(status),
                                   pfn_cublasGetStatusString(status));
  }
};

// ---- cuBLAS ----

struct CublasTraits {
  using Raw = cublasHandle_t;
  static constexpr const char* kName = "cuBLAS";
  // What the real handle has now; -1 / null: not set by us yet (the first call sets everything).
  struct Settings {
    CUstream stream = nullptr;
    bool stream_set = false;
    uint64_t workspace = 0, workspace_bytes = 0;
    int math_mode = -1, atomics_mode = -1, pointer_mode = -1;
  };
  static Status create(const CublasApi& api, Raw* raw) {
    return api.check(api.pfn_cublasCreate_v2(raw), "cublasCreate");
  }
  // cublasDestroy synchronises the device first, so work enqueued with the handle finishes
  // before its resources are freed.
  static Status destroy(const CublasApi& api, Raw raw) {
    return api.check(api.pfn_cublasDestroy_v2(raw), "cublasDestroy");
  }
};

// A 64-bit leading dimension as cuBLAS's int: the 32-bit API is what every client we serve uses
// (the _64 forms are not remoted).
Result<int> as_int(int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX) {
    return error(ErrorCode::kNotSupported, "cuBLAS gemm: ", what, " ", value,
                 " needs the 64-bit API (cublasGemmEx_64), which Hiber does not remote");
  }
  return static_cast<int>(value);
}

// cuda_blaslt.cc opens libcublasLt.so.13 with the same search as the other libraries.
Result<std::pair<void*, std::string>> open_for_lt(const CudaLibraryOptions& options,
                                                  const char* soname) {
  HIBER_ASSIGN_OR_RETURN(OpenedLibrary opened, open_library(options, soname));
  return std::pair<void*, std::string>(opened.handle, opened.path);
}

class CudaBlasBackend final : public LibraryBackend {
 public:
  CudaBlasBackend(const CudaContexts& contexts, const CudaLibraryOptions& options)
      : contexts_(contexts),
        cublas_(options, cuda_abi::kCublasSoname),
        handles_(contexts),
        lt_(make_cuda_blaslt(
            contexts, [options](const char* soname) { return open_for_lt(options, soname); })) {}

  // Both libraries: the real libcublas.so.13 cannot load without libcublasLt.so.13 anyway.
  Status check_available() override {
    Result<const CublasApi*> api = cublas_.get();
    if (!api.ok()) return api.status();
    handles_.set_api(*api);
    return lt_->check_available();
  }

  Status run(Stream stream, const LibraryCall& call) override {
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    return library_ops::dispatch<Status, library_ops::Library::kBlas, library_ops::Kind::kCall>(
        call.op, call.args, "hiberd's CUDA backend",
        library_ops::Handlers{
            [&](OpTag<LibraryOp::kBlasGemm>, const library_ops::blas::Gemm& g) -> Status {
              HIBER_ASSIGN_OR_RETURN(const CublasApi* api, cublas_.get());
              handles_.set_api(api);
              HIBER_ASSIGN_OR_RETURN(CUstream s, contexts_.use_stream(stream));
              HIBER_ASSIGN_OR_RETURN(
                  auto entry, handles_.get(*api, cuda_lib::handle_key(
                                                     call.owner, call.handle.value(), stream)));
              MutexLock lock(entry->mutex);
              return gemm(*api, entry->raw, entry->settings, s, g);
            },
            [&](OpTag<LibraryOp::kLtMatmul>, const library_ops::blas::LtMatmul& mm) {
              return lt_->run(stream, call, mm);  // cuda_blaslt.cc
            }});
  }

  Result<std::vector<std::byte>> answer(Context context, const LibraryCall& call) override {
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    return library_ops::dispatch<Result<std::vector<std::byte>>, library_ops::Library::kBlas,
                                 library_ops::Kind::kQuery>(
        call.op, call.args, "hiberd's CUDA backend",
        library_ops::Handlers{
            [&](OpTag<LibraryOp::kLtHeuristic>, const library_ops::blas::LtHeuristic& h) {
              return lt_->answer(context, call, h);  // cuda_blaslt.cc
            }});
  }

  void release(uint64_t owner, std::optional<library_ops::LibraryHandle> handle) override {
    lt_->release(owner, handle);
    handles_.release_if([&](const HandleKey& key) {
      return key.owner == owner && (!handle.has_value() || key.handle == handle->value());
    });
  }
  void forget_context(Context context) override {
    lt_->forget_context(context);
    handles_.forget_if([&](const HandleKey& key) { return key.context == context; });
  }

 private:
  // Applies the call's settings to the real handle where they differ from what it has.
  static Status apply(const CublasApi& api, cublasHandle_t h, CublasTraits::Settings& now,
                      CUstream stream, const library_ops::blas::Gemm& g) {
    // cublasSetStream also puts the handle back on cuBLAS's own workspace pool, which is also
    // how a call with no workspace of the client's (workspace_bytes 0) gets cuBLAS's own.
    const bool back_to_own_workspace = g.workspace_bytes == 0 && now.workspace_bytes != 0;
    if (!now.stream_set || now.stream != stream || back_to_own_workspace) {
      HIBER_RETURN_IF_ERROR(api.check(api.pfn_cublasSetStream_v2(h, stream), "cublasSetStream"));
      now.stream = stream;
      now.stream_set = true;
      now.workspace = 0;
      now.workspace_bytes = 0;
    }
    if (g.workspace_bytes != 0 &&
        (g.workspace != now.workspace || g.workspace_bytes != now.workspace_bytes)) {
      HIBER_RETURN_IF_ERROR(
          api.check(api.pfn_cublasSetWorkspace_v2(h, reinterpret_cast<void*>(g.workspace),
                                                  static_cast<size_t>(g.workspace_bytes)),
                    "cublasSetWorkspace"));
      now.workspace = g.workspace;
      now.workspace_bytes = g.workspace_bytes;
    }
    if (now.math_mode != g.math_mode) {
      HIBER_RETURN_IF_ERROR(
          api.check(api.pfn_cublasSetMathMode(h, static_cast<cublasMath_t>(g.math_mode)),
                    "cublasSetMathMode"));
      now.math_mode = g.math_mode;
    }
    if (now.atomics_mode != g.atomics_mode) {
      HIBER_RETURN_IF_ERROR(api.check(
          api.pfn_cublasSetAtomicsMode(h, static_cast<cublasAtomicsMode_t>(g.atomics_mode)),
          "cublasSetAtomicsMode"));
      now.atomics_mode = g.atomics_mode;
    }
    if (now.pointer_mode != g.pointer_mode) {
      HIBER_RETURN_IF_ERROR(api.check(
          api.pfn_cublasSetPointerMode_v2(
              h, g.pointer_mode == 1 ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST),
          "cublasSetPointerMode"));
      now.pointer_mode = g.pointer_mode;
    }
    return Status();
  }

  static Status gemm(const CublasApi& api, cublasHandle_t h, CublasTraits::Settings& now,
                     CUstream stream, const library_ops::blas::Gemm& g) {
    HIBER_ASSIGN_OR_RETURN(int lda, as_int(g.lda, "lda"));
    HIBER_ASSIGN_OR_RETURN(int ldb, as_int(g.ldb, "ldb"));
    HIBER_ASSIGN_OR_RETURN(int ldc, as_int(g.ldc, "ldc"));
    HIBER_RETURN_IF_ERROR(apply(api, h, now, stream, g));
    // Host pointer mode: the scalars' bytes, which cuBLAS reads before the call returns (the
    // struct outlives the call). Device pointer mode: their addresses, read when the GEMM runs.
    const bool device_scalars = g.pointer_mode == 1;
    const void* alpha = device_scalars ? reinterpret_cast<const void*>(g.alpha_ptr)
                                       : static_cast<const void*>(g.alpha.bytes);
    const void* beta = device_scalars ? reinterpret_cast<const void*>(g.beta_ptr)
                                      : static_cast<const void*>(g.beta.bytes);
    const auto ta = static_cast<cublasOperation_t>(g.transa);
    const auto tb = static_cast<cublasOperation_t>(g.transb);
    const auto at = static_cast<cudaDataType>(g.a_type);
    const auto bt = static_cast<cudaDataType>(g.b_type);
    const auto ct = static_cast<cudaDataType>(g.c_type);
    const auto compute = static_cast<cublasComputeType_t>(g.compute_type);
    const auto algo = static_cast<cublasGemmAlgo_t>(g.algo);
    switch (g.batch) {
      case library_ops::blas::BatchKind::kSingle:
        return api.check(api.pfn_cublasGemmEx(h, ta, tb, g.m, g.n, g.k, alpha,
                                              reinterpret_cast<const void*>(g.a), at, lda,
                                              reinterpret_cast<const void*>(g.b), bt, ldb, beta,
                                              reinterpret_cast<void*>(g.c), ct, ldc, compute, algo),
                         "cublasGemmEx");
      case library_ops::blas::BatchKind::kStrided:
        return api.check(
            api.pfn_cublasGemmStridedBatchedEx(
                h, ta, tb, g.m, g.n, g.k, alpha, reinterpret_cast<const void*>(g.a), at, lda,
                g.stride_a, reinterpret_cast<const void*>(g.b), bt, ldb, g.stride_b, beta,
                reinterpret_cast<void*>(g.c), ct, ldc, g.stride_c, g.batch_count, compute, algo),
            "cublasGemmStridedBatchedEx");
      case library_ops::blas::BatchKind::kPointerArray:
        // a, b and c are device arrays of batch_count device pointers (the session has waited
        // for the whole model, since it cannot see which blocks they point into).
        return api.check(
            api.pfn_cublasGemmBatchedEx(
                h, ta, tb, g.m, g.n, g.k, alpha, reinterpret_cast<const void* const*>(g.a), at, lda,
                reinterpret_cast<const void* const*>(g.b), bt, ldb, beta,
                reinterpret_cast<void* const*>(g.c), ct, ldc, g.batch_count, compute, algo),
            "cublasGemmBatchedEx");
    }
    return error(ErrorCode::kInvalidValue, "cuBLAS gemm: batch kind ",
                 static_cast<unsigned>(g.batch));
  }

  const CudaContexts& contexts_;
  LazyLibrary<CublasApi> cublas_;
  HandleTable<CublasApi, CublasTraits> handles_;
  std::unique_ptr<CudaBlasLt> lt_;  // cuBLASLt's calls (cuda_blaslt.h)
};

}  // namespace

std::unique_ptr<LibraryBackend> make_cuda_blas_backend(const CudaContexts& contexts,
                                                       const CudaLibraryOptions& options) {
  return std::make_unique<CudaBlasBackend>(contexts, options);
}

}  // namespace hiber::device
