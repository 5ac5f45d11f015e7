// The fake libcublasLt.so.13: see fake_cublaslt.h.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "tests/gpu/fake_cublaslt.h"

namespace {

FakeCublasLt& state() {
  static FakeCublasLt* s = new FakeCublasLt;  // never destroyed: tests read it until exit
  return *s;
}

// The GPU of the context current on this thread, from the fake libcuda.so.1 the test loaded; -1
// if none is current (or no fake driver is loaded).
int current_gpu() {
  static auto get = [] {
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return libcuda != nullptr ? reinterpret_cast<int (*)()>(dlsym(libcuda, "fake_cuda_current_gpu"))
                              : nullptr;
  }();
  return get != nullptr ? get() : -1;
}

// Objects behind the opaque pointers, each starting with a tag so a wrong kind is caught.
enum Tag : uint32_t { kHandle = 0x17A0, kDesc = 0x17D0, kLayout = 0x17A1, kPref = 0x17F0 };

struct Handle {
  uint32_t tag = kHandle;
  int gpu = -1;
};
struct Desc {
  uint32_t tag = kDesc;
  FakeLtDesc d;
};
struct Layout {
  uint32_t tag = kLayout;
  FakeLtLayout l;
};
struct Pref {
  uint32_t tag = kPref;
  uint64_t max_workspace = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};

template <typename T>
T* as(void* p, Tag tag) {
  T* t = static_cast<T*>(p);
  return t != nullptr && t->tag == tag ? t : nullptr;
}

// Every call on a handle must come with the handle's GPU's context current (state's lock held).
void expect_current(const Handle* h, const char* call) {
  if (current_gpu() != h->gpu) {
    state().wrong_context_calls.push_back(std::string(call) + " on a handle of GPU " +
                                          std::to_string(h->gpu) + " with GPU " +
                                          std::to_string(current_gpu()) + "'s context current");
  }
}

// Copies an attribute of exactly `sizeof *out` bytes, as cuBLASLt requires.
template <typename T>
bool take(T* out, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

}  // namespace

extern "C" {

FakeCublasLt* fake_cublaslt() { return &state(); }

size_t cublasLtGetVersion() { return CUBLAS_VERSION; }
const char* cublasLtGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
                                               : "CUBLAS_STATUS_FAKE";
}
const char* cublasLtGetStatusString(cublasStatus_t) { return "fake cuBLASLt"; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  // The real cuBLASLt works in the context current on the thread.
  const int gpu = current_gpu();
  if (gpu < 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto* h = new Handle;
  h->gpu = gpu;
  *handle = reinterpret_cast<cublasLtHandle_t>(h);
  std::lock_guard lock(state().mutex);
  state().created.push_back({reinterpret_cast<uintptr_t>(h), gpu});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  Handle* h = as<Handle>(handle, kHandle);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::lock_guard lock(state().mutex);
  expect_current(h, "cublasLtDestroy");
  state().destroyed.push_back({reinterpret_cast<uintptr_t>(h), current_gpu()});
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  auto* d = new Desc;
  d->d.compute_type = compute;
  d->d.scale_type = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  std::lock_guard lock(state().mutex);
  ++state().descs_live;
  ++state().descs_created;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  Desc* d = as<Desc>(desc, kDesc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete d;
  std::lock_guard lock(state().mutex);
  --state().descs_live;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  Desc* p = as<Desc>(desc, kDesc);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  FakeLtDesc& d = p->d;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ok = take(&d.pointer_mode, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = take(&d.transa, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = take(&d.transb, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSC:
      ok = take(&d.transc, buf, size);
      d.transc_set = true;
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = take(&d.epilogue, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: {
      const void* p = nullptr;
      ok = take(&p, buf, size);
      d.bias = reinterpret_cast<uintptr_t>(p);
      break;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: ok = take(&d.bias_batch_stride, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = take(&d.bias_type, buf, size); break;
    default: break;  // an attribute hiberd has no business setting
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  auto* l = new Layout;
  l->l.type = type;
  l->l.rows = rows;
  l->l.cols = cols;
  l->l.ld = ld;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  std::lock_guard lock(state().mutex);
  ++state().layouts_live;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  Layout* l = as<Layout>(layout, kLayout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete l;
  std::lock_guard lock(state().mutex);
  --state().layouts_live;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  Layout* p = as<Layout>(layout, kLayout);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = take(&p->l.order, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = take(&p->l.batch_count, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      ok = take(&p->l.batch_offset, buf, size);
      break;
    default: break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref);
  std::lock_guard lock(state().mutex);
  ++state().preferences_live;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  Pref* p = as<Pref>(pref, kPref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete p;
  std::lock_guard lock(state().mutex);
  --state().preferences_live;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  Pref* p = as<Pref>(pref, kPref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return take(&p->max_workspace, buf, size) ? CUBLAS_STATUS_SUCCESS
                                                : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return take(&p->reduction_mask, buf, size) ? CUBLAS_STATUS_SUCCESS
                                                 : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      const int operand = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
      return take(&p->min_alignment[operand], buf, size) ? CUBLAS_STATUS_SUCCESS
                                                         : CUBLAS_STATUS_INVALID_VALUE;
    }
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  Handle* h = as<Handle>(handle, kHandle);
  Desc* md = as<Desc>(desc, kDesc);
  Layout* layouts[] = {as<Layout>(a, kLayout), as<Layout>(b, kLayout), as<Layout>(c, kLayout),
                       as<Layout>(d, kLayout)};
  Pref* p = as<Pref>(pref, kPref);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (md == nullptr || p == nullptr || requested < 1 || results == nullptr || returned == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  for (Layout* l : layouts)
    if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  expect_current(h, "cublasLtMatmulAlgoGetHeuristic");
  FakeLtHeuristic q;
  q.handle = reinterpret_cast<uintptr_t>(h);
  q.gpu = current_gpu();
  q.desc = md->d;
  q.a = layouts[0]->l;
  q.b = layouts[1]->l;
  q.c = layouts[2]->l;
  q.d = layouts[3]->l;
  q.max_workspace = p->max_workspace;
  for (int i = 0; i < 4; ++i) q.min_alignment[i] = p->min_alignment[i];
  q.reduction_mask = p->reduction_mask;
  q.requested = requested;
  const uint64_t serial = state().heuristics.size() + 1;
  const int n = std::min(requested, state().algos_offered);
  for (int i = 0; i < requested; ++i) {
    std::memset(&results[i], 0, sizeof results[i]);
    results[i].state = CUBLAS_STATUS_NOT_SUPPORTED;
  }
  for (int i = 0; i < n; ++i) {
    results[i].algo = fake_lt_algo(serial, i, q.gpu);
    results[i].workspaceSize = static_cast<size_t>(i) * 1024;
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].wavesCount = 0.5f + static_cast<float>(i);
    q.returned.push_back(results[i].algo);
  }
  *returned = n;
  state().heuristics.push_back(q);
  return n > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void* buf, size_t size, size_t* written) {
  if (algo == nullptr || attr != CUBLASLT_ALGO_CONFIG_ID || buf == nullptr ||
      size != sizeof(int32_t))
    return CUBLAS_STATUS_INVALID_VALUE;
  const auto id = static_cast<int32_t>(algo->data[0]);
  std::memcpy(buf, &id, sizeof id);
  if (written != nullptr) *written = sizeof id;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                              cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  Handle* h = as<Handle>(handle, kHandle);
  Desc* md = as<Desc>(desc, kDesc);
  Layout* layouts[] = {as<Layout>(Adesc, kLayout), as<Layout>(Bdesc, kLayout),
                       as<Layout>(Cdesc, kLayout), as<Layout>(Ddesc, kLayout)};
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (md == nullptr || alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  for (Layout* l : layouts)
    if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  expect_current(h, "cublasLtMatmul");
  FakeLtMatmul m;
  m.handle = reinterpret_cast<uintptr_t>(h);
  m.gpu = current_gpu();
  m.stream = reinterpret_cast<CUstream>(stream);
  m.desc = md->d;
  m.a = layouts[0]->l;
  m.b = layouts[1]->l;
  m.c = layouts[2]->l;
  m.d = layouts[3]->l;
  if (md->d.pointer_mode == CUBLASLT_POINTER_MODE_HOST) {
    std::memcpy(m.alpha, alpha, sizeof m.alpha);
    std::memcpy(m.beta, beta, sizeof m.beta);
  } else {
    m.alpha_ptr = reinterpret_cast<uintptr_t>(alpha);
    m.beta_ptr = reinterpret_cast<uintptr_t>(beta);
  }
  m.pa = reinterpret_cast<uintptr_t>(A);
  m.pb = reinterpret_cast<uintptr_t>(B);
  m.pc = reinterpret_cast<uintptr_t>(C);
  m.pd = reinterpret_cast<uintptr_t>(D);
  if (algo != nullptr) {
    m.has_algo = true;
    m.algo = *algo;
  }
  m.workspace = reinterpret_cast<uintptr_t>(workspace);
  m.workspace_bytes = workspace_bytes;
  state().matmuls.push_back(m);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
