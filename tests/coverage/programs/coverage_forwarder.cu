// hiber-coverage's test library (built, never run): libcoverage_forwarder.so imports
// cudaCreateTextureObject (a stub in libhibercuda.so) on behalf of transitive_user, which needs
// only it.
#include <cuda_runtime.h>

extern "C" int coverage_forwarder_texture_status() {
  cudaResourceDesc resource{};
  cudaTextureDesc texture{};
  cudaTextureObject_t object = 0;
  cudaError_t err = cudaCreateTextureObject(&object, &resource, &texture, nullptr);
  if (err == cudaSuccess) cudaDestroyTextureObject(object);
  return static_cast<int>(err);
}
