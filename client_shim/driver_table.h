// Lookups shared by the runtime and driver front-ends.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// cuGetProcAddress's table (generated: driver_procs.c, cmake/HiberEntryPoints.cmake): each
// driver function by its base name and the CUDA version that introduced each of its ABIs, as
// cudaTypedefs.h declares them (PFN_cuCtxCreate_v3020 is cuCtxCreate_v2), sorted by base name,
// then version. `address` is the shim's definition: its body, or its loudly failing stub.
struct HiberDriverProc {
  const char* base;
  int version;
  const char* symbol;
  void* address;
};
extern const struct HiberDriverProc hiber_driver_procs[];
extern const unsigned hiber_driver_proc_count;

#ifdef __cplusplus
}

namespace hiber::shim {

// The shim's definition of a driver function by its base name as cuGetProcAddress and
// cudaGetDriverEntryPoint take it: the ABI of the newest version not newer than `cuda_version`.
// nullptr if the driver has no such function, or none that old.
void* driver_entry_point(const char* symbol, int cuda_version);

// Names and descriptions of error codes (generated from the toolkit's headers).
const char* runtime_error_name(int code);
const char* runtime_error_string(int code);
const char* driver_error_name(int code);

}  // namespace hiber::shim
#endif
