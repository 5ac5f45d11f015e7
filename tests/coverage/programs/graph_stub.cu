// hiber-coverage's test program (built, never run): imports cudaGraphCreate and cudaGraphDestroy,
// which libhibercuda.so has only as stubs (graphs are not remoted), next to calls it remotes.
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 1;
  cudaGraph_t graph;
  cudaError_t err = cudaGraphCreate(&graph, 0);
  if (err == cudaSuccess) cudaGraphDestroy(graph);
  std::printf("graph_stub: cudaGraphCreate -> %s\n", cudaGetErrorName(err));
  return err == cudaSuccess ? 0 : 1;
}
