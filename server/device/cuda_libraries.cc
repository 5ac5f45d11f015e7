// The real cuBLAS and cuDNN behind the remoted-library calls. See cuda_libraries.h.
#include "server/device/cuda_libraries.h"

#include <cublas_api.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <atomic>
#include <climits>
#include <compare>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "common/mutex.h"
#include "server/device/cuda_blaslt.h"
#include "wire/blas_ops.h"

namespace hiber::device {
namespace {

// ---- Opening a library ----

std::string one_line(const char* text) {
  std::string out = text != nullptr ? text : "dlopen failed";
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

std::string loaded_path(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

struct OpenedLibrary {
  void* handle = nullptr;
  std::string path;  // for messages
};

// `soname` through the loader's default search, then in each folder. RTLD_LOCAL: nothing in
// hiberd needs their symbols globally, and a library opened later cannot bind to them by chance.
// The libraries find their own dependencies (libcublasLt.so.13, cuDNN's sub-libraries) next to
// themselves ($ORIGIN).
Result<OpenedLibrary> open_library(const CudaLibraryOptions& options, const char* soname) {
  std::vector<std::string> tried;
  if (options.search_default_path) {
    if (void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) {
      return OpenedLibrary{handle, loaded_path(handle, soname)};
    }
    tried.push_back(str_cat("the loader's search path (", one_line(dlerror()), ")"));
  }
  for (const std::string& folder : options.folders) {
    const std::string path = folder + "/" + soname;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      tried.push_back(path + " (no such file)");
      continue;
    }
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return OpenedLibrary{handle, loaded_path(handle, path)};
    }
    tried.push_back(str_cat(path, " (", one_line(dlerror()), ")"));
  }
  std::string where;
  for (const std::string& t : tried) where += (where.empty() ? "" : "; ") + t;
  if (where.empty()) where = "nowhere: no folder configured and the default search is off";
  return error(ErrorCode::kNotSupported, soname,
               " is not available to hiberd, so its calls cannot run on this GPU server: tried ",
               where, " (install it, or name its folder with hiberd --cuda_library_path)");
}

// Resolves `name` into `*out`; kNotSupported naming the library when it lacks it (a version
// older than the headers Hiber was built with).
Status resolve(const OpenedLibrary& library, const char* name, void** out) {
  dlerror();
  *out = dlsym(library.handle, name);
  if (*out == nullptr) {
    return error(ErrorCode::kNotSupported, library.path, " has no ", name,
                 ": it is older than the headers hiberd was built with");
  }
  return Status();
}

// A library opened once, on first use, by whichever thread asks first; later calls get the same
// entry points or the same error.
template <typename Api>
class LazyLibrary {
 public:
  LazyLibrary(const CudaLibraryOptions& options, const char* soname)
      : options_(options), soname_(soname) {}

  Result<const Api*> get() {
    std::call_once(once_, [this] {
      Result<OpenedLibrary> opened = open_library(options_, soname_);
      if (!opened.ok()) {
        status_ = opened.status();
        LOG(WARNING) << status_.message();
        return;
      }
      status_ = api_.resolve_all(*opened);
      if (!status_.ok()) {
        LOG(WARNING) << status_.message();
        dlclose(opened->handle);
        return;
      }
      LOG(INFO) << soname_ << " loaded from " << opened->path;
    });
    if (!status_.ok()) return status_;
    return &api_;
  }

 private:
  const CudaLibraryOptions options_;
  const char* const soname_;
  std::once_flag once_;
  Status status_;  // written once, under once_
  Api api_;
};

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
    ErrorCode code = ErrorCode::kUnknown;
    switch (status) {
      case CUBLAS_STATUS_INVALID_VALUE: code = ErrorCode::kInvalidValue; break;
      case CUBLAS_STATUS_NOT_SUPPORTED:
      case CUBLAS_STATUS_ARCH_MISMATCH: code = ErrorCode::kNotSupported; break;
      case CUBLAS_STATUS_ALLOC_FAILED: code = ErrorCode::kOutOfMemory; break;
      case CUBLAS_STATUS_NOT_INITIALIZED: code = ErrorCode::kNotInitialized; break;
      case CUBLAS_STATUS_EXECUTION_FAILED: code = ErrorCode::kLaunchFailed; break;
      default: break;
    }
    const char* name = pfn_cublasGetStatusName(status);
    const char* text = pfn_cublasGetStatusString(status);
    return error(code, call, ": ", name != nullptr ? name : "cuBLAS status ",
                 name != nullptr ? "" : std::to_string(static_cast<int>(status)), " (",
                 text != nullptr ? text : "", ")");
  }
};

// ---- cuDNN entry points ----

// clang-format off
#define HIBER_CUDNN_ENTRY_POINTS(X)                           \
  X(cudnnGetVersion, decltype(&cudnnGetVersion))              \
  X(cudnnGetErrorString, decltype(&cudnnGetErrorString))      \
  X(cudnnCreate, decltype(&cudnnCreate))                      \
  X(cudnnDestroy, decltype(&cudnnDestroy))                    \
  X(cudnnSetStream, decltype(&cudnnSetStream))
// clang-format on

struct CudnnApi {
#define HIBER_MEMBER_(name, type) type pfn_##name = nullptr;
  HIBER_CUDNN_ENTRY_POINTS(HIBER_MEMBER_)
#undef HIBER_MEMBER_

  Status resolve_all(const OpenedLibrary& library) {
#define HIBER_RESOLVE_(name, type) \
  HIBER_RETURN_IF_ERROR(resolve(library, #name, reinterpret_cast<void**>(&pfn_##name)));
    HIBER_CUDNN_ENTRY_POINTS(HIBER_RESOLVE_)
#undef HIBER_RESOLVE_
    // cuDNN's major version is its ABI: a libcudnn.so.9 of another minor release is fine, but say
    // which one serves, since engines and numerics differ between releases.
    LOG(INFO) << "cuDNN " << pfn_cudnnGetVersion() << " (hiberd built with " << CUDNN_VERSION
              << ")";
    return Status();
  }

  Status check(cudnnStatus_t status, std::string_view call) const {
    if (status == CUDNN_STATUS_SUCCESS) return Status();
    ErrorCode code = ErrorCode::kUnknown;
    if (status == CUDNN_STATUS_BAD_PARAM || (status / 1000) == CUDNN_STATUS_BAD_PARAM / 1000) {
      code = ErrorCode::kInvalidValue;
    } else if ((status / 1000) == CUDNN_STATUS_NOT_SUPPORTED / 1000) {
      code = ErrorCode::kNotSupported;
    } else if (status == CUDNN_STATUS_ALLOC_FAILED) {
      code = ErrorCode::kOutOfMemory;
    }
    const char* text = pfn_cudnnGetErrorString(status);
    return error(code, call, ": ", text != nullptr ? text : "cuDNN status ",
                 text != nullptr ? "" : std::to_string(static_cast<int>(status)));
  }
};

// ---- Real handles per (owner, client handle, GPU) ----

struct HandleKey {
  uint64_t owner = 0;
  uint64_t handle = 0;
  int gpu = 0;
  friend auto operator<=>(const HandleKey&, const HandleKey&) = default;
};

// Traits: Raw (the library's handle type), Settings (what was last applied to it), and
// create/destroy through the Api.
template <typename Api, typename Traits>
class HandleTable {
 public:
  struct Entry {
    Mutex mutex;  // one thread uses the real handle at a time
    typename Traits::Raw raw GUARDED_BY(mutex) = nullptr;
    typename Traits::Settings settings GUARDED_BY(mutex);
  };

  explicit HandleTable(const CudaContexts& contexts) : contexts_(contexts) {}
  ~HandleTable() {
    release_if([](const HandleKey&) { return true; });
  }

  // The entry for `key`, creating the real handle if there is none yet. The GPU's context must
  // be current on this thread (the caller made it so through use_stream).
  Result<std::shared_ptr<Entry>> get(const Api& api, const HandleKey& key) {
    {
      MutexLock lock(mutex_);
      if (auto it = entries_.find(key); it != entries_.end()) return it->second;
    }
    // Created outside the table's lock: creating a handle takes milliseconds (it allocates on
    // the GPU), and other sessions' calls must not wait for it.
    typename Traits::Raw raw = nullptr;
    HIBER_RETURN_IF_ERROR(Traits::create(api, &raw).with_context(
        str_cat("a handle on GPU ", key.gpu, " for session ", key.owner)));
    auto entry = std::make_shared<Entry>();
    {
      MutexLock entry_lock(entry->mutex);
      entry->raw = raw;
    }
    MutexLock lock(mutex_);
    auto [it, inserted] = entries_.emplace(key, entry);
    if (!inserted) {
      // Another thread of the same owner won (sessions are single-threaded, so this is rare):
      // keep theirs.
      Status destroyed = Traits::destroy(api, raw);
      LOG_IF(WARNING, !destroyed.ok()) << destroyed;
    }
    return it->second;
  }

  // Destroys the real handles whose key matches, each with its GPU's context current.
  template <typename Match>
  void release_if(Match&& match) {
    std::vector<std::pair<HandleKey, std::shared_ptr<Entry>>> gone;
    {
      MutexLock lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (match(it->first)) {
          gone.emplace_back(it->first, std::move(it->second));
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (gone.empty()) return;
    const Api* api = api_for_release_;
    for (auto& [key, entry] : gone) {
      MutexLock lock(entry->mutex);
      if (entry->raw == nullptr || api == nullptr) continue;
      Status status = contexts_.use_gpu(key.gpu);
      if (status.ok()) status = Traits::destroy(*api, entry->raw);
      LOG_IF(WARNING, !status.ok()) << "destroying the " << Traits::kName << " handle of session "
                                    << key.owner << " on GPU " << key.gpu << ": " << status;
      entry->raw = nullptr;
    }
  }

  // Set once the library is loaded: release needs it, and nothing exists to release before.
  void set_api(const Api* api) { api_for_release_ = api; }

 private:
  const CudaContexts& contexts_;
  std::atomic<const Api*> api_for_release_{nullptr};
  Mutex mutex_;
  std::map<HandleKey, std::shared_ptr<Entry>> entries_ GUARDED_BY(mutex_);
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
        cublas_(options, "libcublas.so.13"),
        handles_(contexts),
        lt_(make_cuda_blaslt_backend(
            contexts, [options](const char* soname) { return open_for_lt(options, soname); })) {}

  // Both libraries: the real libcublas.so.13 cannot load without libcublasLt.so.13 anyway.
  Status check_available() override {
    Result<const CublasApi*> api = cublas_.get();
    if (!api.ok()) return api.status();
    handles_.set_api(*api);
    return lt_->check_available();
  }

  Status run(Stream stream, const LibraryCall& call) override {
    if (call.op == wire::LibraryOp::kLtMatmul) return lt_->run(stream, call);  // cuda_blaslt.cc
    HIBER_ASSIGN_OR_RETURN(const CublasApi* api, cublas_.get());
    handles_.set_api(api);
    switch (call.op) {
      case wire::LibraryOp::kBlasGemm: {
        HIBER_ASSIGN_OR_RETURN(auto g, wire::read_op<wire::blas::Gemm>(call.args, "cuBLAS gemm"));
        HIBER_ASSIGN_OR_RETURN(CUstream s, contexts_.use_stream(stream));
        HIBER_ASSIGN_OR_RETURN(auto entry,
                               handles_.get(*api, {call.owner, call.handle.value(), stream.gpu}));
        MutexLock lock(entry->mutex);
        return gemm(*api, entry->raw, entry->settings, s, g);
      }
      default:
        // gemv travels as the GEMM it is (kBlasGemm); kLtMatmul went to cuda_blaslt.cc above.
        return error(ErrorCode::kNotSupported, "cuBLAS operation ", static_cast<unsigned>(call.op),
                     " is not one hiberd's CUDA backend runs");
    }
  }

  Result<std::vector<std::byte>> answer(int gpu, const LibraryCall& call) override {
    if (call.op == wire::LibraryOp::kLtHeuristic) return lt_->answer(gpu, call);
    return error(ErrorCode::kNotSupported, "cuBLAS query ", static_cast<unsigned>(call.op),
                 " is not implemented on hiberd's CUDA backend yet");
  }

  void release(uint64_t owner, std::optional<wire::LibraryHandle> handle) override {
    lt_->release(owner, handle);
    handles_.release_if([&](const HandleKey& key) {
      return key.owner == owner && (!handle.has_value() || key.handle == handle->value());
    });
  }

 private:
  // Applies the call's settings to the real handle where they differ from what it has.
  static Status apply(const CublasApi& api, cublasHandle_t h, CublasTraits::Settings& now,
                      CUstream stream, const wire::blas::Gemm& g) {
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
                     CUstream stream, const wire::blas::Gemm& g) {
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
      case wire::blas::BatchKind::kSingle:
        return api.check(api.pfn_cublasGemmEx(h, ta, tb, g.m, g.n, g.k, alpha,
                                              reinterpret_cast<const void*>(g.a), at, lda,
                                              reinterpret_cast<const void*>(g.b), bt, ldb, beta,
                                              reinterpret_cast<void*>(g.c), ct, ldc, compute, algo),
                         "cublasGemmEx");
      case wire::blas::BatchKind::kStrided:
        return api.check(
            api.pfn_cublasGemmStridedBatchedEx(
                h, ta, tb, g.m, g.n, g.k, alpha, reinterpret_cast<const void*>(g.a), at, lda,
                g.stride_a, reinterpret_cast<const void*>(g.b), bt, ldb, g.stride_b, beta,
                reinterpret_cast<void*>(g.c), ct, ldc, g.stride_c, g.batch_count, compute, algo),
            "cublasGemmStridedBatchedEx");
      case wire::blas::BatchKind::kPointerArray:
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
  std::unique_ptr<LibraryBackend> lt_;  // cuBLASLt's calls (cuda_blaslt.h)
};

// ---- cuDNN ----

struct CudnnTraits {
  using Raw = cudnnHandle_t;
  static constexpr const char* kName = "cuDNN";
  struct Settings {
    CUstream stream = nullptr;
    bool stream_set = false;
  };
  static Status create(const CudnnApi& api, Raw* raw) {
    return api.check(api.pfn_cudnnCreate(raw), "cudnnCreate");
  }
  static Status destroy(const CudnnApi& api, Raw raw) {
    return api.check(api.pfn_cudnnDestroy(raw), "cudnnDestroy");
  }
};

class CudaDnnBackend final : public LibraryBackend {
 public:
  CudaDnnBackend(const CudaContexts& contexts, const CudaLibraryOptions& options)
      : cudnn_(options, "libcudnn.so.9"), handles_(contexts) {}

  Status check_available() override {
    Result<const CudnnApi*> api = cudnn_.get();
    if (!api.ok()) return api.status();
    handles_.set_api(*api);
    return Status();
  }

  Status run(Stream, const LibraryCall& call) override {
    HIBER_RETURN_IF_ERROR(check_available());
    // TODO(issue 16): the backend-API graphs and the legacy calls once wire/dnn_ops.h is on
    // main; each will take its real handle through handles_.get and cudnnSetStream first.
    return error(ErrorCode::kNotSupported, "cuDNN operation ", static_cast<unsigned>(call.op),
                 " is not implemented on hiberd's CUDA backend yet");
  }

  Result<std::vector<std::byte>> answer(int, const LibraryCall& call) override {
    HIBER_RETURN_IF_ERROR(check_available());
    return error(ErrorCode::kNotSupported, "cuDNN query ", static_cast<unsigned>(call.op),
                 " is not implemented on hiberd's CUDA backend yet");
  }

  void release(uint64_t owner, std::optional<wire::LibraryHandle> handle) override {
    handles_.release_if([&](const HandleKey& key) {
      return key.owner == owner && (!handle.has_value() || key.handle == handle->value());
    });
  }

 private:
  LazyLibrary<CudnnApi> cudnn_;
  HandleTable<CudnnApi, CudnnTraits> handles_;
};

}  // namespace

std::unique_ptr<LibraryBackend> make_cuda_blas_backend(const CudaContexts& contexts,
                                                       const CudaLibraryOptions& options) {
  return std::make_unique<CudaBlasBackend>(contexts, options);
}

std::unique_ptr<LibraryBackend> make_cuda_dnn_backend(const CudaContexts& contexts,
                                                      const CudaLibraryOptions& options) {
  return std::make_unique<CudaDnnBackend>(contexts, options);
}

}  // namespace hiber::device
