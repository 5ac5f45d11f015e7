// The driver API through cudaGetDriverEntryPointByVersion, as PyTorch reaches it: programs that
// use it link no libcuda.so.1. For programs that include cuda.h and cuda_runtime.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "program_util.h"

// The driver API through cudaGetDriverEntryPointByVersion, as PyTorch reaches it (the program
// links no libcuda.so.1): DRV(cuInit)(0). The name is the base name, the type this header's ABI,
// so the version asked for is this header's (PyTorch asks for the version it was built against).
template <typename F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &found));
  if (fn == nullptr) {
    std::fprintf(stderr, "no driver entry point %s\n", name);
    std::exit(program::kExitCudaError);
  }
  return reinterpret_cast<F>(fn);
}
#define DRV(name) (driver_entry<decltype(&name)>(#name))

#define CU_CHECK(call)                                                          \
  do {                                                                          \
    const CUresult cu_check_err_ = (call);                                      \
    if (cu_check_err_ != CUDA_SUCCESS) {                                        \
      const char* cu_name_ = nullptr;                                           \
      DRV(cuGetErrorName)(cu_check_err_, &cu_name_);                            \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cu_name_ ? cu_name_ : "?");                                  \
      std::exit(program::kExitCudaError);                                       \
    }                                                                           \
  } while (0)
