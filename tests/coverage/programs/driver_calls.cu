// hiber-coverage's test program (built, never run): linked with -lcuda, so its driver calls are
// unversioned imports from libcuda.so.1: cuInit and cuMemAlloc_v2, which libhibercuda.so
// remotes, and cuGraphCreate, which it only stubs.
#include <cuda.h>

#include <cstdio>

int main() {
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  CUdeviceptr pointer;
  CUresult alloc = cuMemAlloc(&pointer, 4);
  CUgraph graph;
  CUresult graph_create = cuGraphCreate(&graph, 0);
  std::printf("driver_calls: cuMemAlloc -> %d, cuGraphCreate -> %d\n", static_cast<int>(alloc),
              static_cast<int>(graph_create));
  return 0;
}
