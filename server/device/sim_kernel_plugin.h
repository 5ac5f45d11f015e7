/* Host implementations of kernels for the simulated GPU.
 *
 * The simulated device loads real fatbins (compiled by nvcc) and finds their kernels and
 * parameter layouts, but it cannot run GPU code. A plugin shared library supplies, for each
 * mangled kernel name, a host function that does the kernel's work over the whole grid. Device
 * pointers in the parameters are valid host addresses in the process running the device, so the
 * host function reads and writes them directly.
 *
 * Isolation. A host function runs in hiberd's process, where every function's mapped blocks are
 * host memory, so the device plays the GPU's MMU in two ways. Before the kernel runs, each
 * 8-byte-aligned word of a parameter that can hold a pointer and that is a device address (it
 * lies in an address range the device reserved) must point into, or one past the end of, memory
 * mapped and accessible from the launch's GPU; else the launch fails with
 * CUDA_ERROR_ILLEGAL_ADDRESS and the kernel never runs. Hiber maps a function's blocks
 * accessible from the GPU it leases only, so that is the calling function's own blocks. And
 * every other range the kernel touches (through a pointer it loaded from device memory, or past
 * what its arguments point at) must be checked with check_access before it is touched: the
 * device cannot see plain loads and stores.
 *
 * A plugin exports one symbol, hiber_sim_kernels_v1, returning its table. Later ABI versions get
 * new symbol names (hiber_sim_kernels_v2, ...), so an old plugin keeps loading.
 *
 * This header is C, so plugins can be written in C or C++.
 */
#ifndef HIBER_SERVER_DEVICE_SIM_KERNEL_PLUGIN_H_
#define HIBER_SERVER_DEVICE_SIM_KERNEL_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct HiberSimDim3 {
  uint32_t x, y, z;
} HiberSimDim3;

typedef struct HiberSimLaunch {
  const char* name; /* the mangled kernel name */
  HiberSimDim3 grid;
  HiberSimDim3 block;
  uint32_t shared_memory_bytes;
  int32_t gpu; /* the simulated GPU running the launch */
  uint32_t param_count;
  void* const* params; /* params[i] points at parameter i, like cuLaunchKernel's kernelParams */
  /* 0 (CUDA_SUCCESS) if [address, address + bytes) is device memory the launch's GPU may
   * access; otherwise CUDA_ERROR_ILLEGAL_ADDRESS, which the kernel returns at once without
   * touching the range. Once refused, the launch fails naming the address, whatever the kernel
   * returns. Thread-safe. Added at the end of the struct, so plugins built before it still load
   * (and do not check). */
  int (*check_access)(const struct HiberSimLaunch* launch, const void* address, uint64_t bytes);
  void* device_context; /* for check_access only */
} HiberSimLaunch;

/* Runs the whole grid. Returns 0 (CUDA_SUCCESS) or a CUresult value, which becomes the error of
 * the launch. A fault on a device address that is not mapped becomes CUDA_ERROR_ILLEGAL_ADDRESS. */
typedef int (*HiberSimKernelFn)(const HiberSimLaunch* launch);

typedef struct HiberSimKernel {
  const char* mangled_name;
  HiberSimKernelFn run;
} HiberSimKernel;

/* Exported by every plugin: its kernels, valid for as long as the plugin is loaded. */
typedef const HiberSimKernel* (*HiberSimKernelsV1Fn)(size_t* count);
#define HIBER_SIM_KERNELS_V1_SYMBOL "hiber_sim_kernels_v1"

#ifdef __cplusplus
}
#define HIBER_SIM_EXTERN_C_ extern "C"
#else
#define HIBER_SIM_EXTERN_C_
#endif

/* Defines a plugin's hiber_sim_kernels_v1 over its table, an array of HiberSimKernel:
 *   static const HiberSimKernel kKernels[] = {{"_Z4noopv", noop}};
 *   HIBER_SIM_KERNELS_V1(kKernels)
 * It exports that one symbol even where the plugin is built with hidden visibility. */
#define HIBER_SIM_KERNELS_V1(table)                                                \
  HIBER_SIM_EXTERN_C_ __attribute__((visibility("default"))) const HiberSimKernel* \
  hiber_sim_kernels_v1(size_t* count) {                                            \
    *count = sizeof(table) / sizeof((table)[0]);                                   \
    return table;                                                                  \
  }

#endif /* HIBER_SERVER_DEVICE_SIM_KERNEL_PLUGIN_H_ */
