// The fake libcudnn.so.9: see fake_cudnn.h.
#include <cudnn_graph.h>
#include <cudnn_ops.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/fake_cudnn.h"

namespace {

FakeCudnn& state() {
  static FakeCudnn* s = new FakeCudnn;  // never destroyed: tests read it until exit
  return *s;
}

// The GPU of the context current on this thread, from the fake libcuda.so.1 the test loaded; -1
// if none is current.
int current_gpu() {
  static auto get = [] {
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return libcuda != nullptr ? reinterpret_cast<int (*)()>(dlsym(libcuda, "fake_cuda_current_gpu"))
                              : nullptr;
  }();
  return get != nullptr ? get() : -1;
}

// cuDNN keeps its last error message per thread.
thread_local std::string last_error;

cudnnStatus_t fail(cudnnStatus_t status, std::string message) {
  last_error = std::move(message);
  return status;
}

// Handles and descriptors are numbers from disjoint ranges, unique for the process.
constexpr uintptr_t kHandleBase = 0x4A000000, kDescriptorBase = 0x4D000000,
                    kLegacyBase = 0x4E000000;
uintptr_t next_handle = kHandleBase, next_descriptor = kDescriptorBase, next_legacy = kLegacyBase;

struct Handle {
  int gpu = -1;
  CUstream stream = nullptr;
  bool live = true;
};
std::map<uintptr_t, Handle>& handles() {
  static auto* m = new std::map<uintptr_t, Handle>();
  return *m;
}
Handle* handle_of(cudnnHandle_t h, const char* call) {
  auto it = handles().find(reinterpret_cast<uintptr_t>(h));
  if (it == handles().end() || !it->second.live) {
    state().misuses.push_back(std::string(call) + " on a handle that is not live");
    return nullptr;
  }
  if (current_gpu() != it->second.gpu)
    state().wrong_context_calls.push_back(std::string(call) + " on a handle of GPU " +
                                          std::to_string(it->second.gpu) + " with GPU " +
                                          std::to_string(current_gpu()) + "'s context current");
  return &it->second;
}

FakeCudnnDescriptor* descriptor_of(cudnnBackendDescriptor_t d) {
  for (FakeCudnnDescriptor& x : state().descriptors)
    if (x.id == reinterpret_cast<uintptr_t>(d) && !x.destroyed) return &x;
  return nullptr;
}

size_t element_bytes(cudnnBackendAttributeType_t type) {
  switch (type) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return 8;
    case CUDNN_TYPE_BOOLEAN:
    case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_FRACTION: return 16;
    default: return 4;
  }
}

// Legacy descriptors.
std::map<uintptr_t, FakeCudnnTensor>& tensors() {
  static auto* m = new std::map<uintptr_t, FakeCudnnTensor>();
  return *m;
}
struct Pooling {
  int mode = 0, nan = 0, spatial = 0;
  std::vector<int> window, pad, stride;
};
std::map<uintptr_t, Pooling>& poolings() {
  static auto* m = new std::map<uintptr_t, Pooling>();
  return *m;
}
struct Activation {
  int mode = 0, nan = 0;
  double coef = 0;
};
std::map<uintptr_t, Activation>& activations() {
  static auto* m = new std::map<uintptr_t, Activation>();
  return *m;
}
template <typename T>
uintptr_t id(T d) {
  return reinterpret_cast<uintptr_t>(d);
}

FakeCudnnLegacyCall begin(const char* call, cudnnHandle_t handle, const void* alpha,
                          const void* beta, int data_type) {
  FakeCudnnLegacyCall c;
  c.call = call;
  c.handle = id(handle);
  c.gpu = current_gpu();
  if (Handle* h = handle_of(handle, call)) c.stream = h->stream;
  c.scalars_as_double = data_type == CUDNN_DATA_DOUBLE;
  if (c.scalars_as_double) {
    c.alpha = *static_cast<const double*>(alpha);
    c.beta = *static_cast<const double*>(beta);
  } else {
    c.alpha = *static_cast<const float*>(alpha);
    c.beta = *static_cast<const float*>(beta);
  }
  return c;
}

const FakeCudnnTensor* tensor(const cudnnTensorDescriptor_t d, const char* call) {
  auto it = tensors().find(id(d));
  if (it == tensors().end()) {
    state().misuses.push_back(std::string(call) + " with a tensor descriptor that is not live");
    return nullptr;
  }
  return &it->second;
}

void add_tensor(FakeCudnnLegacyCall& c, const cudnnTensorDescriptor_t d, const void* ptr) {
  if (const FakeCudnnTensor* t = tensor(d, c.call.c_str())) c.tensors.push_back(*t);
  c.pointers.push_back(reinterpret_cast<uintptr_t>(ptr));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) FakeCudnn* fake_cudnn() { return &state(); }

size_t cudnnGetVersion() { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    default: return "CUDNN_STATUS_FAKE_OTHER";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (max_size == 0) return;
  std::snprintf(message, max_size, "%s", last_error.c_str());
  last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  // The real cuDNN works in the context current on the thread.
  const int gpu = current_gpu();
  if (gpu < 0) return fail(CUDNN_STATUS_NOT_INITIALIZED, "fake: no context is current");
  std::lock_guard lock(state().mutex);
  const uintptr_t h = next_handle += 16;
  handles()[h] = Handle{gpu, nullptr, true};
  state().created.push_back({h, gpu});
  *handle = reinterpret_cast<cudnnHandle_t>(h);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  std::lock_guard lock(state().mutex);
  Handle* h = handle_of(handle, "cudnnDestroy");
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  // A plan still live that was built with this handle would be destroyed after its handle.
  for (const FakeCudnnDescriptor& d : state().descriptors) {
    if (d.destroyed) continue;
    const FakeCudnnAttr* a = d.find(d.type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
                                        ? CUDNN_ATTR_EXECUTION_PLAN_HANDLE
                                        : CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
    if (a != nullptr && a->type == CUDNN_TYPE_HANDLE && a->value<uintptr_t>() == id(handle))
      state().misuses.push_back("cudnnDestroy of a handle a live descriptor still uses");
  }
  h->live = false;
  state().destroyed.push_back({id(handle), current_gpu()});
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  std::lock_guard lock(state().mutex);
  Handle* h = handle_of(handle, "cudnnSetStream");
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  ++state().set_stream_calls;
  h->stream = reinterpret_cast<CUstream>(stream);
  return CUDNN_STATUS_SUCCESS;
}

// ---- Backend API ----

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  std::lock_guard lock(state().mutex);
  FakeCudnnDescriptor d;
  d.id = next_descriptor += 16;
  d.type = type;
  d.gpu = current_gpu();
  state().descriptors.push_back(d);
  *descriptor = reinterpret_cast<cudnnBackendDescriptor_t>(d.id);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard lock(state().mutex);
  FakeCudnnDescriptor* d = descriptor_of(descriptor);
  if (d == nullptr) {
    state().misuses.push_back("cudnnBackendDestroyDescriptor of a descriptor that is not live");
    return CUDNN_STATUS_BAD_PARAM;
  }
  d->destroyed = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* values) {
  std::lock_guard lock(state().mutex);
  FakeCudnnDescriptor* d = descriptor_of(descriptor);
  if (d == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "fake: not a live descriptor");
  if (d->finalized) {
    state().misuses.push_back("cudnnBackendSetAttribute after finalization");
    return fail(CUDNN_STATUS_BAD_PARAM, "fake: the descriptor is finalized");
  }
  if (count <= 0 || values == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "fake: no elements");
  FakeCudnnAttr a;
  a.name = name;
  a.type = type;
  a.count = count;
  if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    const auto* refs = static_cast<const cudnnBackendDescriptor_t*>(values);
    for (int64_t i = 0; i < count; ++i) {
      const FakeCudnnDescriptor* r = descriptor_of(refs[i]);
      if (r == nullptr || !r->finalized) {
        state().misuses.push_back("attribute " + std::to_string(name) +
                                  " names a descriptor that is not live and finalized");
        return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "fake: reference not finalized");
      }
      a.refs.push_back(id(refs[i]));
    }
  } else {
    const auto* p = static_cast<const std::byte*>(values);
    a.bytes.assign(p, p + element_bytes(type) * static_cast<size_t>(count));
  }
  for (FakeCudnnAttr& old : d->attrs) {
    if (old.name == name) {
      old = std::move(a);
      return CUDNN_STATUS_SUCCESS;
    }
  }
  d->attrs.push_back(std::move(a));
  return CUDNN_STATUS_SUCCESS;
}

namespace {

// The engine a descriptor leads to (ENGINE, ENGINECFG, EXECUTION_PLAN), or null.
const FakeCudnnDescriptor* engine_of(const FakeCudnnDescriptor* d) {
  while (d != nullptr && d->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) {
    const int via = d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
                        ? CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG
                        : CUDNN_ATTR_ENGINECFG_ENGINE;
    const FakeCudnnAttr* a = d->find(via);
    if (a == nullptr || a->refs.size() != 1) return nullptr;
    d = descriptor_of(reinterpret_cast<cudnnBackendDescriptor_t>(a->refs[0]));
  }
  return d;
}

int64_t index_of(const FakeCudnnDescriptor* engine) {
  const FakeCudnnAttr* a =
      engine != nullptr ? engine->find(CUDNN_ATTR_ENGINE_GLOBAL_INDEX) : nullptr;
  return a != nullptr ? a->value<int64_t>() : -1;
}

cudnnStatus_t needs_handle(const FakeCudnnDescriptor& d, int attr) {
  const FakeCudnnAttr* a = d.find(attr);
  if (a == nullptr || a->type != CUDNN_TYPE_HANDLE)
    return fail(CUDNN_STATUS_BAD_PARAM, "fake: the handle attribute is not set");
  auto it = handles().find(a->value<uintptr_t>());
  if (it == handles().end() || !it->second.live) {
    state().misuses.push_back("a descriptor's handle attribute is not a live handle");
    return fail(CUDNN_STATUS_BAD_PARAM, "fake: not a live handle");
  }
  if (it->second.gpu != current_gpu())
    state().wrong_context_calls.push_back("finalizing with a handle of GPU " +
                                          std::to_string(it->second.gpu));
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard lock(state().mutex);
  FakeCudnnDescriptor* d = descriptor_of(descriptor);
  if (d == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "fake: not a live descriptor");
  switch (d->type) {
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      if (cudnnStatus_t s = needs_handle(*d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE); s != 0) return s;
      break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: {
      const int64_t index = index_of(d);
      if (index < 0 || index >= state().engine_count)
        return fail(CUDNN_STATUS_BAD_PARAM, "fake: no engine " + std::to_string(index));
      if (state().unsupported_engines.count(index) != 0)
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "fake: engine " + std::to_string(index) + " does not support this graph");
      break;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      const FakeCudnnAttr* graph = d->find(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
      const FakeCudnnAttr* mode = d->find(CUDNN_ATTR_ENGINEHEUR_MODE);
      if (graph == nullptr || graph->refs.size() != 1 || mode == nullptr ||
          mode->type != CUDNN_TYPE_HEUR_MODE)
        return fail(CUDNN_STATUS_BAD_PARAM, "fake: the heuristic's graph or mode is not set");
      if (state().heuristic_fails)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "fake: the heuristic fails");
      break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      if (cudnnStatus_t s = needs_handle(*d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE); s != 0) return s;
      const int64_t index = index_of(engine_of(d));
      if (state().plan_fails.count(index) != 0)
        return fail(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT,
                    "fake: engine " + std::to_string(index) + "'s plan does not fit");
      break;
    }
    default: break;
  }
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* values) {
  std::lock_guard lock(state().mutex);
  const FakeCudnnDescriptor* d = descriptor_of(descriptor);
  if (d == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "fake: not a live descriptor");
  if (!d->finalized) return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "fake: not finalized");
  auto give = [&](const std::vector<int64_t>& v, size_t each) {
    *count = static_cast<int64_t>(v.size());
    for (int64_t i = 0; i < std::min<int64_t>(requested, *count); ++i) {
      if (each == 8) {
        static_cast<int64_t*>(values)[i] = v[i];
      } else {
        static_cast<int32_t*>(values)[i] = static_cast<int32_t>(v[i]);
      }
    }
    return CUDNN_STATUS_SUCCESS;
  };
  // Descriptor-typed results fill descriptors the caller created (live, not finalized).
  auto target = [&](void* t, int want) -> FakeCudnnDescriptor* {
    FakeCudnnDescriptor* x = descriptor_of(static_cast<cudnnBackendDescriptor_t>(t));
    if (x == nullptr || x->type != want || x->finalized) {
      state().misuses.push_back("attribute " + std::to_string(name) +
                                " filled into a descriptor that is not a fresh one of type " +
                                std::to_string(want));
      return nullptr;
    }
    return x;
  };
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS && type == CUDNN_TYPE_BACKEND_DESCRIPTOR &&
      d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR) {
    std::vector<int64_t> order = state().heuristic_order;
    if (order.empty())
      for (int64_t i = 0; i < state().engine_count; ++i)
        if (state().unsupported_engines.count(i) == 0) order.push_back(i);
    const uintptr_t graph = d->find(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)->refs[0];
    *count = static_cast<int64_t>(order.size());
    for (int64_t i = 0; values != nullptr && i < std::min<int64_t>(requested, *count); ++i) {
      FakeCudnnDescriptor* cfg =
          target(static_cast<void**>(values)[i], CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      if (cfg == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "fake: bad result descriptor");
      cfg->heuristic_engine = order[static_cast<size_t>(i)];
      cfg->heuristic_graph = graph;
      cfg->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_ENGINECFG_ENGINE && type == CUDNN_TYPE_BACKEND_DESCRIPTOR &&
      d->heuristic_engine >= 0 && requested >= 1 && values != nullptr) {
    FakeCudnnDescriptor* engine =
        target(*static_cast<void**>(values), CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    if (engine == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "fake: bad engine descriptor");
    FakeCudnnAttr index{
        CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, std::vector<std::byte>(8), {}};
    std::memcpy(index.bytes.data(), &d->heuristic_engine, 8);
    FakeCudnnAttr graph{CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
                        CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        1,
                        {},
                        {d->heuristic_graph}};
    engine->attrs = {std::move(graph), std::move(index)};
    engine->finalized = true;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT && type == CUDNN_TYPE_INT64)
    return give({state().engine_count}, 8);
  if (name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX && type == CUDNN_TYPE_INT64 &&
      d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR)
    return give({index_of(d)}, 8);
  if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE && type == CUDNN_TYPE_INT64) {
    auto it = state().workspace.find(index_of(engine_of(d)));
    return give({it != state().workspace.end() ? it->second : 0}, 8);
  }
  if ((name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE && type == CUDNN_TYPE_NUMERICAL_NOTE) ||
      (name == CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE && type == CUDNN_TYPE_BEHAVIOR_NOTE)) {
    auto& notes =
        name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE ? state().numerical_notes : state().behavior_notes;
    auto it = notes.find(index_of(d));
    std::vector<int64_t> v;
    if (it != notes.end()) v.assign(it->second.begin(), it->second.end());
    return give(v, 4);
  }
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "fake: attribute " + std::to_string(name));
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack) {
  std::lock_guard lock(state().mutex);
  Handle* h = handle_of(handle, "cudnnBackendExecute");
  const FakeCudnnDescriptor* p = descriptor_of(plan);
  const FakeCudnnDescriptor* v = descriptor_of(pack);
  if (h == nullptr || p == nullptr || v == nullptr || !p->finalized || !v->finalized ||
      p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR ||
      v->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
    state().misuses.push_back("cudnnBackendExecute without a live handle, plan and pack");
    return fail(CUDNN_STATUS_BAD_PARAM, "fake: bad execute");
  }
  FakeCudnnExecute e;
  e.handle = id(handle);
  e.plan = id(plan);
  e.gpu = current_gpu();
  e.stream = h->stream;
  if (const FakeCudnnAttr* a = v->find(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS))
    for (int64_t i = 0; i < a->count; ++i) e.uids.push_back(a->value<int64_t>(i));
  if (const FakeCudnnAttr* a = v->find(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS))
    for (int64_t i = 0; i < a->count; ++i) e.pointers.push_back(a->value<uintptr_t>(i));
  if (const FakeCudnnAttr* a = v->find(CUDNN_ATTR_VARIANT_PACK_WORKSPACE))
    e.workspace = a->value<uintptr_t>();
  for (size_t i = 0; i < e.uids.size() && i < e.pointers.size(); ++i) {
    if (state().host_uids.count(e.uids[i]) == 0) continue;
    float value;
    __builtin_memcpy(&value, reinterpret_cast<const void*>(e.pointers[i]), sizeof(value));
    e.host_values[e.uids[i]] = value;
  }
  state().executes.push_back(e);
  if (state().execute_result != 0)
    return fail(static_cast<cudnnStatus_t>(state().execute_result), state().execute_message);
  return CUDNN_STATUS_SUCCESS;
}

// ---- Legacy API ----

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  std::lock_guard lock(state().mutex);
  const uintptr_t v = next_legacy += 16;
  tensors()[v] = {};
  ++state().legacy_descriptors_live;
  *d = reinterpret_cast<cudnnTensorDescriptor_t>(v);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t d, cudnnDataType_t type, int rank,
                                         const int dims[], const int strides[]) {
  std::lock_guard lock(state().mutex);
  auto it = tensors().find(id(d));
  if (it == tensors().end()) return CUDNN_STATUS_BAD_PARAM;
  it->second = {type, std::vector<int>(dims, dims + rank),
                std::vector<int>(strides, strides + rank)};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  std::lock_guard lock(state().mutex);
  if (tensors().erase(id(d)) != 1) return CUDNN_STATUS_BAD_PARAM;
  --state().legacy_descriptors_live;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* d) {
  std::lock_guard lock(state().mutex);
  const uintptr_t v = next_legacy += 16;
  poolings()[v] = {};
  ++state().legacy_descriptors_live;
  *d = reinterpret_cast<cudnnPoolingDescriptor_t>(v);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t d, const cudnnPoolingMode_t mode,
                                          const cudnnNanPropagation_t nan, int rank,
                                          const int window[], const int pad[], const int stride[]) {
  std::lock_guard lock(state().mutex);
  auto it = poolings().find(id(d));
  if (it == poolings().end()) return CUDNN_STATUS_BAD_PARAM;
  it->second = {mode,
                nan,
                rank,
                std::vector<int>(window, window + rank),
                std::vector<int>(pad, pad + rank),
                std::vector<int>(stride, stride + rank)};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) {
  std::lock_guard lock(state().mutex);
  if (poolings().erase(id(d)) != 1) return CUDNN_STATUS_BAD_PARAM;
  --state().legacy_descriptors_live;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* d) {
  std::lock_guard lock(state().mutex);
  const uintptr_t v = next_legacy += 16;
  activations()[v] = {};
  ++state().legacy_descriptors_live;
  *d = reinterpret_cast<cudnnActivationDescriptor_t>(v);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d,
                                           cudnnActivationMode_t mode, cudnnNanPropagation_t nan,
                                           double coef) {
  std::lock_guard lock(state().mutex);
  auto it = activations().find(id(d));
  if (it == activations().end()) return CUDNN_STATUS_BAD_PARAM;
  it->second = {mode, nan, coef};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d) {
  std::lock_guard lock(state().mutex);
  if (activations().erase(id(d)) != 1) return CUDNN_STATUS_BAD_PARAM;
  --state().legacy_descriptors_live;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnTensorDescriptor_t yDesc,
    void* y, const cudnnTensorDescriptor_t bnDesc, const void* scale, const void* bias,
    const void* mean, const void* variance, double epsilon) {
  std::lock_guard lock(state().mutex);
  const FakeCudnnTensor* xt = tensor(xDesc, "cudnnBatchNormalizationForwardInference");
  FakeCudnnLegacyCall c = begin("cudnnBatchNormalizationForwardInference", handle, alpha, beta,
                                xt != nullptr ? xt->data_type : 0);
  add_tensor(c, xDesc, x);
  add_tensor(c, yDesc, y);
  add_tensor(c, bnDesc, scale);
  for (const void* p : {bias, mean, variance}) c.pointers.push_back(reinterpret_cast<uintptr_t>(p));
  c.mode = mode;
  c.epsilon = epsilon;
  state().legacy.push_back(c);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t pooling,
                                  const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                  const void* x, const void* beta,
                                  const cudnnTensorDescriptor_t yDesc, void* y) {
  std::lock_guard lock(state().mutex);
  const FakeCudnnTensor* xt = tensor(xDesc, "cudnnPoolingForward");
  FakeCudnnLegacyCall c =
      begin("cudnnPoolingForward", handle, alpha, beta, xt != nullptr ? xt->data_type : 0);
  add_tensor(c, xDesc, x);
  add_tensor(c, yDesc, y);
  auto it = poolings().find(id(pooling));
  if (it == poolings().end()) return CUDNN_STATUS_BAD_PARAM;
  c.mode = it->second.mode;
  c.nan_propagation = it->second.nan;
  c.spatial = it->second.spatial;
  c.window = it->second.window;
  c.pad = it->second.pad;
  c.stride = it->second.stride;
  state().legacy.push_back(c);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle, cudnnActivationDescriptor_t activation,
                                     const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                     const void* x, const void* beta,
                                     const cudnnTensorDescriptor_t yDesc, void* y) {
  std::lock_guard lock(state().mutex);
  const FakeCudnnTensor* xt = tensor(xDesc, "cudnnActivationForward");
  FakeCudnnLegacyCall c =
      begin("cudnnActivationForward", handle, alpha, beta, xt != nullptr ? xt->data_type : 0);
  add_tensor(c, xDesc, x);
  add_tensor(c, yDesc, y);
  auto it = activations().find(id(activation));
  if (it == activations().end()) return CUDNN_STATUS_BAD_PARAM;
  c.mode = it->second.mode;
  c.nan_propagation = it->second.nan;
  c.coef = it->second.coef;
  state().legacy.push_back(c);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algorithm,
                                  cudnnSoftmaxMode_t mode, const void* alpha,
                                  const cudnnTensorDescriptor_t xDesc, const void* x,
                                  const void* beta, const cudnnTensorDescriptor_t yDesc, void* y) {
  std::lock_guard lock(state().mutex);
  const FakeCudnnTensor* xt = tensor(xDesc, "cudnnSoftmaxForward");
  FakeCudnnLegacyCall c =
      begin("cudnnSoftmaxForward", handle, alpha, beta, xt != nullptr ? xt->data_type : 0);
  add_tensor(c, xDesc, x);
  add_tensor(c, yDesc, y);
  c.algorithm = algorithm;
  c.mode = mode;
  state().legacy.push_back(c);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha,
                             const cudnnTensorDescriptor_t aDesc, const void* A, const void* beta,
                             const cudnnTensorDescriptor_t cDesc, void* C) {
  std::lock_guard lock(state().mutex);
  const FakeCudnnTensor* ct = tensor(cDesc, "cudnnAddTensor");
  FakeCudnnLegacyCall c =
      begin("cudnnAddTensor", handle, alpha, beta, ct != nullptr ? ct->data_type : 0);
  add_tensor(c, aDesc, A);
  add_tensor(c, cDesc, C);
  state().legacy.push_back(c);
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
