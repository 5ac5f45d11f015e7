// hiber-coverage's test library (built, never run): libcoverage_forwarder.so imports
// cudaGraphCreate (a stub in libhibercuda.so) on behalf of transitive_user, which needs only it.
#include <cuda_runtime.h>

extern "C" int coverage_forwarder_graph_status() {
  cudaGraph_t graph;
  cudaError_t err = cudaGraphCreate(&graph, 0);
  if (err == cudaSuccess) cudaGraphDestroy(graph);
  return static_cast<int>(err);
}
