// The real cuBLASLt behind kLtHeuristic and kLtMatmul. See cuda_blaslt.h.
#include "server/device/cuda_blaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <array>
#include <bit>
#include <compare>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "common/cuda_abi.h"
#include "common/mutex.h"
#include "library_ops/blas_ops.h"
#include "server/device/cuda_library_support.h"

namespace hiber::device {
namespace {

using library_ops::blas::LtAlgo;
using library_ops::blas::LtHeuristic;
using library_ops::blas::LtHeuristicResult;
using library_ops::blas::LtLayout;
using library_ops::blas::LtMatmul;
using library_ops::blas::LtProblem;

// ---- Entry points ----

// (name): one row per entry point used, resolved by name into pfn_<name>, typed by decltype of
// cublasLt.h's declaration (none has overloads), so a prototype that changes fails to compile.
// clang-format off
#define HIBER_CUBLASLT_ENTRY_POINTS(X)        \
  X(cublasLtGetVersion)                       \
  X(cublasLtGetStatusName)                    \
  X(cublasLtGetStatusString)                  \
  X(cublasLtCreate)                           \
  X(cublasLtDestroy)                          \
  X(cublasLtMatmulDescCreate)                 \
  X(cublasLtMatmulDescDestroy)                \
  X(cublasLtMatmulDescSetAttribute)           \
  X(cublasLtMatrixLayoutCreate)               \
  X(cublasLtMatrixLayoutDestroy)              \
  X(cublasLtMatrixLayoutSetAttribute)         \
  X(cublasLtMatmulPreferenceCreate)           \
  X(cublasLtMatmulPreferenceDestroy)          \
  X(cublasLtMatmulPreferenceSetAttribute)     \
  X(cublasLtMatmulAlgoGetHeuristic)           \
  X(cublasLtMatmulAlgoConfigGetAttribute)     \
  X(cublasLtMatmul)
// clang-format on

struct LtApi {
#define HIBER_MEMBER_(name) decltype(&name) pfn_##name = nullptr;
  HIBER_CUBLASLT_ENTRY_POINTS(HIBER_MEMBER_)
#undef HIBER_MEMBER_

  Status resolve_all(void* library, const std::string& path) {
#define HIBER_RESOLVE_(name)                                                  \
  pfn_##name = reinterpret_cast<decltype(pfn_##name)>(dlsym(library, #name)); \
  if (pfn_##name == nullptr)                                                  \
    return error(ErrorCode::kNotSupported, path, " has no ", #name,           \
                 ": it is older than the headers hiberd was built with");
    HIBER_CUBLASLT_ENTRY_POINTS(HIBER_RESOLVE_)
#undef HIBER_RESOLVE_
    // One major version is one ABI; the minor release decides the algorithms offered, so say it.
    LOG(INFO) << "cuBLASLt " << pfn_cublasLtGetVersion() << " (hiberd built with " << CUBLAS_VERSION
              << ")";
    return Status();
  }

  // "cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED (...)", with the code the client turns back
  // into the same cublasStatus_t (client_shim/cublaslt_api.cc: status_of).
  Status check(cublasStatus_t status, std::string_view call) const {
    if (status == CUBLAS_STATUS_SUCCESS) return Status();
    return cuda_lib::cublas_status(status, call, pfn_cublasLtGetStatusName(status),
                                   pfn_cublasLtGetStatusString(status));
  }
};

// libcublasLt.so.13, opened once by whichever thread asks first; later calls get the same entry
// points or the same error. Never closed once opened (the library keeps per-context state).
class LazyLt {
 public:
  explicit LazyLt(OpenCudaLibrary open) : open_(std::move(open)) {}

  Result<const LtApi*> get() {
    std::call_once(once_, [this] {
      auto opened = open_(kSoname);
      if (!opened.ok()) {
        status_ = opened.status();
        LOG(WARNING) << status_.message();
        return;
      }
      status_ = api_.resolve_all(opened->first, opened->second);
      if (!status_.ok()) {
        LOG(WARNING) << status_.message();
        dlclose(opened->first);
        return;
      }
      LOG(INFO) << kSoname << " loaded from " << opened->second;
    });
    if (!status_.ok()) return status_;
    return &api_;
  }

  // The entry points if the library is loaded, for release (nothing exists to release before).
  const LtApi* loaded() const { return loaded_.load(); }
  void mark_loaded() { loaded_ = &api_; }

 private:
  static constexpr const char* kSoname = cuda_abi::kCublasLtSoname;
  OpenCudaLibrary open_;
  std::once_flag once_;
  Status status_;  // written once, under once_
  LtApi api_;
  std::atomic<const LtApi*> loaded_{nullptr};
};

// ---- Descriptors built from an LtProblem ----

template <typename T>
Status set_desc(const LtApi& api, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                T value, const char* what) {
  return api
      .check(api.pfn_cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value),
             "cublasLtMatmulDescSetAttribute")
      .with_context(what);
}

template <typename T>
Status set_layout(const LtApi& api, cublasLtMatrixLayout_t layout,
                  cublasLtMatrixLayoutAttribute_t attr, T value, const char* what) {
  return api
      .check(api.pfn_cublasLtMatrixLayoutSetAttribute(layout, attr, &value, sizeof value),
             "cublasLtMatrixLayoutSetAttribute")
      .with_context(what);
}

// The real descriptors of one problem. Each attribute is set with the type cublasLt.h documents
// for it (int32_t, uint32_t for the epilogue, int64_t for strides, a pointer for the bias).
struct Descriptors {
  LtProblem problem;  // what they describe (hashes can collide: compared in full)
  cublasLtMatmulDesc_t desc = nullptr;
  std::array<cublasLtMatrixLayout_t, 4> layouts{};  // A, B, C, D
  // The per-call attributes as last set (a warm call on the same bias sets nothing).
  uint64_t bias = 0;
  int64_t bias_batch_stride = 0;

  void destroy(const LtApi& api) {
    if (desc != nullptr) api.pfn_cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t& l : layouts) {
      if (l != nullptr) api.pfn_cublasLtMatrixLayoutDestroy(l);
      l = nullptr;
    }
    desc = nullptr;
  }
};

Status make_layout(const LtApi& api, const LtLayout& l, const char* what,
                   cublasLtMatrixLayout_t* out) {
  HIBER_RETURN_IF_ERROR(
      api.check(api.pfn_cublasLtMatrixLayoutCreate(out, static_cast<cudaDataType>(l.type),
                                                   static_cast<uint64_t>(l.rows),
                                                   static_cast<uint64_t>(l.cols), l.ld),
                "cublasLtMatrixLayoutCreate")
          .with_context(what));
  HIBER_RETURN_IF_ERROR(
      set_layout(api, *out, CUBLASLT_MATRIX_LAYOUT_ORDER, int32_t{l.order}, what));
  HIBER_RETURN_IF_ERROR(
      set_layout(api, *out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t{l.batch_count}, what));
  return set_layout(api, *out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t{l.batch_offset},
                    what);
}

Status build(const LtApi& api, const LtProblem& p, Descriptors* d) {
  d->problem = p;
  HIBER_RETURN_IF_ERROR(api.check(
      api.pfn_cublasLtMatmulDescCreate(&d->desc, static_cast<cublasComputeType_t>(p.compute_type),
                                       static_cast<cudaDataType>(p.scale_type)),
      "cublasLtMatmulDescCreate"));
  HIBER_RETURN_IF_ERROR(set_desc(api, d->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE,
                                 int32_t{p.pointer_mode}, "pointer mode"));
  HIBER_RETURN_IF_ERROR(
      set_desc(api, d->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{p.transa}, "transa"));
  HIBER_RETURN_IF_ERROR(
      set_desc(api, d->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t{p.transb}, "transb"));
  // TRANSC stays at its default, N: the only value cuBLASLt takes (check_lt_problem).
  HIBER_RETURN_IF_ERROR(set_desc(api, d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                 static_cast<uint32_t>(p.epilogue), "epilogue"));
  if (p.epilogue & library_ops::blas::kEpilogueBias) {
    // The client resolved the default (-1) to D's type, which is what the library would use.
    HIBER_RETURN_IF_ERROR(set_desc(api, d->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                   int32_t{p.bias_type}, "bias data type"));
  }
  const LtLayout* layouts[] = {&p.a, &p.b, &p.c, &p.d};
  const char* names[] = {"layout of A", "layout of B", "layout of C", "layout of D"};
  for (int i = 0; i < 4; ++i)
    HIBER_RETURN_IF_ERROR(make_layout(api, *layouts[i], names[i], &d->layouts[i]));
  return Status();
}

// ---- Algorithms kept in hiberd ----

// What a heuristic's result is kept under, and what the client's LtAlgo::backend carries:
// backend[0] = kTag << 32 | result index, [1] = GPU model hash, [2] = the workspace preference,
// [3] = the results requested, [4] = the four minimum alignments, 16 bits each (A lowest),
// [5] = the reduction scheme mask; LtAlgo::problem is the problem's hash.
struct AlgoKey {
  uint64_t problem = 0;
  uint64_t model = 0;
  uint64_t max_workspace = 0;
  uint64_t alignments = 0;
  uint64_t reduction_mask = library_ops::blas::kLtReductionSchemeAll;
  int32_t requested = 0;
  int32_t index = 0;
  friend auto operator<=>(const AlgoKey&, const AlgoKey&) = default;
};
constexpr uint64_t kTag = 0x43554c54;  // "CULT": made by the CUDA backend

void put_key(const AlgoKey& key, LtAlgo* algo) {
  algo->problem = key.problem;
  algo->backend[0] = kTag << 32 | static_cast<uint32_t>(key.index);
  algo->backend[1] = key.model;
  algo->backend[2] = key.max_workspace;
  algo->backend[3] = static_cast<uint64_t>(key.requested);
  algo->backend[4] = key.alignments;
  algo->backend[5] = key.reduction_mask;
}

// The minimum alignments of a heuristic query, packed as AlgoKey keeps them (each at most
// kMaxLtAlignment, checked by the session).
uint64_t pack_alignments(const uint32_t (&alignments)[4]) {
  uint64_t packed = 0;
  for (int i = 0; i < 4; ++i) packed |= uint64_t{alignments[i] & 0xffffu} << (16 * i);
  return packed;
}
uint32_t alignment_of(uint64_t packed, int operand) {
  return static_cast<uint32_t>((packed >> (16 * operand)) & 0xffffu);
}

Result<AlgoKey> get_key(const LtAlgo& algo) {
  AlgoKey key;
  key.problem = algo.problem;
  key.index = static_cast<int32_t>(algo.backend[0] & 0xffffffffu);
  key.model = algo.backend[1];
  key.max_workspace = algo.backend[2];
  key.requested = static_cast<int32_t>(algo.backend[3]);
  key.alignments = algo.backend[4];
  key.reduction_mask = algo.backend[5];
  if ((algo.backend[0] >> 32) != kTag || algo.backend[3] < 1 ||
      algo.backend[3] > library_ops::blas::kMaxLtHeuristicResults || key.index < 0 ||
      key.index >= key.requested ||
      (algo.backend[5] & ~uint64_t{library_ops::blas::kLtReductionSchemeAll}) != 0)
    return error(ErrorCode::kInvalidValue,
                 "cuBLASLt matmul: the algo was not returned by this GPU server's "
                 "cublasLtMatmulAlgoGetHeuristic (a simulated GPU's, or altered)");
  return key;
}

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// ---- Real handles and descriptors per (owner, client handle, GPU and context) ----

struct LtKey {
  uint64_t owner = 0;
  uint64_t handle = 0;
  Context context;  // where the real handle was made, and must be used and destroyed
  friend auto operator<=>(const LtKey&, const LtKey&) = default;
};

struct LtEntry {
  Mutex mutex;  // one thread uses the real handle and its descriptors at a time
  cublasLtHandle_t raw GUARDED_BY(mutex) = nullptr;
  // By problem hash. Bounded: a client of ever new shapes starts over (descriptors are cheap).
  std::map<uint64_t, Descriptors> descriptors GUARDED_BY(mutex);
  cublasLtMatmulPreference_t preference GUARDED_BY(mutex) = nullptr;
  uint64_t preference_workspace GUARDED_BY(mutex) = 0;
  std::optional<uint64_t> preference_alignments GUARDED_BY(mutex);      // packed; unset: defaults
  std::optional<uint64_t> preference_reduction_mask GUARDED_BY(mutex);  // unset: the default
};
constexpr size_t kMaxDescriptorsPerHandle = 256;
// Kept algorithms over all sessions; beyond it they start over (a miss re-runs the heuristic).
constexpr size_t kMaxKeptAlgos = 1 << 16;

class CudaBlasLtBackend final : public CudaBlasLt {
 public:
  CudaBlasLtBackend(const CudaContexts& contexts, OpenCudaLibrary open)
      : contexts_(contexts), lt_(std::move(open)) {}
  ~CudaBlasLtBackend() override {
    release_if([](const LtKey&) { return true; });
  }

  Status check_available() override {
    HIBER_ASSIGN_OR_RETURN(const LtApi* api, lt_.get());
    (void)api;
    lt_.mark_loaded();
    return Status();
  }

  Status run(Stream stream, const LibraryCall& call, const LtMatmul& mm) override {
    HIBER_ASSIGN_OR_RETURN(const LtApi* api, lt_.get());
    lt_.mark_loaded();
    HIBER_ASSIGN_OR_RETURN(library_ops::blas::LtDims dims,
                           library_ops::blas::check_lt_problem(mm.problem));
    std::optional<AlgoKey> key;
    if (mm.has_algo) {
      HIBER_ASSIGN_OR_RETURN(key, get_key(mm.algo));
    }
    // An empty D: nothing to compute or write (the session checked no operand), as on the sim.
    if (dims.m == 0 || dims.n == 0) return Status();
    HIBER_ASSIGN_OR_RETURN(CUstream s, contexts_.use_stream(stream));
    HIBER_ASSIGN_OR_RETURN(auto entry, get_entry(*api, {call.owner, call.handle.value(),
                                                        Context{stream.context, stream.gpu}}));
    MutexLock lock(entry->mutex);
    HIBER_ASSIGN_OR_RETURN(Descriptors * d, descriptors(*api, *entry, mm.problem));
    const LtProblem& p = mm.problem;
    if ((p.epilogue & library_ops::blas::kEpilogueBias) &&
        (d->bias != mm.bias || d->bias_batch_stride != mm.bias_batch_stride)) {
      HIBER_RETURN_IF_ERROR(set_desc(*api, d->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                     reinterpret_cast<const void*>(mm.bias), "bias pointer"));
      HIBER_RETURN_IF_ERROR(set_desc(*api, d->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                     int64_t{mm.bias_batch_stride}, "bias batch stride"));
      d->bias = mm.bias;
      d->bias_batch_stride = mm.bias_batch_stride;
    }
    cublasLtMatmulAlgo_t algo;
    if (key.has_value()) {
      HIBER_ASSIGN_OR_RETURN(algo, kept_algo(*api, *entry, *d, *key, stream.gpu));
    }
    // Host pointer mode: the scalars' bytes (the struct outlives the call, and cuBLASLt reads
    // them before returning). Device pointer mode: their addresses, read when the matmul runs.
    const bool device_scalars = p.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
    const void* alpha = device_scalars ? reinterpret_cast<const void*>(mm.alpha_ptr)
                                       : static_cast<const void*>(mm.alpha.bytes);
    const void* beta = device_scalars ? reinterpret_cast<const void*>(mm.beta_ptr)
                                      : static_cast<const void*>(mm.beta.bytes);
    return api->check(
        api->pfn_cublasLtMatmul(
            entry->raw, d->desc, alpha, reinterpret_cast<const void*>(mm.a), d->layouts[0],
            reinterpret_cast<const void*>(mm.b), d->layouts[1], beta,
            reinterpret_cast<const void*>(mm.c), d->layouts[2], reinterpret_cast<void*>(mm.d),
            d->layouts[3], key.has_value() ? &algo : nullptr, reinterpret_cast<void*>(mm.workspace),
            static_cast<size_t>(mm.workspace_bytes), s),
        "cublasLtMatmul");
  }

  Result<std::vector<std::byte>> answer(Context context, const LibraryCall& call,
                                        const LtHeuristic& h) override {
    const int gpu = context.gpu;
    HIBER_ASSIGN_OR_RETURN(const LtApi* api, lt_.get());
    lt_.mark_loaded();
    HIBER_RETURN_IF_ERROR(library_ops::blas::check_lt_problem(h.problem).status());
    if (h.requested < 1 || h.requested > library_ops::blas::kMaxLtHeuristicResults)
      return error(ErrorCode::kInvalidValue, "cuBLASLt heuristic: ", h.requested,
                   " algorithms requested");
    HIBER_RETURN_IF_ERROR(contexts_.use_context(context));
    HIBER_ASSIGN_OR_RETURN(auto entry, get_entry(*api, {call.owner, call.handle.value(), context}));
    MutexLock lock(entry->mutex);
    HIBER_ASSIGN_OR_RETURN(Descriptors * d, descriptors(*api, *entry, h.problem));
    AlgoKey key;
    key.problem = library_ops::blas::lt_problem_hash(h.problem);
    key.model = model(gpu);
    key.max_workspace = h.max_workspace_bytes;
    key.alignments = pack_alignments(h.min_alignment);
    key.reduction_mask = h.reduction_scheme_mask;
    key.requested = h.requested;
    HIBER_ASSIGN_OR_RETURN(auto results, heuristic(*api, *entry, *d, key, gpu));
    std::vector<LtHeuristicResult> answer(results.size());
    for (size_t i = 0; i < results.size(); ++i) {
      int32_t id = 0;
      size_t written = 0;
      HIBER_RETURN_IF_ERROR(
          api->check(api->pfn_cublasLtMatmulAlgoConfigGetAttribute(
                         &results[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written),
                     "cublasLtMatmulAlgoConfigGetAttribute(CUBLASLT_ALGO_CONFIG_ID)"));
      key.index = static_cast<int32_t>(i);
      keep(key, results[i].algo);
      answer[i].algo.id = id;
      answer[i].algo.magic = library_ops::blas::kLtAlgoMagic;
      put_key(key, &answer[i].algo);
      answer[i].workspace_bytes = results[i].workspaceSize;
      answer[i].waves_bits = std::bit_cast<uint32_t>(results[i].wavesCount);
    }
    std::vector<std::byte> bytes(answer.size() * sizeof(LtHeuristicResult));
    if (!bytes.empty()) std::memcpy(bytes.data(), answer.data(), bytes.size());
    return bytes;
  }

  void release(uint64_t owner, std::optional<library_ops::LibraryHandle> handle) override {
    release_if([&](const LtKey& key) {
      return key.owner == owner && (!handle.has_value() || key.handle == handle->value());
    });
  }

  // The entries' handles, preferences and descriptors went with their reset context.
  void forget_context(Context context) override {
    MutexLock lock(mutex_);
    std::erase_if(entries_, [&](const auto& entry) { return entry.first.context == context; });
  }

 private:
  // The entry for `key`, creating its real handle if there is none yet. The key's context must
  // be current on this thread.
  Result<std::shared_ptr<LtEntry>> get_entry(const LtApi& api, const LtKey& key) {
    {
      MutexLock lock(mutex_);
      if (auto it = entries_.find(key); it != entries_.end()) return it->second;
    }
    // Created outside the table's lock, so other sessions' calls do not wait for it.
    cublasLtHandle_t raw = nullptr;
    HIBER_RETURN_IF_ERROR(api.check(api.pfn_cublasLtCreate(&raw), "cublasLtCreate")
                              .with_context(str_cat("a cuBLASLt handle on GPU ", key.context.gpu,
                                                    " for session ", key.owner)));
    auto entry = std::make_shared<LtEntry>();
    {
      MutexLock entry_lock(entry->mutex);
      entry->raw = raw;
    }
    MutexLock lock(mutex_);
    auto [it, inserted] = entries_.emplace(key, entry);
    if (!inserted) {
      // Another thread of the same owner won (rare: sessions are single-threaded): keep theirs.
      Status destroyed = api.check(api.pfn_cublasLtDestroy(raw), "cublasLtDestroy");
      LOG_IF(WARNING, !destroyed.ok()) << destroyed;
    }
    return it->second;
  }

  // The real descriptors of `p` on this handle, built on first use.
  static Result<Descriptors*> descriptors(const LtApi& api, LtEntry& entry, const LtProblem& p)
      REQUIRES(entry.mutex) {
    const uint64_t hash = library_ops::blas::lt_problem_hash(p);
    auto it = entry.descriptors.find(hash);
    if (it != entry.descriptors.end() && std::memcmp(&it->second.problem, &p, sizeof p) == 0)
      return &it->second;
    if (it != entry.descriptors.end()) {
      it->second.destroy(api);  // a hash collision: the newer problem takes the slot
      entry.descriptors.erase(it);
    }
    if (entry.descriptors.size() >= kMaxDescriptorsPerHandle) {
      for (auto& [h, d] : entry.descriptors) d.destroy(api);
      entry.descriptors.clear();
    }
    Descriptors d;
    Status built = build(api, p, &d);
    if (!built.ok()) {
      d.destroy(api);
      return built;
    }
    return &entry.descriptors.emplace(hash, d).first->second;
  }

  // The real cublasLtMatmulAlgoGetHeuristic for `d` under the key's preference: its results, in
  // the library's order; kNotSupported (the library's status) when it has none.
  Result<std::vector<cublasLtMatmulHeuristicResult_t>> heuristic(const LtApi& api, LtEntry& entry,
                                                                 const Descriptors& d,
                                                                 const AlgoKey& key, int gpu)
      REQUIRES(entry.mutex) {
    if (entry.preference == nullptr) {
      HIBER_RETURN_IF_ERROR(api.check(api.pfn_cublasLtMatmulPreferenceCreate(&entry.preference),
                                      "cublasLtMatmulPreferenceCreate"));
      entry.preference_workspace = 0;  // the library's default: no workspace
      entry.preference_alignments.reset();
      entry.preference_reduction_mask.reset();
    }
    if (entry.preference_workspace != key.max_workspace) {
      const uint64_t bytes = key.max_workspace;  // uint64_t, as cublasLt.h documents it
      HIBER_RETURN_IF_ERROR(api.check(
          api.pfn_cublasLtMatmulPreferenceSetAttribute(
              entry.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes),
          "cublasLtMatmulPreferenceSetAttribute(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)"));
      entry.preference_workspace = key.max_workspace;
    }
    if (entry.preference_alignments != key.alignments) {
      constexpr cublasLtMatmulPreferenceAttributes_t kAttributes[4] = {
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
      for (int i = 0; i < 4; ++i) {
        const uint32_t bytes = alignment_of(key.alignments, i);  // uint32_t, as documented
        HIBER_RETURN_IF_ERROR(
            api.check(api.pfn_cublasLtMatmulPreferenceSetAttribute(entry.preference, kAttributes[i],
                                                                   &bytes, sizeof bytes),
                      "cublasLtMatmulPreferenceSetAttribute(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT)"));
      }
      entry.preference_alignments = key.alignments;
    }
    if (entry.preference_reduction_mask != key.reduction_mask) {
      const auto mask = static_cast<uint32_t>(key.reduction_mask);  // uint32_t, as documented
      HIBER_RETURN_IF_ERROR(api.check(
          api.pfn_cublasLtMatmulPreferenceSetAttribute(
              entry.preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask),
          "cublasLtMatmulPreferenceSetAttribute(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK)"));
      entry.preference_reduction_mask = key.reduction_mask;
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(key.requested));
    int returned = 0;
    HIBER_RETURN_IF_ERROR(
        api.check(api.pfn_cublasLtMatmulAlgoGetHeuristic(
                      entry.raw, d.desc, d.layouts[0], d.layouts[1], d.layouts[2], d.layouts[3],
                      entry.preference, key.requested, results.data(), &returned),
                  "cublasLtMatmulAlgoGetHeuristic")
            .with_context(str_cat("cuBLASLt heuristic on ", contexts_.gpu_model(gpu))));
    // Only results whose state is success are valid; they come first.
    int valid = 0;
    while (valid < returned && valid < key.requested &&
           results[static_cast<size_t>(valid)].state == CUBLAS_STATUS_SUCCESS)
      ++valid;
    results.resize(static_cast<size_t>(valid));
    if (results.empty())
      return error(ErrorCode::kNotSupported,
                   "cublasLtMatmulAlgoGetHeuristic: no cuBLASLt algorithm runs this matmul on ",
                   contexts_.gpu_model(gpu));
    return results;
  }

  // The real algorithm `key` stands for on `gpu`: the one kept when the heuristic returned it,
  // else (another GPU model, hiberd restarted, evicted) the same-index result of the heuristic
  // re-run for this matmul's problem with the same preference.
  Result<cublasLtMatmulAlgo_t> kept_algo(const LtApi& api, LtEntry& entry, const Descriptors& d,
                                         AlgoKey key, int gpu) REQUIRES(entry.mutex) {
    const uint64_t chosen_on = key.model;
    key.model = model(gpu);
    if (std::optional<cublasLtMatmulAlgo_t> kept = find(key)) return *kept;
    const uint64_t problem = library_ops::blas::lt_problem_hash(d.problem);
    VLOG(1) << "cuBLASLt matmul: algo " << key.index << " of problem " << key.problem
            << (chosen_on != key.model ? " was chosen on another GPU model"
                                       : " is not kept (hiberd restarted or evicted it)")
            << "; re-running the heuristic on " << contexts_.gpu_model(gpu);
    AlgoKey rerun = key;
    rerun.problem = problem;
    auto results = heuristic(api, entry, d, rerun, gpu);
    if (!results.ok())
      return results.status().with_context(
          "cuBLASLt matmul: re-choosing an algorithm chosen for another GPU model or an earlier "
          "hiberd");
    if (static_cast<size_t>(key.index) >= results->size())
      return error(ErrorCode::kNotSupported, "cuBLASLt matmul: the algo is heuristic result ",
                   key.index, ", chosen on another GPU model or by an earlier hiberd, and ",
                   contexts_.gpu_model(gpu), " offers only ", results->size(),
                   " algorithms for this matmul; pass no algo, or ask the heuristic again");
    for (size_t i = 0; i < results->size(); ++i) {
      rerun.index = static_cast<int32_t>(i);
      keep(rerun, (*results)[i].algo);
    }
    const cublasLtMatmulAlgo_t algo = (*results)[static_cast<size_t>(key.index)].algo;
    keep(key, algo);  // under the client's key too, so the next call hits
    return algo;
  }

  void keep(const AlgoKey& key, const cublasLtMatmulAlgo_t& algo) {
    MutexLock lock(algos_mutex_);
    if (algos_.size() >= kMaxKeptAlgos) algos_.clear();
    algos_[key] = algo;
  }

  std::optional<cublasLtMatmulAlgo_t> find(const AlgoKey& key) {
    MutexLock lock(algos_mutex_);
    auto it = algos_.find(key);
    if (it == algos_.end()) return std::nullopt;
    return it->second;
  }

  // A hash of what identifies `gpu`'s model (its name, compute capability and SM count).
  uint64_t model(int gpu) {
    MutexLock lock(models_mutex_);
    auto it = models_.find(gpu);
    if (it == models_.end()) it = models_.emplace(gpu, fnv1a(contexts_.gpu_model(gpu))).first;
    return it->second;
  }

  // Destroys the handles whose key matches, with their descriptors, each with its GPU's context
  // current. cublasLtDestroy synchronises the device, so work enqueued with the handle is done.
  template <typename Match>
  void release_if(Match&& match) {
    std::vector<std::pair<LtKey, std::shared_ptr<LtEntry>>> gone;
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
    const LtApi* api = lt_.loaded();
    if (gone.empty() || api == nullptr) return;
    for (auto& [key, entry] : gone) {
      MutexLock lock(entry->mutex);
      Status status = contexts_.use_context(key.context);
      if (status.ok()) {
        for (auto& [hash, d] : entry->descriptors) d.destroy(*api);
        entry->descriptors.clear();
        if (entry->preference != nullptr)
          api->pfn_cublasLtMatmulPreferenceDestroy(entry->preference);
        entry->preference = nullptr;
        if (entry->raw != nullptr)
          status = api->check(api->pfn_cublasLtDestroy(entry->raw), "cublasLtDestroy");
      }
      LOG_IF(WARNING, !status.ok()) << "destroying the cuBLASLt handle of session " << key.owner
                                    << " on GPU " << key.context.gpu << ": " << status;
      entry->raw = nullptr;
    }
  }

  const CudaContexts& contexts_;
  LazyLt lt_;

  Mutex mutex_;
  std::map<LtKey, std::shared_ptr<LtEntry>> entries_ GUARDED_BY(mutex_);

  Mutex algos_mutex_;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos_ GUARDED_BY(algos_mutex_);

  Mutex models_mutex_;
  std::map<int, uint64_t> models_ GUARDED_BY(models_mutex_);
};

}  // namespace

std::unique_ptr<CudaBlasLt> make_cuda_blaslt(const CudaContexts& contexts, OpenCudaLibrary open) {
  return std::make_unique<CudaBlasLtBackend>(contexts, std::move(open));
}

}  // namespace hiber::device
