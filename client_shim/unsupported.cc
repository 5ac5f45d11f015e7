#include <glog/logging.h>

#include <mutex>
#include <set>
#include <string>

#include "client_shim/api_support.h"

// Every exported name of the real libcudart.so.13 and libcuda.so.1 has a weak stub
// (generated: unsupported_stubs.c) that lands here unless the shim implements it.
extern "C" int hiber_shim_unsupported(const char* name) {
  static std::mutex mu;
  static std::set<std::string> reported;
  {
    std::lock_guard lock(mu);
    if (reported.insert(name).second) {
      LOG(ERROR) << "hibercuda: " << name << " is not supported by Hiber; it returns "
                 << "the \"not supported\" error (801)";
    }
  }
  hiber::shim::thread_last_error() = 801;  // cudaErrorNotSupported == CUDA_ERROR_NOT_SUPPORTED
  return 801;
}
