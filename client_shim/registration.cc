// The entry points nvcc emits into every binary: fatbin and kernel registration at start-up,
// and the launch sequence of the <<<...>>> syntax. They are declared in crt/host_runtime.h and
// crt/device_functions.h, which only compile inside nvcc, so the signatures are spelled here.
#include <cuda_runtime_api.h>

#include "client_shim/api_support.h"
#include "client_shim/cudart_entry_decls.h"
#include "client_shim/runtime_private_abi.h"

using hiber::shim::Client;
using hiber::shim::ModuleObj;

namespace hiber::shim {
cudaError_t launch_registered(const void* kernel, dim3 grid, dim3 block, void** args, size_t shared,
                              cudaStream_t stream);
}

namespace {
// What a handle of a fatbin that could not be registered points at: its kernels are unknown,
// so launching them fails with cudaErrorInvalidDeviceFunction.
ModuleObj* const kRejectedFatbin = nullptr;
}  // namespace

void** hiber_entry::__cudaRegisterFatBinary(void* fatbin) {
  auto module = Client::get().register_fatbin(fatbin);
  if (!module.ok()) {
    LOG(ERROR) << "hibercuda: __cudaRegisterFatBinary: " << module.status().message()
               << "; kernels of this binary cannot be launched";
    static ModuleObj* rejected = kRejectedFatbin;
    return reinterpret_cast<void**>(&rejected);
  }
  return reinterpret_cast<void**>(*module);
}

void hiber_entry::__cudaRegisterFatBinaryEnd(void**) {}

void hiber_entry::__cudaUnregisterFatBinary(void** handle) {
  auto module = Client::get().module(handle);
  if (module.ok()) Client::get().unregister_fatbin(*module);
}

void hiber_entry::__cudaRegisterFunction(void** handle, const char* host_function,
                                         char* device_function, const char* device_name, int,
                                         uint3*, uint3*, dim3*, dim3*, int*) {
  auto module = Client::get().module(handle);
  if (!module.ok()) return;  // a rejected fatbin, already reported
  (void)device_function;
  Client::get().register_function(*module, host_function, device_name);
}

// Device variables are recorded by nobody yet: every API that would use them
// (cudaMemcpyToSymbol, cudaGetSymbolAddress, ...) is unsupported and fails loudly.
void hiber_entry::__cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}

char hiber_entry::__cudaInitModule(void**) { return 1; }

cudaError_t hiber_entry::__cudaGetKernel(cudaKernel_t* kernel, const void* host_function) {
  if (kernel == nullptr) return cudaErrorInvalidValue;
  auto found = Client::get().kernel_for_host_function(host_function);
  if (!found.ok()) {
    *kernel = nullptr;
    return hiber::shim::fail<cudaError_t>(
        "__cudaGetKernel",
        hiber::Status(static_cast<hiber::ErrorCode>(cudaErrorInvalidDeviceFunction),
                      found.status().message()));
  }
  *kernel = reinterpret_cast<cudaKernel_t>(*found);
  return cudaSuccess;
}

cudaError_t hiber_entry::__cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                            size_t shared, cudaStream_t stream) {
  return hiber::shim::launch_registered(kernel, grid, block, args, shared, stream);
}

cudaError_t hiber_entry::__cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block,
                                                 void** args, size_t shared, cudaStream_t stream) {
  return hiber::shim::launch_registered(kernel, grid, block, args, shared, stream);
}

unsigned hiber_entry::__cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                                  struct CUstream_st* stream) {
  Client::call_configurations().push_back(
      {{grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, shared, stream});
  return 0;
}

cudaError_t hiber_entry::__cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared,
                                                    void* stream) {
  auto& stack = Client::call_configurations();
  if (stack.empty()) return cudaErrorMissingConfiguration;
  const auto c = stack.back();
  stack.pop_back();
  *grid = dim3(c.grid.x, c.grid.y, c.grid.z);
  *block = dim3(c.block.x, c.block.y, c.block.z);
  *shared = c.shared_bytes;
  *static_cast<void**>(stream) = c.stream;
  return cudaSuccess;
}
