// A library with a RUNPATH ($ORIGIN/rpath_dir) that dlopens a library by bare name, as
// libtorch_cuda.so dlopens libnvrtc.so.13 from the nvidia wheel folders its RPATH names. Under the
// preloaded shim the dlopen is interposed, and must still search this library's RUNPATH.
#include <dlfcn.h>

#include <cstdio>

extern "C" __attribute__((visibility("default"))) int hiber_rpath_caller_load() {
  void* target = dlopen("libhiber_rpath_target.so", RTLD_NOW);
  if (target == nullptr) {
    std::fprintf(stderr, "rpath_caller: dlopen(libhiber_rpath_target.so): %s\n", dlerror());
    return -1;
  }
  auto value = reinterpret_cast<int (*)()>(dlsym(target, "hiber_rpath_target_value"));
  return value ? value() : -2;
}
