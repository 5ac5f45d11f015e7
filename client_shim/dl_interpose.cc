// dlopen interposition: a program or library that loads the CUDA runtime or driver by name
// (libcudart.so*, libcuda.so*) gets the shim itself, so its later dlsym calls find the shim's
// functions. cuBLAS and cuDNN reach the driver this way (dlopen("libcuda.so.1") and then
// cuGetProcAddress).
//
// Limitation: the real dlopen resolves a bare name with the RUNPATH of its caller, and the
// caller is now the shim. Libraries loaded by absolute path, or found on the default search
// path, are unaffected.
#include <dlfcn.h>

#include <cstring>

namespace {

using DlopenFn = void* (*)(const char*, int);

DlopenFn real_dlopen() {
  static const auto real = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  return real;
}

bool is_cuda_library(const char* file) {
  const char* slash = std::strrchr(file, '/');
  const char* base = slash ? slash + 1 : file;
  return std::strncmp(base, "libcudart.so", 12) == 0 || std::strncmp(base, "libcuda.so", 10) == 0;
}

const char* shim_path() {
  static const char* path = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&is_cuda_library), &info);
    return info.dli_fname;
  }();
  return path;
}

}  // namespace

#pragma GCC visibility push(default)
extern "C" void* dlopen(const char* file, int mode) {
  DlopenFn real = real_dlopen();
  if (real == nullptr) return nullptr;
  if (file != nullptr && is_cuda_library(file) && shim_path() != nullptr) {
    return real(shim_path(), mode);
  }
  return real(file, mode);
}
#pragma GCC visibility pop
