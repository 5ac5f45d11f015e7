// hiber-coverage's test program (built, never run): linked with -lcublas, so cublasCreate_v2 and
// cublasDestroy_v2 are imports from libcublas.so.13, next to runtime calls.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 1;
  cublasHandle_t handle;
  cublasStatus_t status = cublasCreate(&handle);
  if (status == CUBLAS_STATUS_SUCCESS) cublasDestroy(handle);
  std::printf("cublas_create: cublasCreate -> %d\n", static_cast<int>(status));
  return status == CUBLAS_STATUS_SUCCESS ? 0 : 1;
}
