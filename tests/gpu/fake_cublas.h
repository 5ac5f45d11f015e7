// A fake libcublas.so.13 for testing the CUDA backend's library calls (server/device/
// cuda_libraries.cc) on machines without a GPU, next to the fake libcuda.so.1 (fake_cuda.h).
//
// The fake (fake_libcublas.cc, built as <build>/tests/gpu/fake_cublas/libcublas.so.13) exports the
// cuBLAS entry points the backend resolves and records what it is asked: which handles are
// created and destroyed and with which GPU's context current (asked of the fake libcuda through
// fake_cuda_current_gpu), and every GEMM with the settings its handle had at that moment (stream,
// workspace, math, atomics and pointer modes) and its scalars: in host pointer mode their bytes,
// read during the call as cuBLAS does; in device pointer mode the addresses, never dereferenced.
// It computes nothing; whether the real library does what the fake records is for the gpu tests.
// Tests reach the state with dlsym(dlopen(<its path>, RTLD_NOLOAD), "fake_cublas").
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

struct FakeCublasHandleEvent {
  uintptr_t handle = 0;
  int gpu = -1;  // whose context was current
};

struct FakeCublasGemm {
  std::string call;  // "cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasGemmBatchedEx"
  uintptr_t handle = 0;
  int gpu = -1;  // current context at the call
  // The handle's settings at the call.
  CUstream stream = nullptr;
  uintptr_t workspace = 0;
  size_t workspace_bytes = 0;  // 0: cuBLAS's own pool
  int math_mode = 0, atomics_mode = 0, pointer_mode = 0;
  // Host pointer mode: the first 16 bytes at alpha and beta; device mode: the addresses.
  std::byte alpha[16] = {}, beta[16] = {};
  uintptr_t alpha_ptr = 0, beta_ptr = 0;
  int transa = 0, transb = 0, m = 0, n = 0, k = 0;
  uintptr_t a = 0, b = 0, c = 0;
  int a_type = 0, b_type = 0, c_type = 0, compute_type = 0, algo = 0;
  int lda = 0, ldb = 0, ldc = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  int batch_count = 1;
};

struct FakeCublas {
  std::mutex mutex;  // guards everything below; tests lock it too
  std::vector<FakeCublasHandleEvent> created;
  std::vector<FakeCublasHandleEvent> destroyed;
  std::vector<FakeCublasGemm> gemms;
  int set_stream_calls = 0;
  // Calls on a handle while another GPU's context (or none) is current.
  std::vector<std::string> wrong_context_calls;
};

extern "C" FakeCublas* fake_cublas();
