// dlopen_versions: a framework built for another CUDA or cuDNN major version loads its
// libraries by name; under the preloaded shim each such load must fail, saying which version
// was asked for and which one is served, and never bind the other ABI
// (client_shim/dl_interpose.cc). The versions served are the toolkit's this program is built
// with (CUDART_VERSION, CUDNN_MAJOR); the program links no CUDA library.
//
// Usage: dlopen_versions
#include <cuda_runtime_api.h>
#include <cudnn_version.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "program_util.h"

namespace {

int failures = 0;

// dlopen(name) must fail with a dlerror() that names both `asked` and `served`.
void expect_refused(const std::string& name, const std::string& asked, const std::string& served) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) {
    std::printf("dlopen_versions: WRONG: dlopen(%s) succeeded\n", name.c_str());
    ++failures;
    return;
  }
  const char* why = dlerror();
  const std::string text = why != nullptr ? why : "";
  if (text.find(asked) == std::string::npos || text.find(served) == std::string::npos) {
    std::printf("dlopen_versions: WRONG: dlopen(%s) failed without naming %s and %s: %s\n",
                name.c_str(), asked.c_str(), served.c_str(), text.c_str());
    ++failures;
    return;
  }
  std::printf("dlopen_versions: dlopen(%s) refused: %s\n", name.c_str(), text.c_str());
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int cuda = CUDART_VERSION / 1000;
  const int cudnn = CUDNN_MAJOR;
  const std::string other_cuda = std::to_string(cuda - 1);
  const std::string served_cuda = "CUDA " + std::to_string(cuda) + "'s";
  for (const char* stem : {"libcudart.so.", "libcublas.so.", "libcublasLt.so."}) {
    expect_refused(stem + other_cuda, "CUDA " + other_cuda + "'s", served_cuda);
  }
  // A version too large for any integer type is another version too, not this one wrapped.
  const std::string huge = "4294967296" + std::to_string(cuda);
  expect_refused("libcudart.so." + huge, "CUDA " + huge + "'s", served_cuda);
  const std::string other_cudnn = std::to_string(cudnn - 1);
  const std::string served_cudnn = "cuDNN " + std::to_string(cudnn) + "'s";
  for (const char* stem : {"libcudnn.so.", "libcudnn_ops.so."}) {
    expect_refused(stem + other_cudnn, "cuDNN " + other_cudnn + "'s", served_cudnn);
  }
  // The version served loads (the shim itself), and answers as the runtime.
  const std::string runtime = "libcudart.so." + std::to_string(cuda);
  void* cudart = dlopen(runtime.c_str(), RTLD_NOW | RTLD_LOCAL);
  auto get_version =
      cudart != nullptr
          ? reinterpret_cast<cudaError_t (*)(int*)>(dlsym(cudart, "cudaRuntimeGetVersion"))
          : nullptr;
  int version = 0;
  if (get_version == nullptr || get_version(&version) != cudaSuccess || version / 1000 != cuda) {
    std::printf("dlopen_versions: WRONG: %s did not load as CUDA %d's runtime (%d): %s\n",
                runtime.c_str(), cuda, version, cudart == nullptr ? dlerror() : "");
    ++failures;
  }
  if (failures > 0) return program::kExitMismatch;
  std::printf("dlopen_versions: OK other major versions refused, %s served\n", runtime.c_str());
  return 0;
}
