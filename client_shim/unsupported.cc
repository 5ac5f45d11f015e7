#include <glog/logging.h>

#include <mutex>
#include <set>
#include <string>

#include "client_shim/api_support.h"
#include "client_shim/entry_support.h"

// The stub rows of the runtime's and the driver's declaration tables (entry_points/cudart.entries,
// cuda.entries; generated: cudart_stubs.c, cuda_stubs.c) land here.
extern "C" int hiber_shim_unsupported(const char* library, const char* name) {
  hiber::shim::library_trace_stub_call(library, name, 801);
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
