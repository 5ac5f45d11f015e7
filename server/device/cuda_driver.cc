#include "server/device/cuda_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <memory>
#include <type_traits>

#include <glog/logging.h>

namespace hiber::device::cuda_driver {

// Each row's PFN typedef must be the type of the function cuda.h declares under that name
// (`name` is expanded here, so cuMemGetInfo is checked as cuMemGetInfo_v2): the version we ask
// cuGetProcAddress for is the ABI our calls are compiled against. decltype does not odr-use the
// function, so nothing links against libcuda.
#define HIBER_CUDA_CHECK_SIGNATURE_(name, version)                                     \
  static_assert(std::is_same_v<PFN_##name##_v##version, decltype(&name)>,              \
                "HIBER_CUDA_DRIVER_ENTRY_POINTS: " #name " at version " #version       \
                " does not have the signature cuda.h declares; use the version whose " \
                "PFN typedef in cudaTypedefs.h matches");                              \
  static_assert(version <= CUDA_VERSION, #name ": version newer than the CUDA headers");
HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_CUDA_CHECK_SIGNATURE_)
#undef HIBER_CUDA_CHECK_SIGNATURE_

// Our error codes are CUresult values, so a driver error reaches a client unchanged. One row per
// ErrorCode enumerator; the switch below makes -Wswitch (in -Wall) name any enumerator added
// to common/status.h without a row here.
#define HIBER_CUDA_ERROR_CODES_(X)                              \
  X(kSuccess, CUDA_SUCCESS)                                     \
  X(kInvalidValue, CUDA_ERROR_INVALID_VALUE)                    \
  X(kOutOfMemory, CUDA_ERROR_OUT_OF_MEMORY)                     \
  X(kNotInitialized, CUDA_ERROR_NOT_INITIALIZED)                \
  X(kDeinitialized, CUDA_ERROR_DEINITIALIZED)                   \
  X(kStubLibrary, CUDA_ERROR_STUB_LIBRARY)                      \
  X(kDeviceUnavailable, CUDA_ERROR_DEVICE_UNAVAILABLE)          \
  X(kNoDevice, CUDA_ERROR_NO_DEVICE)                            \
  X(kInvalidDevice, CUDA_ERROR_INVALID_DEVICE)                  \
  X(kInvalidImage, CUDA_ERROR_INVALID_IMAGE)                    \
  X(kInvalidContext, CUDA_ERROR_INVALID_CONTEXT)                \
  X(kMapFailed, CUDA_ERROR_MAP_FAILED)                          \
  X(kAlreadyMapped, CUDA_ERROR_ALREADY_MAPPED)                  \
  X(kNoBinaryForGpu, CUDA_ERROR_NO_BINARY_FOR_GPU)              \
  X(kNotMapped, CUDA_ERROR_NOT_MAPPED)                          \
  X(kPeerAccessUnsupported, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) \
  X(kInvalidPtx, CUDA_ERROR_INVALID_PTX)                        \
  X(kInvalidSource, CUDA_ERROR_INVALID_SOURCE)                  \
  X(kFileNotFound, CUDA_ERROR_FILE_NOT_FOUND)                   \
  X(kOperatingSystem, CUDA_ERROR_OPERATING_SYSTEM)              \
  X(kInvalidHandle, CUDA_ERROR_INVALID_HANDLE)                  \
  X(kIllegalState, CUDA_ERROR_ILLEGAL_STATE)                    \
  X(kNotFound, CUDA_ERROR_NOT_FOUND)                            \
  X(kNotReady, CUDA_ERROR_NOT_READY)                            \
  X(kIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS)                \
  X(kLaunchOutOfResources, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)  \
  X(kLaunchTimeout, CUDA_ERROR_LAUNCH_TIMEOUT)                  \
  X(kLaunchFailed, CUDA_ERROR_LAUNCH_FAILED)                    \
  X(kNotPermitted, CUDA_ERROR_NOT_PERMITTED)                    \
  X(kNotSupported, CUDA_ERROR_NOT_SUPPORTED)                    \
  X(kTimeout, CUDA_ERROR_TIMEOUT)                               \
  X(kUnknown, CUDA_ERROR_UNKNOWN)

#define HIBER_CUDA_SAME_CODE_(ours, theirs) \
  static_assert(static_cast<uint32_t>(ErrorCode::ours) == static_cast<uint32_t>(theirs), #ours);
HIBER_CUDA_ERROR_CODES_(HIBER_CUDA_SAME_CODE_)
#undef HIBER_CUDA_SAME_CODE_

namespace {
[[maybe_unused]] constexpr CUresult cuda_result_of(ErrorCode code) {
  switch (code) {
#define HIBER_CUDA_CASE_(ours, theirs) \
  case ErrorCode::ours: return theirs;
    HIBER_CUDA_ERROR_CODES_(HIBER_CUDA_CASE_)
#undef HIBER_CUDA_CASE_
  }
  return static_cast<CUresult>(static_cast<uint32_t>(code));
}
}  // namespace
#undef HIBER_CUDA_ERROR_CODES_
// CUresult and ErrorCode share a representation, so every CUresult converts without loss.
static_assert(sizeof(CUresult) <= sizeof(ErrorCode));

namespace {

using GetProcAddressFn = PFN_cuGetProcAddress_v12000;

// Where the loaded library lives, for messages ("" if the loader does not say).
std::string library_path_of(void* handle) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    return map->l_name;
  }
  return "";
}

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

const char* query_result_name(CUdriverProcAddressQueryResult found) {
  switch (found) {
    case CU_GET_PROC_ADDRESS_SUCCESS: return "found";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "symbol not found";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "driver version not sufficient";
  }
  return "unknown query result";
}

Result<const CudaDriver*> load_driver_once() {
  // RTLD_LOCAL: our lookups go through cuGetProcAddress, so nothing needs the symbols globally,
  // and a client library loaded later cannot bind to them by accident.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Status(ErrorCode::kNoDevice,
                  str_cat("libcuda.so.1 not found: no NVIDIA driver on this machine (",
                          one_line(why != nullptr ? why : "dlopen failed"), ")"));
  }
  // On success the handle is kept for the whole process (see load_driver); on failure it is
  // closed, so a machine with the stub or a broken driver leaks nothing.
  struct Closer {
    void* handle;
    ~Closer() {
      if (handle != nullptr) dlclose(handle);
    }
  } closer{handle};
  auto driver = std::make_unique<CudaDriver>();
  driver->library_path = library_path_of(handle);
  const std::string where =
      driver->library_path.empty() ? std::string("libcuda.so.1") : driver->library_path;

  auto get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    return Status(ErrorCode::kNotSupported,
                  str_cat(where,
                          " has no cuGetProcAddress_v2: the NVIDIA driver is older than "
                          "CUDA 12.0; Hiber needs a driver for CUDA ",
                          kRequiredDriverVersion / 1000, ".", kRequiredDriverVersion % 1000 / 10,
                          " or newer"));
  }

  // Resolves one row. CU_GET_PROC_ADDRESS_LEGACY_STREAM: we always pass explicit streams, so ask
  // for the plain (not per-thread default stream) variants whatever this file was compiled with.
  auto resolve = [&](const char* name, int version, void** out) -> Status {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get_proc(name, out, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
    if (r == CUDA_ERROR_STUB_LIBRARY) {
      return Status(ErrorCode::kStubLibrary,
                    str_cat(where,
                            " is the CUDA toolkit's stub library, not an NVIDIA driver: "
                            "no GPU can be used (remove the stubs directory from "
                            "LD_LIBRARY_PATH on a GPU machine)"));
    }
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || *out == nullptr) {
      return Status(
          ErrorCode::kNotSupported,
          str_cat("cuGetProcAddress(", name, ", version ", version, ") in ", where,
                  " failed: ", describe_result(nullptr, r), ", ", query_result_name(found)));
    }
    return Status();
  };

  // The version first, so a driver that is too old is reported as such rather than as the first
  // entry point it lacks. cuDriverGetVersion needs no cuInit.
  HIBER_RETURN_IF_ERROR(resolve("cuDriverGetVersion", 2020,
                                reinterpret_cast<void**>(&driver->pfn_cuDriverGetVersion)));
  CUresult r = driver->pfn_cuDriverGetVersion(&driver->driver_version);
  if (r != CUDA_SUCCESS) {
    return Status(
        static_cast<ErrorCode>(static_cast<uint32_t>(r)),
        str_cat("cuDriverGetVersion in ", where, " failed: ", describe_result(nullptr, r)));
  }
  if (driver->driver_version < kRequiredDriverVersion) {
    return Status(ErrorCode::kNotSupported,
                  str_cat("the NVIDIA driver (", where, ") supports CUDA ",
                          driver->driver_version / 1000, ".", driver->driver_version % 1000 / 10,
                          "; Hiber needs CUDA ", kRequiredDriverVersion / 1000, ".",
                          kRequiredDriverVersion % 1000 / 10, " or newer"));
  }

#define HIBER_CUDA_RESOLVE_(name, version) \
  HIBER_RETURN_IF_ERROR(resolve(#name, version, reinterpret_cast<void**>(&driver->pfn_##name)));
  HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_CUDA_RESOLVE_)
#undef HIBER_CUDA_RESOLVE_

  r = driver->pfn_cuInit(0);
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    return Status(ErrorCode::kStubLibrary,
                  str_cat(where,
                          " is the CUDA toolkit's stub library, not an NVIDIA driver: "
                          "cuInit returned CUDA_ERROR_STUB_LIBRARY"));
  }
  if (r == CUDA_ERROR_NO_DEVICE) {
    return Status(ErrorCode::kNoDevice,
                  str_cat("the NVIDIA driver (", where, ") sees no GPU: cuInit returned ",
                          describe_result(driver.get(), r)));
  }
  if (r != CUDA_SUCCESS) {
    return driver->check(r, "cuInit")
        .with_context(
            str_cat("the NVIDIA driver (", where, ") is installed but cannot be initialised"));
  }
  LOG(INFO) << "CUDA driver " << where << " (CUDA " << driver->driver_version / 1000 << "."
            << driver->driver_version % 1000 / 10 << ") loaded";
  closer.handle = nullptr;
  return static_cast<const CudaDriver*>(driver.release());
}

}  // namespace

std::string describe_result(const CudaDriver* driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver != nullptr) {
    if (driver->pfn_cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (driver->pfn_cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  std::string out = name != nullptr
                        ? std::string(name)
                        : error_code_name(static_cast<ErrorCode>(static_cast<uint32_t>(result)));
  if (text != nullptr) out += str_cat(" (", text, ")");
  return out;
}

Status CudaDriver::check(CUresult result, std::string_view call) const {
  if (result == CUDA_SUCCESS) return Status();
  return Status(static_cast<ErrorCode>(static_cast<uint32_t>(result)),
                str_cat(call, ": ", describe_result(this, result)));
}

Result<const CudaDriver*> load_driver() {
  static const Result<const CudaDriver*> loaded = load_driver_once();
  return loaded;
}

}  // namespace hiber::device::cuda_driver
