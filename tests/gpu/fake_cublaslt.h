// A fake libcublasLt.so.13 for testing the CUDA backend's cuBLASLt calls (server/device/
// cuda_blaslt.cc) on machines without a GPU, next to the fake libcuda.so.1 (fake_cuda.h) and the
// fake libcublas.so.13 (fake_cublas.h).
//
// The fake (fake_libcublaslt.cc, built as <build>/tests/gpu/fake_cublas/libcublasLt.so.13) exports
// the cuBLASLt entry points the backend resolves. Descriptors are real objects holding every
// attribute set on them, with cuBLASLt's sizes (a set of another size is refused, as the library
// refuses it). It records which handles are created and destroyed with which GPU's context
// current, every heuristic query (the descriptors' attributes, the preference, and the algorithms
// returned) and every matmul (the descriptors' attributes at the call, scalars, pointers, the
// algorithm's bytes, the workspace and the stream). Its heuristic returns `algos_offered`
// algorithms whose bytes name the query (a serial number), the result index and the GPU.
// It computes nothing. Tests reach the state with dlsym(dlopen(<its path>, RTLD_NOLOAD),
// "fake_cublaslt").
#pragma once

#include <cublasLt.h>
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

struct FakeLtDesc {
  int compute_type = 0, scale_type = 0;
  int32_t pointer_mode = 0, transa = 0, transb = 0, transc = 0;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  uintptr_t bias = 0;
  int64_t bias_batch_stride = 0;
  int32_t bias_type = -1;
  bool transc_set = false;  // TRANSC was set at all (hiberd leaves it at its default)
};

struct FakeLtLayout {
  int type = 0;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch_count = 1;
  int64_t batch_offset = 0;
};

struct FakeLtHandleEvent {
  uintptr_t handle = 0;
  int gpu = -1;  // whose context was current
};

struct FakeLtHeuristic {
  uintptr_t handle = 0;
  int gpu = -1;  // current context at the call
  FakeLtDesc desc;
  FakeLtLayout a, b, c, d;
  uint64_t max_workspace = 0;
  uint32_t min_alignment[4] = {};
  uint32_t reduction_mask = 0;
  int requested = 0;
  std::vector<cublasLtMatmulAlgo_t> returned;
};

struct FakeLtMatmul {
  uintptr_t handle = 0;
  int gpu = -1;
  CUstream stream = nullptr;
  FakeLtDesc desc;
  FakeLtLayout a, b, c, d;
  // Host pointer mode: the first 16 bytes at alpha and beta (read during the call); device mode:
  // the addresses, never dereferenced.
  std::byte alpha[16] = {}, beta[16] = {};
  uintptr_t alpha_ptr = 0, beta_ptr = 0;
  uintptr_t pa = 0, pb = 0, pc = 0, pd = 0;
  bool has_algo = false;
  cublasLtMatmulAlgo_t algo{};
  uintptr_t workspace = 0;
  size_t workspace_bytes = 0;
};

// The bytes of the algorithm the fake's heuristic returns as result `index` of query `serial`
// (1, 2, ...) on `gpu`; CUBLASLT_ALGO_CONFIG_ID reads data[0].
inline cublasLtMatmulAlgo_t fake_lt_algo(uint64_t serial, int index, int gpu) {
  cublasLtMatmulAlgo_t algo{};
  algo.data[0] = 100 + static_cast<uint64_t>(index);
  algo.data[1] = serial;
  algo.data[2] = static_cast<uint64_t>(gpu);
  algo.data[7] = 0xFA4EA160;  // the rest of the 64 bytes matters too
  return algo;
}

struct FakeCublasLt {
  std::mutex mutex;  // guards everything below; tests lock it too
  std::vector<FakeLtHandleEvent> created;
  std::vector<FakeLtHandleEvent> destroyed;
  int descs_live = 0, layouts_live = 0, preferences_live = 0;  // created minus destroyed
  int descs_created = 0;
  std::vector<FakeLtHeuristic> heuristics;
  std::vector<FakeLtMatmul> matmuls;
  int algos_offered = 3;  // how many results a heuristic query returns at most (0: NOT_SUPPORTED)
  // Calls on a handle while another GPU's context (or none) is current.
  std::vector<std::string> wrong_context_calls;
};

extern "C" FakeCublasLt* fake_cublaslt();
