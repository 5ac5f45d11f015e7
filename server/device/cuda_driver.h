// The CUDA Driver API entry points the CUDA backend uses, resolved at run time.
//
// Nothing here links against libcuda: libcuda.so.1 is opened with dlopen, only
// `cuGetProcAddress_v2` is taken with dlsym, and every other entry point is asked of
// cuGetProcAddress at the explicit CUDA version whose ABI we call (as NCCL's cudawrap.h does).
// Asking by version, not by symbol name, is what keeps us on the ABI we compiled against when a
// newer driver adds `_v2`/`_v3` variants of a function.
//
// HIBER_CUDA_DRIVER_ENTRY_POINTS is the single source of truth: one row per entry point,
// (name, version). It expands to
//   - the function-pointer members of CudaDriver, typed PFN_<name>_v<version> (cudaTypedefs.h);
//   - the resolver loop in cuda_driver.cc;
//   - a static_assert per row that PFN_<name>_v<version> is the type of the function cuda.h
//     declares for <name> (after cuda.h's own `#define cuMemGetInfo cuMemGetInfo_v2` renames),
//     so a version whose ABI differs from the prototype we write calls against fails to compile,
//     and a version that does not exist has no typedef and fails to compile too.
// To add an entry point: add a row with the version of the ABI in cudaTypedefs.h that matches
// the prototype in cuda.h (the highest PFN_<name>_v<N> that is not a _ptds/_ptsz variant).
//
// Names in rows are pasted (pfn_##name) or stringised (#name), never expanded, so cuda.h's
// rename macros do not change them: the driver is asked for "cuMemGetInfo" at 3020, which is
// the ABI cuda.h calls cuMemGetInfo_v2.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>
#include <string_view>

#include "common/status.h"

// clang-format off
#define HIBER_CUDA_DRIVER_ENTRY_POINTS(X)        \
  /* errors; resolved first so later failures can be named */ \
  X(cuGetErrorName, 6000)                        \
  X(cuGetErrorString, 6000)                      \
  /* initialisation and devices */               \
  X(cuInit, 2000)                                \
  X(cuDriverGetVersion, 2020)                    \
  X(cuDeviceGetCount, 2000)                      \
  X(cuDeviceGet, 2000)                           \
  X(cuDeviceGetName, 2000)                       \
  X(cuDeviceGetUuid, 11040) /* _v2: CUDA 13's cuDeviceGetUuid (MIG-aware) */ \
  X(cuDeviceGetPCIBusId, 4010)                   \
  X(cuDeviceTotalMem, 3020)                      \
  X(cuDeviceGetAttribute, 2000)                  \
  X(cuDeviceCanAccessPeer, 4000)                 \
  X(cuDeviceGetP2PAttribute, 8000)               \
  /* contexts */                                 \
  X(cuDevicePrimaryCtxRetain, 7000)              \
  X(cuDevicePrimaryCtxRelease, 11000)            \
  X(cuDevicePrimaryCtxReset, 11000)              \
  X(cuCtxSetCurrent, 4000)                       \
  X(cuCtxCreate, 12050) /* _v4: CUDA 13's cuCtxCreate, with CUctxCreateParams */ \
  X(cuCtxDestroy, 4000)                          \
  X(cuCtxPopCurrent, 4000)                       \
  X(cuCtxSynchronize, 2000)                      \
  X(cuCtxGetStreamPriorityRange, 5050)           \
  X(cuCtxEnablePeerAccess, 4000)                 \
  /* memory */                                   \
  X(cuMemGetInfo, 3020)                          \
  X(cuMemAddressReserve, 10020)                  \
  X(cuMemAddressFree, 10020)                     \
  X(cuMemCreate, 10020)                          \
  X(cuMemRelease, 10020)                         \
  X(cuMemMap, 10020)                             \
  X(cuMemUnmap, 10020)                           \
  X(cuMemSetAccess, 10020)                       \
  X(cuMemGetAccess, 10020) /* tests check what set_access did */ \
  X(cuMemGetAllocationGranularity, 10020)        \
  X(cuMemHostRegister, 6050)                     \
  X(cuMemHostUnregister, 4000)                   \
  /* streams and events */                       \
  X(cuStreamCreateWithPriority, 5050)            \
  X(cuStreamDestroy, 4000)                       \
  X(cuStreamSynchronize, 2000)                   \
  X(cuStreamQuery, 2000)                         \
  X(cuStreamAddCallback, 5000)                   \
  X(cuStreamWaitEvent, 3020)                     \
  X(cuEventCreate, 2000)                         \
  X(cuEventDestroy, 4000)                        \
  X(cuEventRecord, 2000)                         \
  X(cuEventSynchronize, 2000)                    \
  X(cuEventQuery, 2000)                          \
  X(cuEventElapsedTime, 12080) /* _v2: CUDA 13's cuEventElapsedTime */ \
  /* copies and memset */                        \
  X(cuMemcpyHtoDAsync, 3020)                     \
  X(cuMemcpyDtoHAsync, 3020)                     \
  X(cuMemcpyDtoDAsync, 3020)                     \
  X(cuMemcpyPeerAsync, 4000)                     \
  X(cuMemsetD8Async, 3020)                       \
  X(cuMemsetD16Async, 3020)                      \
  X(cuMemsetD32Async, 3020)                      \
  /* code */                                     \
  X(cuLibraryLoadData, 12000)                    \
  X(cuLibraryUnload, 12000)                      \
  X(cuLibraryGetKernel, 12000)                   \
  X(cuKernelGetName, 12030)                      \
  X(cuKernelGetParamInfo, 12040)                 \
  X(cuKernelSetAttribute, 12000) /* dynamic shared memory beyond 48 KiB */ \
  X(cuLaunchKernel, 4000)
// clang-format on

namespace hiber::device::cuda_driver {

// The highest version in the list: the oldest driver that has every entry point we use.
inline constexpr int kRequiredDriverVersion = [] {
  int v = 0;
#define HIBER_CUDA_MAX_VERSION_(name, version) v = v > version ? v : version;
  HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_CUDA_MAX_VERSION_)
#undef HIBER_CUDA_MAX_VERSION_
  return v;
}();

// The loaded driver: one pointer per row of the list, all non-null once loaded.
struct CudaDriver {
#define HIBER_CUDA_PFN_MEMBER_(name, version) PFN_##name##_v##version pfn_##name = nullptr;
  HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_CUDA_PFN_MEMBER_)
#undef HIBER_CUDA_PFN_MEMBER_

  int driver_version = 0;    // cuDriverGetVersion: 13000 for CUDA 13.0
  std::string library_path;  // where libcuda.so.1 was found

  // A Status for a CUresult: success, or the error with the code unchanged (our ErrorCode values
  // are CUresult values) and "<call>: <CUDA_ERROR_NAME> (<description>)" as the message.
  Status check(CUresult result, std::string_view call) const;
};

// Loads libcuda.so.1 and resolves every entry point, once per process (thread-safe); later calls
// return the same driver or the same error. cuInit(0) has been called on success.
// Errors, each one line saying why:
//   kNoDevice      libcuda.so.1 is not there (no NVIDIA driver), or the driver sees no GPU;
//   kStubLibrary   libcuda.so.1 is the CUDA toolkit's stub (lib64/stubs), not a driver;
//   kNotSupported  the driver is older than kRequiredDriverVersion or lacks an entry point;
//   other CUresult codes from cuInit, unchanged (a driver that is installed but broken).
// Once loaded, the library stays open for the life of the process (the driver does not support
// being unloaded); if loading fails it is closed again.
Result<const CudaDriver*> load_driver();

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" from the driver's cuGetErrorName/cuGetErrorString;
// with a null `driver`, just our own name for the code (error_code_name) and no CUDA call, which
// is what stream callbacks and a half-loaded driver must use.
std::string describe_result(const CudaDriver* driver, CUresult result);

}  // namespace hiber::device::cuda_driver
