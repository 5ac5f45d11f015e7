// The Device interface on the CUDA Driver API, for real GPUs.
//
// libcuda.so.1 is opened with dlopen and every entry point is resolved through
// cuGetProcAddress at an explicit ABI version, so binaries that contain this backend start on
// machines without a driver; create() then fails with kNoDevice (or kStubLibrary for the
// toolkit's stub) and a message saying why.
//
// Each GPU's primary context is its shared context (device.h, "Contexts"); create_context makes
// more with cuCtxCreate, one per instance where hiberd isolates instances. Device memory uses
// the VMM API (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess); a PhysicalMemory is
// one allocation per granularity unit, since cuMemMap takes offset 0 only; modules are loaded
// once with cuLibraryLoadData and serve every GPU, after common/fatbin.h has checked every size
// and offset in the image (the driver is given no length); parameter layouts come from
// cuKernelGetParamInfo.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "server/device/device.h"

namespace hiber::device {

// Where the CUDA backend finds the real cuBLAS, cuBLASLt and cuDNN (cuda_libraries.h). They are
// opened with dlopen when a client first creates a handle of theirs, so hiberd starts and serves
// runtime calls on machines without them; a library handle then fails with kNotSupported naming
// the library that is missing and where it was looked for.
struct CudaLibraryOptions {
  // The loader's own search first (LD_LIBRARY_PATH, the ldconfig cache): what a GPU machine's
  // administrator configured wins.
  bool search_default_path = true;
  // Then these folders, in order: where the CUDA toolkit installs the libraries.
  std::vector<std::string> folders = {"/usr/local/cuda/lib64"};
};

struct CudaDeviceOptions {
  // Bandwidths and names to report in topology(); the GPU count and PCI bus IDs must match the
  // node. Without one, the topology is discovered: PCIe switches from sysfs, NVLink peers from
  // cuDeviceGetP2PAttribute, with bandwidths estimated from the P2P performance rank.
  std::optional<NodeConfig> node;
  CudaLibraryOptions libraries;
};

// kNoDevice / kStubLibrary / kNotInitialized with a reason when no usable GPU is present.
Result<std::unique_ptr<Device>> create_cuda_device(const CudaDeviceOptions& options);

}  // namespace hiber::device
