// What the libcuda.so.1 stand-in (target hibercuda_driver) does itself: nothing but say that the
// shim is missing. Its entry points (generated from the toolkit's libcuda stub) are found only
// when libhibercuda.so is not loaded; when it is, the loader binds every name to the shim's
// definition instead (the preloaded shim comes first in the search order, and the stand-in is
// an auxiliary filter of libcudart.so.13, the shim's soname), so there is one session per
// process, the shim's.
#include <cuda.h>

#include <mutex>

#include <glog/logging.h>

extern "C" int hiber_standin_without_shim(const char* name) {
  static std::once_flag logged;
  std::call_once(logged, [name] {
    LOG(ERROR) << "libcuda.so.1 is Hiber's stand-in for the NVIDIA driver, and libhibercuda.so is "
                  "not loaded: "
               << name
               << " and every other driver call fail with CUDA_ERROR_STUB_LIBRARY. Preload the "
                  "shim: LD_PRELOAD=<folder of libhibercuda.so>/libhibercuda.so";
  });
  return CUDA_ERROR_STUB_LIBRARY;
}
