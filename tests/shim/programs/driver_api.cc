// A driver-API program linked the ordinary way, with -lcuda and no CUDA runtime (nvcc -cudart
// none): its only CUDA dependency is NEEDED libcuda.so.1, so it starts only where a file of that
// name is found. On a node without the NVIDIA driver that is Hiber's stand-in
// (client_shim/driver/libcuda.so.1), with libhibercuda.so preloaded.
//
// Usage: driver_api <ptx file of ptx_affine.cu> [n]
//
// It loads the PTX with cuModuleLoadData, runs hiber_ptx_affine (y = a*x + b) on n elements and
// compares with the CPU. It also checks that a dlopen of "libcuda.so.1" and a lookup in the
// loaded libcuda.so.1 itself give the functions the program calls. Besides the summary line it
// prints which file was loaded as libcuda.so.1 and which file its driver calls run in, for the
// test to check against the stand-in and the shim.
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "program_util.h"

#define CU_CHECK(call)                                                               \
  do {                                                                               \
    const CUresult cu_check_err_ = (call);                                           \
    if (cu_check_err_ != CUDA_SUCCESS) {                                             \
      const char* name = nullptr;                                                    \
      cuGetErrorName(cu_check_err_, &name);                                          \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call, \
                   name ? name : "?", static_cast<int>(cu_check_err_));              \
      std::exit(program::kExitCudaError);                                            \
    }                                                                                \
  } while (0)

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The path of the loaded object named libcuda.so.1, or empty.
std::string loaded_libcuda() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const char* slash = std::strrchr(info->dlpi_name, '/');
        const char* base = slash ? slash + 1 : info->dlpi_name;
        if (std::strcmp(base, "libcuda.so.1") != 0) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &found);
  return found;
}

std::string file_of(const void* function) {
  Dl_info where{};
  if (dladdr(function, &where) == 0 || where.dli_fname == nullptr) return "?";
  return where.dli_fname;
}

// glibc's own dlopen, past any interposer (the shim answers a dlopen of libcuda.so* itself).
void* libc_dlopen(const char* file, int mode) {
  using Dlopen = void* (*)(const char*, int);
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"}) {
    if (auto real = reinterpret_cast<Dlopen>(dlvsym(RTLD_DEFAULT, "dlopen", version))) {
      return real(file, mode);
    }
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: driver_api <ptx file> [n]\n");
    return program::kExitUsage;
  }
  const int n = static_cast<int>(program::int_arg(argc, argv, 2, 10000, 1, 1 << 24));
  const std::string ptx = read_file(argv[1]);
  if (ptx.empty()) {
    std::fprintf(stderr, "driver_api: cannot read %s\n", argv[1]);
    return program::kExitUsage;
  }
  const std::string libcuda = loaded_libcuda();
  std::printf("driver_api: libcuda.so.1 is %s\n", libcuda.c_str());
  std::printf("driver_api: driver calls run in %s\n",
              file_of(reinterpret_cast<const void*>(&cuInit)).c_str());

  CU_CHECK(cuInit(0));
  int devices = 0;
  CU_CHECK(cuDeviceGetCount(&devices));
  if (devices < 1) {
    std::fprintf(stderr, "driver_api: no device\n");
    return program::kExitCudaError;
  }
  CUdevice device;
  CU_CHECK(cuDeviceGet(&device, 0));
  CUcontext context = nullptr;
  CU_CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CU_CHECK(cuCtxSetCurrent(context));

  CUmodule module = nullptr;
  CU_CHECK(cuModuleLoadData(&module, ptx.c_str()));
  CUfunction affine = nullptr;
  CU_CHECK(cuModuleGetFunction(&affine, module, "hiber_ptx_affine"));

  std::vector<float> x(n), y(n), want(n);
  const float a = 2.0f, b = -3.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 4096) - 2048.0f;
    want[i] = a * x[i] + b;  // exact in float for these values
  }
  CUdeviceptr dx = 0, dy = 0;
  CU_CHECK(cuMemAlloc(&dx, n * sizeof(float)));
  CU_CHECK(cuMemAlloc(&dy, n * sizeof(float)));
  std::printf("driver_api: start n=%d\n", n);
  CU_CHECK(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
  float fa = a, fb = b;
  int count = n;
  void* args[] = {&dy, &dx, &fa, &fb, &count};
  CU_CHECK(cuLaunchKernel(affine, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  CU_CHECK(cuCtxSynchronize());
  CU_CHECK(cuMemcpyDtoH(y.data(), dy, n * sizeof(float)));
  if (program::count_mismatches("y", y.data(), want.data(), n) != 0) {
    return program::kExitMismatch;
  }

  // A program (or library) that finds the driver with dlopen and dlsym gets the same functions,
  // whether it asks the loader for the name or the loaded libcuda.so.1 itself.
  void* by_name = dlopen("libcuda.so.1", RTLD_NOW);
  void* loaded = libc_dlopen(libcuda.c_str(), RTLD_NOW | RTLD_NOLOAD);
  const void* mine = reinterpret_cast<const void*>(&cuMemAlloc);  // cuMemAlloc_v2
  if (by_name == nullptr || loaded == nullptr || dlsym(by_name, "cuMemAlloc_v2") != mine ||
      dlsym(loaded, "cuMemAlloc_v2") != mine) {
    std::printf(
        "driver_api: WRONG: cuMemAlloc_v2 is %p in the program, %p by dlopen of "
        "libcuda.so.1, %p in the loaded %s\n",
        mine, by_name ? dlsym(by_name, "cuMemAlloc_v2") : nullptr,
        loaded ? dlsym(loaded, "cuMemAlloc_v2") : nullptr, libcuda.c_str());
    return program::kExitMismatch;
  }
  std::printf("driver_api: dlopen and dlsym give the program's driver functions\n");

  CU_CHECK(cuMemFree(dx));
  CU_CHECK(cuMemFree(dy));
  CU_CHECK(cuModuleUnload(module));
  CU_CHECK(cuDevicePrimaryCtxRelease(device));
  program::Checksum checksum;
  checksum.add(y.data(), n * sizeof(float));
  std::printf("driver_api: OK n=%d checksum=%016llx\n", n, checksum.value());
  return 0;
}
