// A fake libcudnn.so.9 for testing the CUDA backend's cuDNN calls (server/device/cuda_dnn.cc) on
// machines without a GPU, next to the fake libcuda.so.1 (fake_cuda.h).
//
// The fake (fake_libcudnn.cc, built as <build>/tests/gpu/fake_cudnn/libcudnn.so.9) exports the
// cuDNN entry points the backend resolves and records what it is asked: handles created and
// destroyed (with the GPU whose context was current, from the fake libcuda), every backend
// descriptor with the attributes set on it (descriptor-typed ones as the descriptors they name),
// whether it was finalized and destroyed, every execution with its handle's stream and its
// variant pack, and every legacy call with its descriptors' contents and scalars. It enforces
// what cuDNN enforces and the backend relies on: attributes only before finalization, references
// only to live finalized descriptors, a live handle on operation graphs and plans, and every call
// on a handle with its GPU's context current (wrong_context_calls). Descriptors and handles are
// numbers, never dereferenced. It computes nothing: the gpu tests check the real library.
// Tests reach the state with dlsym(dlopen(<its path>, RTLD_NOLOAD), "fake_cudnn").
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

struct FakeCudnnAttr {
  int name = 0;
  int type = 0;  // cudnnBackendAttributeType_t
  int64_t count = 0;
  std::vector<std::byte> bytes;  // not for descriptor-typed attributes
  std::vector<uintptr_t> refs;   // CUDNN_TYPE_BACKEND_DESCRIPTOR: the descriptors named
  template <typename T>
  T value(size_t i = 0) const {
    T v{};
    if ((i + 1) * sizeof(T) <= bytes.size())
      __builtin_memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    return v;
  }
};

struct FakeCudnnDescriptor {
  uintptr_t id = 0;                  // the cudnnBackendDescriptor_t
  int type = 0;                      // cudnnBackendDescriptorType_t
  int gpu = -1;                      // the context current at creation
  std::vector<FakeCudnnAttr> attrs;  // the last value of each attribute set
  bool finalized = false;
  bool destroyed = false;
  // An ENGINECFG filled by CUDNN_ATTR_ENGINEHEUR_RESULTS: its engine's global index and graph.
  int64_t heuristic_engine = -1;
  uintptr_t heuristic_graph = 0;
  const FakeCudnnAttr* find(int name) const {
    for (const FakeCudnnAttr& a : attrs)
      if (a.name == name) return &a;
    return nullptr;
  }
};

struct FakeCudnnHandleEvent {
  uintptr_t handle = 0;
  int gpu = -1;
};

struct FakeCudnnExecute {
  uintptr_t handle = 0, plan = 0;
  int gpu = -1;
  CUstream stream = nullptr;  // the handle's stream at the call
  std::vector<int64_t> uids;
  std::vector<uintptr_t> pointers;
  uintptr_t workspace = 0;
  // The float at the pointer of each uid in FakeCudnn::host_uids, read during the call as cuDNN
  // reads a by-value tensor's host memory.
  std::map<int64_t, float> host_values;
};

struct FakeCudnnTensor {
  int data_type = 0;
  std::vector<int> dims, strides;
};

struct FakeCudnnLegacyCall {
  std::string call;
  uintptr_t handle = 0;
  int gpu = -1;
  CUstream stream = nullptr;
  std::vector<FakeCudnnTensor> tensors;  // in the call's order
  std::vector<uintptr_t> pointers;       // in the call's order
  // alpha and beta, read as float or double by the data type cuDNN reads them with.
  double alpha = 0, beta = 0;
  bool scalars_as_double = false;
  int mode = -1, algorithm = -1, nan_propagation = -1, spatial = 0;
  double coef = 0, epsilon = 0;
  std::vector<int> window, pad, stride;
};

struct FakeCudnn {
  std::mutex mutex;  // guards everything below; tests lock it too
  // Behaviour, set by tests.
  int64_t engine_count = 3;               // CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT
  std::set<int64_t> unsupported_engines;  // their ENGINE finalization fails, NOT_SUPPORTED
  std::set<int64_t> plan_fails;           // their EXECUTION_PLAN finalization fails
  std::map<int64_t, int64_t> workspace;   // a plan's workspace by its engine's global index
  std::map<int64_t, std::vector<int>> numerical_notes, behavior_notes;  // by global index
  // CUDNN_ATTR_ENGINEHEUR_RESULTS: the engine configs' global indices, best first; empty: every
  // engine not in unsupported_engines, in index order.
  std::vector<int64_t> heuristic_order;
  bool heuristic_fails = false;  // ENGINEHEUR finalization fails, NOT_SUPPORTED
  int execute_result = 0;        // cudnnStatus_t of the next executions
  std::string execute_message;
  std::set<int64_t> host_uids;  // variant-pack uids whose pointers are host memory (by value)
  // Records.
  std::vector<FakeCudnnHandleEvent> created, destroyed;
  std::vector<FakeCudnnDescriptor> descriptors;  // every backend descriptor, in creation order
  std::vector<FakeCudnnExecute> executes;
  std::vector<FakeCudnnLegacyCall> legacy;
  int set_stream_calls = 0;
  int legacy_descriptors_live = 0;  // tensor, pooling and activation descriptors not destroyed
  std::vector<std::string> wrong_context_calls;
  std::vector<std::string> misuses;  // what the real cuDNN would refuse or crash on

  const FakeCudnnDescriptor* descriptor(uintptr_t id) const {
    for (const FakeCudnnDescriptor& d : descriptors)
      if (d.id == id) return &d;
    return nullptr;
  }
  size_t count_of(int type) const {
    size_t n = 0;
    for (const FakeCudnnDescriptor& d : descriptors) n += d.type == type ? 1 : 0;
    return n;
  }
  void reset() {
    engine_count = 3;
    unsupported_engines.clear();
    plan_fails.clear();
    workspace.clear();
    numerical_notes.clear();
    behavior_notes.clear();
    heuristic_order.clear();
    heuristic_fails = false;
    execute_result = 0;
    execute_message.clear();
    host_uids.clear();
    created.clear();
    destroyed.clear();
    descriptors.clear();
    executes.clear();
    legacy.clear();
    set_stream_calls = 0;
    wrong_context_calls.clear();
    misuses.clear();
  }
};

extern "C" FakeCudnn* fake_cudnn();
