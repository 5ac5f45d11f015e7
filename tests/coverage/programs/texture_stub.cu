// hiber-coverage's test program (built, never run): imports cudaCreateTextureObject and
// cudaDestroyTextureObject, which libhibercuda.so has only as stubs (texture objects are not
// remoted), next to calls it remotes.
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 1;
  cudaResourceDesc resource{};
  cudaTextureDesc texture{};
  cudaTextureObject_t object = 0;
  cudaError_t err = cudaCreateTextureObject(&object, &resource, &texture, nullptr);
  if (err == cudaSuccess) cudaDestroyTextureObject(object);
  std::printf("texture_stub: cudaCreateTextureObject -> %s\n", cudaGetErrorName(err));
  return err == cudaSuccess ? 0 : 1;
}
