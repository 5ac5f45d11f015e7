// What the tests of hiberd's CUDA library backends share: the fake driver loaded first, and the
// fake libraries the backend opened. Each test defines HIBER_FAKE_LIBCUDA
// (tests/gpu/CMakeLists.txt).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "server/device/cuda_device.h"
#include "tests/gpu/fake_cuda.h"

namespace hiber::device {

// Loads the fake driver by path first, so the backend's dlopen("libcuda.so.1") gets it (the
// loader matches loaded libraries by SONAME) whatever driver the machine has.
inline void load_fake_driver() {
  static void* handle = dlopen(HIBER_FAKE_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
}

// The state of a fake library already loaded from `path`, through its accessor `symbol`
// (nullptr where it is not loaded yet).
template <typename Fake>
Fake* loaded_fake(const std::string& path, const char* symbol) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto get = reinterpret_cast<Fake* (*)()>(dlsym(handle, symbol));
  dlclose(handle);
  return get != nullptr ? get() : nullptr;
}

inline FakeCuda* fake_driver() { return loaded_fake<FakeCuda>("libcuda.so.1", "fake_cuda"); }

// Options whose libraries come from `folder` only: the machine's own cuBLAS or cuDNN (the
// toolkit's, in the ldconfig cache) must not be what the test talks to.
inline CudaDeviceOptions options_with_folder(const std::string& folder) {
  CudaDeviceOptions options;
  options.libraries.search_default_path = false;
  options.libraries.folders = {folder};
  return options;
}

}  // namespace hiber::device
