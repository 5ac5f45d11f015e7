// dlopen interposition.
//
// - A load of the CUDA runtime or driver by name (libcudart.so*, libcuda.so*) gets the shim
//   itself, so its later dlsym calls find the shim's functions.
// - A load of a library Hiber replaces gets the replacement, a file next to libhibercuda.so:
//   libcublasLt* -> libhibercublasLt.so, libcublas* -> libhibercublas.so,
//   libcudnn* -> libhibercudnn.so, libnvidia-ml.so* -> libhibernvml.so (the list is generated:
//   replaced_libraries.inc, cmake/HiberEntryPoints.cmake). Where the replacement
//   is not installed, the load fails with dlerror() naming the missing file (and one log line):
//   never the real library, whose internals would reach for driver entry points the shim lacks.
// - A load of one of those libraries by a name of another major version (libcudart.so.12 when
//   the shim serves CUDA 13, libcudnn.so.8 for cuDNN 9) is refused: a library's major version is
//   its ABI, and binding a framework built for one to the other would corrupt its calls
//   silently. dlerror() names both versions, and one log line says the same.
// - Any other bare name (no slash) is looked up with the search path of the *caller* of dlopen,
//   as the real dlopen would: the real dlopen sees the shim as its caller, so its DT_RUNPATH /
//   DT_RPATH would be the shim's. The caller's (found with __builtin_return_address and dladdr,
//   unwinding past a sanitizer runtime's dlopen interceptor where one is preloaded first;
//   $ORIGIN expanded) are tried first, then the real dlopen's own search (LD_LIBRARY_PATH, the
//   cache, the default folders). So libtorch_cuda.so's dlopen("libnvrtc.so.13") still finds
//   NVRTC in the pip wheel folder its RPATH names.
//
// Limitation: a DT_RPATH (not RUNPATH) also applies the RPATHs of the libraries that loaded the
// caller; only the caller's own are used here. $LIB and $PLATFORM are not expanded (folders
// naming them are skipped).
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using DlopenFn = void* (*)(const char*, int);

DlopenFn real_dlopen() {
  static const auto real = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  return real;
}

std::string_view base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// A library the shim replaces (generated from cmake/HiberEntryPoints.cmake's list).
struct Replaced {
  std::string_view table;        // its declaration table: "cudart"
  std::string_view stem;         // what a file name starts with: "libcudart.so", "libcudnn"
  std::string_view abi;          // "CUDA"
  int major;                     // the ABI's major version served
  std::string_view soname;       // "libcudart.so.13"
  std::string_view replacement;  // the file next to the shim that serves it
};
constexpr Replaced kReplaced[] = {
#define HIBER_REPLACED_LIBRARY(table, stem, abi, major, soname, replacement) \
  {#table, stem, abi, major, soname, replacement},
#include "client_shim/replaced_libraries.inc"
#undef HIBER_REPLACED_LIBRARY
};

// The library a file name asks for, by its stem; nullptr for one the shim does not replace.
const Replaced* replaced(std::string_view base) {
  for (const Replaced& library : kReplaced) {
    if (starts_with(base, library.stem)) return &library;
  }
  return nullptr;
}

// The major version a library's file name asks for, as its digits: "libcudart.so.12" and
// "libcudnn_ops.so.8.9" ask for "12" and "8"; "libcudart.so" for none (the development link,
// any version). Digits, not a number, so that no spelling of a version can overflow into this one.
std::optional<std::string_view> requested_major(std::string_view base) {
  const auto so = base.find(".so.");
  if (so == std::string_view::npos) return std::nullopt;
  const std::string_view rest = base.substr(so + 4);
  const size_t digits = std::min(rest.find_first_not_of("0123456789"), rest.size());
  if (digits == 0) return std::nullopt;
  return rest.substr(0, digits);
}

// Why a load of `base` is refused, if it names a library whose ABI this shim serves at another
// major version; "" when it is not.
std::string other_abi(const Replaced& library, std::string_view base) {
  const std::optional<std::string_view> major = requested_major(base);
  if (!major || *major == std::to_string(library.major)) return "";
  return std::string(base) + " is " + std::string(library.abi) + " " + std::string(*major) +
         "'s ABI, and Hiber's shim serves " + std::string(library.abi) + " " +
         std::to_string(library.major) + "'s (" + std::string(library.soname) + ")";
}

// Fails the load with `why` as dlerror()'s text: glibc sets that text only from a failing load,
// so the shim asks for a file that cannot exist, named by the reason.
void* refuse(DlopenFn real, const char* name, const std::string& why, int mode) {
  std::fprintf(stderr, "hibercuda: dlopen(\"%s\") refused: %s\n", name, why.c_str());
  return real(("/hibercuda refused the load: " + why).c_str(), mode);
}

const char* shim_path() {
  static const char* path = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&real_dlopen), &info);
    return info.dli_fname;
  }();
  return path;
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Whether `address` lies in a library that interposes dlopen in front of the shim: a sanitizer
// runtime preloaded before it (its interceptor calls the next dlopen, the shim's, so the shim's
// immediate caller is the interceptor, not the program).
bool in_interposer(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return false;
  const std::string_view name = base_name(info.dli_fname);
  return name.starts_with("libasan.so") || name.starts_with("libtsan.so") ||
         name.starts_with("libubsan.so") || name.starts_with("libclang_rt.");
}

// The code that called dlopen: the shim's return address, or past an interposing sanitizer's
// frame (found by unwinding, which needs no frame pointers).
const void* dlopen_caller(const void* return_address) {
  if (!in_interposer(return_address)) return return_address;
  void* frames[8];
  const int depth = backtrace(frames, 8);
  for (int i = 1; i < depth; ++i) {  // frames[0] is dlopen_caller itself
    Dl_info info{};
    if (dladdr(frames[i], &info) != 0 && info.dli_fname != nullptr &&
        info.dli_fname == std::string_view(shim_path()))
      continue;
    if (!in_interposer(frames[i])) return frames[i];
  }
  return return_address;
}

// The caller's DT_RUNPATH (or, without one, DT_RPATH) folders, $ORIGIN expanded.
std::vector<std::string> caller_search_path(const void* caller) {
  std::vector<std::string> dirs;
  Dl_info info{};
  link_map* map = nullptr;
  if (caller == nullptr ||
      dladdr1(caller, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 ||
      map == nullptr || map->l_ld == nullptr) {
    return dirs;
  }
  const char* strtab = nullptr;
  const ElfW(Dyn)* runpath = nullptr;
  const ElfW(Dyn)* rpath = nullptr;
  for (const ElfW(Dyn)* d = map->l_ld; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_STRTAB) {
      // glibc relocates the dynamic section's pointers in place on most targets; an address
      // below the load base is still an unrelocated offset.
      auto p = static_cast<uintptr_t>(d->d_un.d_ptr);
      if (p < map->l_addr) p += map->l_addr;
      strtab = reinterpret_cast<const char*>(p);
    } else if (d->d_tag == DT_RUNPATH) {
      runpath = d;
    } else if (d->d_tag == DT_RPATH) {
      rpath = d;
    }
  }
  const ElfW(Dyn)* entry = runpath ? runpath : rpath;
  if (strtab == nullptr || entry == nullptr) return dirs;
  // The main program's l_name is empty; its path is /proc/self/exe.
  std::string object = info.dli_fname ? info.dli_fname : "";
  if (map->l_name == nullptr || map->l_name[0] == '\0') {
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) object.assign(exe, n);
  }
  char resolved[4096];
  if (realpath(object.c_str(), resolved) != nullptr) object = resolved;
  const std::string origin = dir_of(object);
  std::string_view list(strtab + entry->d_un.d_val);
  while (!list.empty()) {
    const auto colon = list.find(':');
    std::string dir(list.substr(0, colon));
    list = colon == std::string_view::npos ? std::string_view() : list.substr(colon + 1);
    for (const char* token : {"${ORIGIN}", "$ORIGIN"}) {
      for (auto at = dir.find(token); at != std::string::npos; at = dir.find(token)) {
        dir.replace(at, std::strlen(token), origin);
      }
    }
    if (dir.empty() || dir.find('$') != std::string::npos) continue;
    dirs.push_back(std::move(dir));
  }
  return dirs;
}

void* open_replacement(DlopenFn real, const char* name, const char* replacement, int mode) {
  const std::string path = dir_of(shim_path()) + "/" + replacement;
  if (access(path.c_str(), F_OK) != 0) {
    std::fprintf(stderr, "hibercuda: dlopen(\"%s\"): its replacement %s is not installed\n", name,
                 path.c_str());
  }
  return real(path.c_str(), mode);  // fails with dlerror() naming the path if it is missing
}

}  // namespace

#pragma GCC visibility push(default)
extern "C" void* dlopen(const char* file, int mode) {
  DlopenFn real = real_dlopen();
  if (real == nullptr) return nullptr;
  if (file == nullptr || shim_path() == nullptr) return real(file, mode);
  const std::string_view base = base_name(file);
  if (const Replaced* library = replaced(base)) {
    if (const std::string why = other_abi(*library, base); !why.empty()) {
      return refuse(real, file, why, mode);
    }
    // The runtime and the driver are the shim itself.
    if (library->replacement == "libhibercuda.so") return real(shim_path(), mode);
    return open_replacement(real, file, std::string(library->replacement).c_str(), mode);
  }
  if (std::strchr(file, '/') == nullptr) {
    for (const std::string& dir : caller_search_path(dlopen_caller(__builtin_return_address(0)))) {
      const std::string path = dir + "/" + file;
      if (access(path.c_str(), F_OK) != 0) continue;
      if (void* handle = real(path.c_str(), mode)) return handle;
    }
  }
  return real(file, mode);
}
#pragma GCC visibility pop
