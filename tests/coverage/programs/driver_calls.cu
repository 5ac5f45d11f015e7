// hiber-coverage's test program (built, never run): linked with -lcuda, so its driver calls are
// unversioned imports from libcuda.so.1: cuInit and cuMemAlloc_v2, which libhibercuda.so
// remotes, cuGetErrorName, which it answers locally, cuMemHostGetDevicePointer_v2 and
// cuModuleGetGlobal_v2, which it refuses, and cuGraphCreate, which it only stubs.
#include <cuda.h>

#include <cstdio>

int main() {
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  CUdeviceptr pointer;
  CUresult alloc = cuMemAlloc(&pointer, 4);
  CUgraph graph;
  CUresult graph_create = cuGraphCreate(&graph, 0);
  const char* name = nullptr;
  cuGetErrorName(graph_create, &name);
  static char host[64];
  CUdeviceptr mapped = 0;
  CUresult map = cuMemHostGetDevicePointer(&mapped, host, 0);
  CUdeviceptr global = 0;
  size_t global_bytes = 0;
  CUresult get_global = cuModuleGetGlobal(&global, &global_bytes, nullptr, "value");
  std::printf(
      "driver_calls: cuMemAlloc -> %d, cuGraphCreate -> %d (%s), mapping -> %d, global -> "
      "%d\n",
      static_cast<int>(alloc), static_cast<int>(graph_create), name ? name : "?",
      static_cast<int>(map), static_cast<int>(get_global));
  return 0;
}
