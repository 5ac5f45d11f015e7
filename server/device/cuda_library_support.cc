// Opening the remoted libraries at run time. See cuda_library_support.h.
#include "server/device/cuda_library_support.h"

#include <cublas_api.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

namespace hiber::device::cuda_lib {
namespace {

std::string one_line(const char* text) {
  std::string out = text != nullptr ? text : "dlopen failed";
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

std::string loaded_path(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

}  // namespace

// `soname` through the loader's default search, then in each folder. RTLD_LOCAL: nothing in
// hiberd needs their symbols globally, and a library opened later cannot bind to them by chance.
// The libraries find their own dependencies (libcublasLt.so.13, cuDNN's sub-libraries) next to
// themselves ($ORIGIN).
Result<OpenedLibrary> open_library(const CudaLibraryOptions& options, const char* soname) {
  std::vector<std::string> tried;
  if (options.search_default_path) {
    if (void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) {
      return OpenedLibrary{handle, loaded_path(handle, soname)};
    }
    tried.push_back(str_cat("the loader's search path (", one_line(dlerror()), ")"));
  }
  for (const std::string& folder : options.folders) {
    const std::string path = folder + "/" + soname;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      tried.push_back(path + " (no such file)");
      continue;
    }
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return OpenedLibrary{handle, loaded_path(handle, path)};
    }
    tried.push_back(str_cat(path, " (", one_line(dlerror()), ")"));
  }
  std::string where;
  for (const std::string& t : tried) where += (where.empty() ? "" : "; ") + t;
  if (where.empty()) where = "nowhere: no folder configured and the default search is off";
  return error(ErrorCode::kNotSupported, soname,
               " is not available to hiberd, so its calls cannot run on this GPU server: tried ",
               where, " (install it, or name its folder with hiberd --cuda_library_path)");
}

// Resolves `name` into `*out`; kNotSupported naming the library when it lacks it (a version
// older than the headers Hiber was built with).
Status resolve(const OpenedLibrary& library, const char* name, void** out) {
  dlerror();
  *out = dlsym(library.handle, name);
  if (*out == nullptr) {
    return error(ErrorCode::kNotSupported, library.path, " has no ", name,
                 ": it is older than the headers hiberd was built with");
  }
  return Status();
}

Status cublas_status(int status, std::string_view call, const char* name, const char* text) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status();
  ErrorCode code = ErrorCode::kUnknown;
  switch (status) {
    case CUBLAS_STATUS_INVALID_VALUE: code = ErrorCode::kInvalidValue; break;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH: code = ErrorCode::kNotSupported; break;
    case CUBLAS_STATUS_ALLOC_FAILED: code = ErrorCode::kOutOfMemory; break;
    case CUBLAS_STATUS_NOT_INITIALIZED: code = ErrorCode::kNotInitialized; break;
    case CUBLAS_STATUS_EXECUTION_FAILED: code = ErrorCode::kLaunchFailed; break;
    default: break;
  }
  return error(code, call, ": ", name != nullptr ? name : "cuBLAS status ",
               name != nullptr ? "" : std::to_string(status), " (", text != nullptr ? text : "",
               ")");
}

}  // namespace hiber::device::cuda_lib
