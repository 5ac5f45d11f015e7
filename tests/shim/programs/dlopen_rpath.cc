// dlopen_rpath: loads a library (argv[1], by path) that dlopens another by bare name through
// its own RUNPATH, which is on no other search path; under the preloaded shim that must still
// work (client_shim/dl_interpose.cc).
//
// Usage: dlopen_rpath <path of libhiber_rpath_caller.so>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "program_util.h"

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) return program::kExitUsage;
  void* caller = dlopen(argv[1], RTLD_NOW);
  if (caller == nullptr) {
    std::fprintf(stderr, "dlopen_rpath: %s\n", dlerror());
    return program::kExitCudaError;
  }
  auto load = reinterpret_cast<int (*)()>(dlsym(caller, "hiber_rpath_caller_load"));
  const int value = load ? load() : -3;
  if (value != 4242) {
    std::fprintf(stderr, "dlopen_rpath: WRONG: the caller's RUNPATH was not searched (%d)\n",
                 value);
    return program::kExitMismatch;
  }
  std::printf("dlopen_rpath: OK found through the caller's RUNPATH\n");
  return 0;
}
