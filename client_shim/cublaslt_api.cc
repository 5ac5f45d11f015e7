// libhibercublasLt.so: the cuBLASLt API (libcublasLt.so.13), remoted to hiberd. Its handles are
// cuBLAS's (library_client.h): PyTorch passes a cublasHandle_t as a cublasLtHandle_t.
//
// Descriptors (matmul, matrix layout, preference) live here, as attribute bags keyed by the
// attribute enum: each attribute has the size cuBLASLt documents, and a set or get with another
// size is refused with CUBLAS_STATUS_INVALID_VALUE, as the library refuses it. Nothing travels
// until a matmul or a heuristic query, which carry the descriptors' contents
// (library_ops::blas::LtProblem):
//   - cublasLtMatmul is one asynchronous LibraryCall, ordered on its stream like a launch;
//   - cublasLtMatmulAlgoGetHeuristic is a LibraryQuery answered by hiberd, and its answer is
//     cached here keyed by the problem and the preference: the answer depends on nothing else,
//     and PyTorch re-creates its descriptors and asks again on every matmul, so a warm inference
//     makes no round trip for it.
// The 64-byte cublasLtMatmulAlgo_t is hiberd's (library_ops::blas::LtAlgo): it travels back whole.
#include <cublasLt.h>

#include <array>
#include <bit>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "client_shim/cublasLt_entry_decls.h"
#include "client_shim/cublas_status.h"
#include "client_shim/library_client.h"
#include "library_ops/dispatch.h"

namespace {

using hiber::ErrorCode;
using hiber::Status;
using hiber::library_ops::Library;
using hiber::library_ops::blas::LtAlgo;
using hiber::library_ops::blas::LtHeuristic;
using hiber::library_ops::blas::LtHeuristicResult;
using hiber::library_ops::blas::LtLayout;
using hiber::library_ops::blas::LtMatmul;
using hiber::library_ops::blas::LtProblem;
using hiber::shim::LibraryHandleObj;
using hiber::shim::cublas::status_name;
using hiber::shim::cublas::status_of;
using hiber::shim::cublas::status_string;

cublasStatus_t fail(const char* call, const Status& s) {
  return hiber::shim::cublas::fail("cuBLASLt", call, s);
}

// One attribute: its enum value, its size in bytes and its default (every attribute the library
// documents fits in 8 bytes: integers, enums and pointers).
struct AttrSpec {
  int attr;
  uint8_t size;
  uint64_t default_value;
};

// Attribute values are below this (cuBLASLt's enums are small and dense).
constexpr int kMaxAttr = 64;

// An attribute bag with cuBLASLt's size rules. `kSpecs` lists every attribute of the descriptor.
// Lookups are a table index, and the bag tracks which attributes differ from their defaults:
// a matmul reads about 40 attributes, and its client-side cost is the budget of a launch.
template <const auto& kSpecs>
class AttrBag {
 public:
  static constexpr size_t kCount = std::size(kSpecs);
  static_assert(kCount <= 64, "one bit per attribute in changed_");

  AttrBag() {
    for (size_t i = 0; i < kCount; ++i) values_[i] = kSpecs[i].default_value;
  }

  cublasStatus_t set(int attr, const void* buf, size_t size) {
    const int i = index(attr);
    if (i < 0 || buf == nullptr || size != kSpecs[i].size) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t value = 0;
    std::memcpy(&value, buf, size);
    // Sign-extend 4-byte values, so int32 attributes read back as set at any width.
    if (size == 4) value = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(value)));
    values_[i] = value;
    if (value == kSpecs[i].default_value) {
      changed_ &= ~(uint64_t{1} << i);
    } else {
      changed_ |= uint64_t{1} << i;
    }
    return CUBLAS_STATUS_SUCCESS;
  }

  // sizeInBytes 0 with sizeWritten: the size needed. Otherwise the size must be the attribute's.
  cublasStatus_t get(int attr, void* buf, size_t size, size_t* written) const {
    const int i = index(attr);
    if (i < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0) {
      if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
      *written = kSpecs[i].size;
      return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == nullptr || size != kSpecs[i].size) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, &values_[i], size);  // little-endian: the low bytes
    if (written != nullptr) *written = size;
    return CUBLAS_STATUS_SUCCESS;
  }

  uint64_t value(int attr) const { return values_[index(attr)]; }
  int32_t i32(int attr) const { return static_cast<int32_t>(value(attr)); }
  void set_value(int attr, uint64_t value) {
    const int i = index(attr);
    values_[i] = value;
    changed_ = value == kSpecs[i].default_value ? changed_ & ~(uint64_t{1} << i)
                                                : changed_ | (uint64_t{1} << i);
  }
  // Whether any attribute of `attrs` differs from its default.
  template <const auto& kAttrs>
  bool any_changed() const {
    static constexpr uint64_t kMask = [] {
      uint64_t mask = 0;
      for (int attr : kAttrs) mask |= uint64_t{1} << kIndex[attr];
      return mask;
    }();
    return (changed_ & kMask) != 0;
  }
  bool changed(int attr) const { return (changed_ >> index(attr)) & 1; }

 private:
  static constexpr std::array<int8_t, kMaxAttr> kIndex = [] {
    std::array<int8_t, kMaxAttr> index{};
    index.fill(-1);
    for (size_t i = 0; i < kCount; ++i) index[kSpecs[i].attr] = static_cast<int8_t>(i);
    return index;
  }();
  static int index(int attr) { return attr >= 0 && attr < kMaxAttr ? kIndex[attr] : -1; }

  uint64_t values_[kCount];
  uint64_t changed_ = 0;  // bit i: values_[i] differs from kSpecs[i]'s default
};

constexpr uint64_t kNegativeOne = ~uint64_t{0};  // -1 in a 4-byte signed attribute, sign-extended

constexpr AttrSpec kMatmulDescSpecs[] = {
    {CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, 4, 0},
    {CUBLASLT_MATMUL_DESC_SCALE_TYPE, 4, 0},
    {CUBLASLT_MATMUL_DESC_POINTER_MODE, 4, CUBLASLT_POINTER_MODE_HOST},
    {CUBLASLT_MATMUL_DESC_TRANSA, 4, CUBLAS_OP_N},
    {CUBLASLT_MATMUL_DESC_TRANSB, 4, CUBLAS_OP_N},
    {CUBLASLT_MATMUL_DESC_TRANSC, 4, CUBLAS_OP_N},
    {CUBLASLT_MATMUL_DESC_FILL_MODE, 4, CUBLAS_FILL_MODE_FULL},
    {CUBLASLT_MATMUL_DESC_EPILOGUE, 4, CUBLASLT_EPILOGUE_DEFAULT},
    {CUBLASLT_MATMUL_DESC_BIAS_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 8, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 8, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, 8, 0},
    {CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, 8, 0},
    {CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 4, 0},
    {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, 4, kNegativeOne},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_FAST_ACCUM, 1, 0},
    {CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, 4, kNegativeOne},  // -1: the default (see below)
    {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_C_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_D_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, 8, 0},
    {CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, 4, 0},
    {CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, 8, 0},
};
static_assert(hiber::library_ops::blas::kLtReductionSchemeAll == CUBLASLT_REDUCTION_SCHEME_MASK);

// Attributes the remoted matmul does not carry: a matmul with any of them changed is refused
// loudly (CUBLAS_STATUS_NOT_SUPPORTED), never run as if it were unset.
constexpr int kUnremotedDescAttrs[] = {
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
    CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_AMAX_D_POINTER,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER,
    CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
    CUBLASLT_MATMUL_DESC_C_SCALE_MODE,
    CUBLASLT_MATMUL_DESC_D_SCALE_MODE,
    CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE,
};

constexpr AttrSpec kLayoutSpecs[] = {
    {CUBLASLT_MATRIX_LAYOUT_TYPE, 4, 0},
    {CUBLASLT_MATRIX_LAYOUT_ORDER, 4, CUBLASLT_ORDER_COL},
    {CUBLASLT_MATRIX_LAYOUT_ROWS, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_COLS, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_LD, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 4, 1},
    {CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, 8, 0},
    {CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, 4, 0},
};

constexpr AttrSpec kPreferenceSpecs[] = {
    {CUBLASLT_MATMUL_PREF_SEARCH_MODE, 4, CUBLASLT_SEARCH_BEST_FIT},
    {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 8, 0},
    {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, 4, CUBLASLT_REDUCTION_SCHEME_MASK},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 4, 256},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, 4, 256},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, 4, 256},
    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, 4, 256},
    {CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, 4, 0},
    {CUBLASLT_MATMUL_PREF_IMPL_MASK, 8, ~uint64_t{0}},
};

// The objects behind the opaque descriptor pointers. The tag catches a pointer of another kind
// (or garbage that happens to be readable) before its fields are trusted.
enum class Kind : uint32_t { kDesc = 0x4c544d44, kLayout = 0x4c544c59, kPreference = 0x4c545052 };

struct MatmulDesc {
  Kind kind = Kind::kDesc;
  AttrBag<kMatmulDescSpecs> attrs;
};
struct Layout {
  Kind kind = Kind::kLayout;
  AttrBag<kLayoutSpecs> attrs;
};
struct Preference {
  Kind kind = Kind::kPreference;
  AttrBag<kPreferenceSpecs> attrs;
};

template <typename T>
T* object(void* p) {
  auto* object = static_cast<T*>(p);
  return object != nullptr && object->kind == T().kind ? object : nullptr;
}

LtLayout layout_of(const Layout& l) {
  LtLayout out;
  out.type = l.attrs.i32(CUBLASLT_MATRIX_LAYOUT_TYPE);
  out.order = l.attrs.i32(CUBLASLT_MATRIX_LAYOUT_ORDER);
  out.rows = static_cast<int64_t>(l.attrs.value(CUBLASLT_MATRIX_LAYOUT_ROWS));
  out.cols = static_cast<int64_t>(l.attrs.value(CUBLASLT_MATRIX_LAYOUT_COLS));
  out.ld = static_cast<int64_t>(l.attrs.value(CUBLASLT_MATRIX_LAYOUT_LD));
  out.batch_count = l.attrs.i32(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
  out.batch_offset =
      static_cast<int64_t>(l.attrs.value(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET));
  return out;
}

// The problem the descriptors describe; NOT_SUPPORTED (logged) for what the wire does not carry.
cublasStatus_t problem_of(const char* call, cublasLtMatmulDesc_t desc_handle,
                          cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                          cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, LtProblem* out) {
  const MatmulDesc* desc = object<MatmulDesc>(desc_handle);
  const Layout* layouts[] = {object<Layout>(a), object<Layout>(b), object<Layout>(c),
                             object<Layout>(d)};
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  for (const Layout* l : layouts)
    if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  for (int attr : kUnremotedDescAttrs) {
    if (desc->attrs.changed(attr))
      return fail(call, hiber::error(ErrorCode::kNotSupported, "matmul descriptor attribute ", attr,
                                     " is not supported by Hiber"));
  }
  // PyTorch's SM carve-out (torch._C._set_sm_carveout_experimental) asks the matmul to leave
  // SMs free. hiberd runs it on all the SMs of a GPU it shares between functions anyway; the
  // result is the same, so the hint is dropped, and said so once.
  if (desc->attrs.changed(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET))
    hiber::shim::library_log_once("cuBLASLt",
                                  std::string(call) +
                                      ": CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET is ignored by Hiber "
                                      "(the matmul may use every SM; its result is the same)");
  for (const Layout* l : layouts) {
    if (l->attrs.changed(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET) ||
        l->attrs.changed(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE))
      return fail(call, hiber::error(ErrorCode::kNotSupported,
                                     "planar-complex and pointer-array layouts are not supported "
                                     "by Hiber"));
  }
  LtProblem& p = *out;
  p.a = layout_of(*layouts[0]);
  p.b = layout_of(*layouts[1]);
  p.c = layout_of(*layouts[2]);
  p.d = layout_of(*layouts[3]);
  p.compute_type = desc->attrs.i32(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
  p.scale_type = desc->attrs.i32(CUBLASLT_MATMUL_DESC_SCALE_TYPE);
  p.pointer_mode = desc->attrs.i32(CUBLASLT_MATMUL_DESC_POINTER_MODE);
  p.epilogue = desc->attrs.i32(CUBLASLT_MATMUL_DESC_EPILOGUE);
  // The bias type's default (-1): D's type, as cuBLASLt documents it for every type Hiber remotes
  // (the exceptions are int8 and fp8 kernels).
  const int32_t bias_type = desc->attrs.i32(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
  p.bias_type = bias_type == -1 ? p.d.type : bias_type;
  const auto trans = [](int32_t value) {
    return static_cast<uint8_t>(value >= 0 && value <= 255 ? value : 255);
  };
  p.transa = trans(desc->attrs.i32(CUBLASLT_MATMUL_DESC_TRANSA));
  p.transb = trans(desc->attrs.i32(CUBLASLT_MATMUL_DESC_TRANSB));
  p.transc = trans(desc->attrs.i32(CUBLASLT_MATMUL_DESC_TRANSC));
  auto checked = hiber::library_ops::blas::check_lt_problem(p);
  if (!checked.ok()) return fail(call, checked.status());
  return CUBLAS_STATUS_SUCCESS;
}

// The heuristic answers already received, keyed by the query's bytes (problem and preference).
class HeuristicCache {
 public:
  static HeuristicCache& get() {
    static auto* cache = new HeuristicCache;  // never destroyed: used until the process exits
    return *cache;
  }
  bool find(const LtHeuristic& query, std::vector<LtHeuristicResult>* out) {
    std::lock_guard lock(mu_);
    auto it = answers_.find(key(query));
    if (it == answers_.end()) return false;
    *out = it->second;
    return true;
  }
  void add(const LtHeuristic& query, std::vector<LtHeuristicResult> answer) {
    std::lock_guard lock(mu_);
    // Bounded: a program asking about ever new shapes must not grow it without limit.
    if (answers_.size() >= kMaxEntries) answers_.clear();
    answers_.emplace(key(query), std::move(answer));
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  static std::string key(const LtHeuristic& query) {
    auto bytes = hiber::library_ops::op_bytes(query);
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::mutex mu_;
  std::unordered_map<std::string, std::vector<LtHeuristicResult>> answers_;
};

}  // namespace

// ---- Handle ----

cublasStatus_t hiber_entry::cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto made = hiber::shim::library_handle_create(Library::kBlas);
  if (!made.ok()) return fail("cublasLtCreate", made.status());
  *handle = reinterpret_cast<cublasLtHandle_t>(*made);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtDestroy(cublasLtHandle_t handle) {
  auto h = hiber::shim::library_handle(handle, Library::kBlas);
  if (!h.ok()) return fail("cublasLtDestroy", h.status());
  return fail("cublasLtDestroy", hiber::shim::library_handle_destroy(*h));
}

// ---- Versions and status strings: those of the headers Hiber was built with ----

size_t hiber_entry::cublasLtGetVersion(void) { return CUBLAS_VERSION; }
size_t hiber_entry::cublasLtGetCudartVersion(void) { return CUDART_VERSION; }
const char* hiber_entry::cublasLtGetStatusName(cublasStatus_t status) {
  return status_name(status);
}
const char* hiber_entry::cublasLtGetStatusString(cublasStatus_t status) {
  return status_string(status);
}
cublasStatus_t hiber_entry::cublasLtGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// ---- Descriptors ----

cublasStatus_t hiber_entry::cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                                     cublasComputeType_t compute_type,
                                                     cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* made = new MatmulDesc;
  made->attrs.set_value(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, static_cast<uint64_t>(compute_type));
  made->attrs.set_value(CUBLASLT_MATMUL_DESC_SCALE_TYPE, static_cast<uint64_t>(scale_type));
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(made);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (desc == nullptr) return CUBLAS_STATUS_SUCCESS;
  MatmulDesc* d = object<MatmulDesc>(desc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  d->kind = Kind{};
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t size) {
  MatmulDesc* d = object<MatmulDesc>(desc);
  return d == nullptr ? CUBLAS_STATUS_INVALID_VALUE : d->attrs.set(attr, buf, size);
}

cublasStatus_t hiber_entry::cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           void* buf, size_t size,
                                                           size_t* written) {
  const MatmulDesc* d = object<MatmulDesc>(desc);
  return d == nullptr ? CUBLAS_STATUS_INVALID_VALUE : d->attrs.get(attr, buf, size, written);
}

cublasStatus_t hiber_entry::cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* made = new Layout;
  made->attrs.set_value(CUBLASLT_MATRIX_LAYOUT_TYPE, static_cast<uint64_t>(type));
  made->attrs.set_value(CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
  made->attrs.set_value(CUBLASLT_MATRIX_LAYOUT_COLS, cols);
  made->attrs.set_value(CUBLASLT_MATRIX_LAYOUT_LD, static_cast<uint64_t>(ld));
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(made);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (layout == nullptr) return CUBLAS_STATUS_SUCCESS;
  Layout* l = object<Layout>(layout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  l->kind = Kind{};
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void* buf, size_t size) {
  Layout* l = object<Layout>(layout);
  return l == nullptr ? CUBLAS_STATUS_INVALID_VALUE : l->attrs.set(attr, buf, size);
}

cublasStatus_t hiber_entry::cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             void* buf, size_t size,
                                                             size_t* written) {
  const Layout* l = object<Layout>(layout);
  return l == nullptr ? CUBLAS_STATUS_INVALID_VALUE : l->attrs.get(attr, buf, size, written);
}

cublasStatus_t hiber_entry::cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  Preference* p = object<Preference>(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  p->kind = Kind{};
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t size) {
  Preference* p = object<Preference>(pref);
  return p == nullptr ? CUBLAS_STATUS_INVALID_VALUE : p->attrs.set(attr, buf, size);
}

cublasStatus_t hiber_entry::cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, void* buf,
    size_t size, size_t* written) {
  const Preference* p = object<Preference>(pref);
  return p == nullptr ? CUBLAS_STATUS_INVALID_VALUE : p->attrs.get(attr, buf, size, written);
}

// ---- Heuristics: asked of hiberd once per problem and preference, then cached ----

cublasStatus_t hiber_entry::cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  constexpr const char* kCall = "cublasLtMatmulAlgoGetHeuristic";
  auto h = hiber::shim::library_handle(handle, Library::kBlas);
  if (!h.ok()) return fail(kCall, h.status());
  if (requested < 1 || results == nullptr || returned == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  LtHeuristic query;
  const cublasStatus_t described = problem_of(kCall, desc, a, b, c, d, &query.problem);
  if (described != CUBLAS_STATUS_SUCCESS) return described;
  // A missing preference is the default one: no workspace.
  if (preference != nullptr) {
    const Preference* p = object<Preference>(preference);
    if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    query.max_workspace_bytes = p->attrs.value(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
    const cublasLtMatmulPreferenceAttributes_t alignments[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
      const uint64_t bytes = p->attrs.value(alignments[i]);
      if (bytes > hiber::library_ops::blas::kMaxLtAlignment)
        return fail(kCall, hiber::error(ErrorCode::kNotSupported, "a minimum alignment of ", bytes,
                                        " bytes (Hiber carries up to ",
                                        hiber::library_ops::blas::kMaxLtAlignment, ")"));
      query.min_alignment[i] = static_cast<uint32_t>(bytes);
    }
    const uint64_t mask = p->attrs.value(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK);
    if (mask > hiber::library_ops::blas::kLtReductionSchemeAll)
      return fail(kCall, hiber::error(ErrorCode::kInvalidValue, "reduction scheme mask ", mask,
                                      " has bits outside CUBLASLT_REDUCTION_SCHEME_MASK"));
    query.reduction_scheme_mask = static_cast<uint32_t>(mask);
    // What the heuristic query does not carry is refused, never answered as if it were unset.
    for (int attr : {CUBLASLT_MATMUL_PREF_SEARCH_MODE, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT,
                     CUBLASLT_MATMUL_PREF_IMPL_MASK}) {
      if (p->attrs.changed(attr))
        return fail(kCall, hiber::error(ErrorCode::kNotSupported, "matmul preference attribute ",
                                        attr, " is not supported by Hiber"));
    }
  }
  query.requested = std::min(requested, hiber::library_ops::blas::kMaxLtHeuristicResults);
  std::vector<LtHeuristicResult> answer;
  if (!HeuristicCache::get().find(query, &answer)) {
    auto bytes = hiber::shim::library_query(*h, hiber::library_ops::op_of<LtHeuristic>,
                                            hiber::library_ops::op_bytes(query));
    if (!bytes.ok()) {
      *returned = 0;
      return fail(kCall, bytes.status());
    }
    if (bytes->size() % sizeof(LtHeuristicResult) != 0 ||
        bytes->size() / sizeof(LtHeuristicResult) > static_cast<size_t>(query.requested))
      return fail(kCall, hiber::error(ErrorCode::kUnknown, "hiberd answered ", bytes->size(),
                                      " bytes, not whole heuristic results"));
    answer.resize(bytes->size() / sizeof(LtHeuristicResult));
    std::memcpy(answer.data(), bytes->data(), bytes->size());
    HeuristicCache::get().add(query, answer);
  }
  for (size_t i = 0; i < answer.size(); ++i) {
    cublasLtMatmulHeuristicResult_t& r = results[i];
    std::memset(&r, 0, sizeof(r));
    static_assert(sizeof(r.algo) == sizeof(LtAlgo));
    std::memcpy(&r.algo, &answer[i].algo, sizeof(LtAlgo));
    r.workspaceSize = answer[i].workspace_bytes;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = std::bit_cast<float>(answer[i].waves_bits);
  }
  *returned = static_cast<int>(answer.size());
  return answer.empty() ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
    size_t size, size_t* written) {
  if (algo == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  LtAlgo a;
  std::memcpy(static_cast<void*>(&a), algo, sizeof(a));
  // The ID is the backend's; the tile, split-K, reduction, swizzling and shape choices are the
  // backend's own business, reported as the library's defaults ("undefined", no split).
  uint64_t value = 0;
  size_t value_size = 4;
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: value = static_cast<uint32_t>(a.id); break;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: value = 1; break;
    case CUBLASLT_ALGO_CONFIG_TILE_ID:
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING:
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION:
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: break;
    case CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID:
    case CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID: value_size = 2; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (size == 0) {
    if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = value_size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != value_size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &value, value_size);
  if (written != nullptr) *written = value_size;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- Matmul: one asynchronous call on `stream` ----

cublasStatus_t hiber_entry::cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                           const void* alpha, const void* a,
                                           cublasLtMatrixLayout_t a_desc, const void* b,
                                           cublasLtMatrixLayout_t b_desc, const void* beta,
                                           const void* c, cublasLtMatrixLayout_t c_desc, void* d,
                                           cublasLtMatrixLayout_t d_desc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
  constexpr const char* kCall = "cublasLtMatmul";
  auto h = hiber::shim::library_handle(handle, Library::kBlas);
  if (!h.ok()) return fail(kCall, h.status());
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  LtMatmul mm;
  const cublasStatus_t described =
      problem_of(kCall, desc, a_desc, b_desc, c_desc, d_desc, &mm.problem);
  if (described != CUBLAS_STATUS_SUCCESS) return described;
  const MatmulDesc* md = object<MatmulDesc>(desc);
  mm.a = reinterpret_cast<uint64_t>(a);
  mm.b = reinterpret_cast<uint64_t>(b);
  mm.c = reinterpret_cast<uint64_t>(c);
  mm.d = reinterpret_cast<uint64_t>(d);
  mm.bias = md->attrs.value(CUBLASLT_MATMUL_DESC_BIAS_POINTER);
  mm.bias_batch_stride =
      static_cast<int64_t>(md->attrs.value(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE));
  mm.workspace = reinterpret_cast<uint64_t>(workspace);
  mm.workspace_bytes = workspace == nullptr ? 0 : workspace_bytes;
  if (mm.problem.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE) {
    mm.alpha_ptr = reinterpret_cast<uint64_t>(alpha);
    mm.beta_ptr = reinterpret_cast<uint64_t>(beta);
  } else {
    // Copied by the scale type: half for CUBLAS_COMPUTE_16F, as the program passes it.
    auto scale = hiber::library_ops::blas::element_bytes(mm.problem.scale_type, "scale type");
    if (!scale.ok() || *scale > sizeof(mm.alpha.bytes))
      return fail(kCall, scale.ok() ? hiber::error(ErrorCode::kNotSupported, "scale type ",
                                                   mm.problem.scale_type)
                                    : scale.status());
    std::memcpy(mm.alpha.bytes, alpha, *scale);
    std::memcpy(mm.beta.bytes, beta, *scale);
  }
  if (algo != nullptr) {
    std::memcpy(static_cast<void*>(&mm.algo), algo, sizeof(LtAlgo));
    mm.has_algo = 1;
  }
  return fail(kCall, hiber::shim::library_call_on(*h, stream, hiber::library_ops::op_of<LtMatmul>,
                                                  hiber::library_ops::op_bytes(mm)));
}
