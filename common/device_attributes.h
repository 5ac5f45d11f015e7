// Device attributes travel as a table indexed by CUdevice_attribute (the handshake's
// DeviceInfo.attributes, DeviceProperties::attributes). The few that Hiber itself reads are named
// here; the CUDA backend checks these values against cuda.h.
#pragma once

namespace hiber {

enum DeviceAttribute : int {
  kAttrMaxThreadsPerBlock = 1,
  kAttrMaxBlockDimX = 2,
  kAttrMaxGridDimX = 5,
  kAttrMaxSharedMemoryPerBlock = 8,
  kAttrWarpSize = 10,
  kAttrClockRate = 13,
  kAttrMultiprocessorCount = 16,
  kAttrCanMapHostMemory = 19,
  kAttrMemoryClockRate = 36,
  kAttrGlobalMemoryBusWidth = 37,
  kAttrL2CacheSize = 38,
  kAttrMaxThreadsPerMultiprocessor = 39,
  kAttrUnifiedAddressing = 41,
  kAttrMaxSharedMemoryPerMultiprocessor = 81,
  kAttrMaxSharedMemoryPerBlockOptin = 97,
  kAttrMaxBlocksPerMultiprocessor = 106,
  kAttrComputeCapabilityMajor = 75,
  kAttrComputeCapabilityMinor = 76,
  kAttrVirtualMemoryManagementSupported = 102,
  kAttrCount = 160,  // room for every CUdevice_attribute value up to CUDA 13
};

}  // namespace hiber
