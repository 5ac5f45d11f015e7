#include "server/device/sim/properties.h"

#include <cstdio>
#include <string>
#include <utility>

namespace hiber::device::sim {
namespace {

// Limits that differ by compute capability (CUDA C++ Programming Guide, "Technical
// Specifications per Compute Capability"). A capability not listed takes the nearest lower row.
struct ArchLimits {
  int major, minor;
  int threads_per_sm;
  int shared_per_sm;
  int shared_optin_per_block;
  int blocks_per_sm;
  int reserved_shared_per_block;
};
constexpr ArchLimits kArchLimits[] = {
    {6, 0, 2048, 65536, 49152, 32, 0},       {7, 0, 2048, 98304, 98304, 32, 0},
    {7, 5, 1024, 65536, 65536, 16, 0},       {8, 0, 2048, 167936, 166912, 32, 1024},
    {8, 6, 1536, 102400, 101376, 16, 1024},  {8, 7, 2048, 167936, 166912, 16, 1024},
    {8, 9, 1536, 102400, 101376, 24, 1024},  {9, 0, 2048, 233472, 232448, 32, 1024},
    {10, 0, 2048, 233472, 232448, 32, 1024}, {12, 0, 1536, 102400, 101376, 32, 1024},
};

const ArchLimits& arch_limits(int major, int minor) {
  const ArchLimits* best = &kArchLimits[0];
  for (const ArchLimits& a : kArchLimits)
    if (std::make_pair(a.major, a.minor) <= std::make_pair(major, minor)) best = &a;
  return *best;
}

uint64_t fnv1a(const std::string& text, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

DeviceProperties make_properties(const NodeConfig& node, int ordinal) {
  const GpuSpec& gpu = node.gpus[ordinal];
  DeviceProperties p;
  p.ordinal = ordinal;
  p.name = gpu.product_name;
  p.pci_bus_id = gpu.pci_bus_id;
  p.total_memory_bytes = gpu.memory_bytes;

  const std::string key = str_cat("hiber-sim/", node.name, "/", ordinal);
  const uint64_t halves[2] = {fnv1a(key, 0xcbf29ce484222325ull), fnv1a(key, 0x84222325cbf29ce4ull)};
  for (int i = 0; i < 16; ++i) p.uuid[i] = static_cast<uint8_t>(halves[i / 8] >> (8 * (i % 8)));
  p.uuid[6] = (p.uuid[6] & 0x0f) | 0x50;  // RFC 4122 version 5 (name-based) and variant bits
  p.uuid[8] = (p.uuid[8] & 0x3f) | 0x80;

  unsigned domain = 0, bus = 0, device = 0, function = 0;
  std::sscanf(gpu.pci_bus_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function);

  const int major = gpu.compute_capability_major;
  const int minor = gpu.compute_capability_minor;
  const ArchLimits& arch = arch_limits(major, minor);
  const bool hopper_or_later = major >= 9;

  // Indexed by CUdevice_attribute; the numbers are cuda.h's (CUDA 13), which this file must not
  // include. Attributes not set here read 0.
  auto& a = p.attributes;
  a[1] = 1024;                              // MAX_THREADS_PER_BLOCK
  a[2] = 1024;                              // MAX_BLOCK_DIM_X
  a[3] = 1024;                              // MAX_BLOCK_DIM_Y
  a[4] = 64;                                // MAX_BLOCK_DIM_Z
  a[5] = 2147483647;                        // MAX_GRID_DIM_X
  a[6] = 65535;                             // MAX_GRID_DIM_Y
  a[7] = 65535;                             // MAX_GRID_DIM_Z
  a[8] = 49152;                             // MAX_SHARED_MEMORY_PER_BLOCK
  a[9] = 65536;                             // TOTAL_CONSTANT_MEMORY
  a[10] = 32;                               // WARP_SIZE
  a[11] = 2147483647;                       // MAX_PITCH
  a[12] = 65536;                            // MAX_REGISTERS_PER_BLOCK
  a[13] = gpu.clock_rate_khz;               // CLOCK_RATE
  a[14] = 512;                              // TEXTURE_ALIGNMENT
  a[15] = 1;                                // GPU_OVERLAP
  a[16] = gpu.multiprocessors;              // MULTIPROCESSOR_COUNT
  a[17] = 0;                                // KERNEL_EXEC_TIMEOUT
  a[18] = 0;                                // INTEGRATED
  a[19] = 1;                                // CAN_MAP_HOST_MEMORY
  a[20] = 0;                                // COMPUTE_MODE: default
  a[21] = 131072;                           // MAXIMUM_TEXTURE1D_WIDTH
  a[22] = 131072;                           // MAXIMUM_TEXTURE2D_WIDTH
  a[23] = 65536;                            // MAXIMUM_TEXTURE2D_HEIGHT
  a[24] = 16384;                            // MAXIMUM_TEXTURE3D_WIDTH
  a[25] = 16384;                            // MAXIMUM_TEXTURE3D_HEIGHT
  a[26] = 16384;                            // MAXIMUM_TEXTURE3D_DEPTH
  a[30] = 512;                              // SURFACE_ALIGNMENT
  a[31] = 1;                                // CONCURRENT_KERNELS
  a[32] = 1;                                // ECC_ENABLED (data-centre GPUs)
  a[33] = static_cast<int32_t>(bus);        // PCI_BUS_ID
  a[34] = static_cast<int32_t>(device);     // PCI_DEVICE_ID
  a[35] = 0;                                // TCC_DRIVER
  a[36] = gpu.memory_clock_rate_khz;        // MEMORY_CLOCK_RATE
  a[37] = gpu.memory_bus_width_bits;        // GLOBAL_MEMORY_BUS_WIDTH
  a[38] = gpu.l2_cache_bytes;               // L2_CACHE_SIZE
  a[39] = arch.threads_per_sm;              // MAX_THREADS_PER_MULTIPROCESSOR
  a[40] = 2;                                // ASYNC_ENGINE_COUNT
  a[41] = 1;                                // UNIFIED_ADDRESSING
  a[50] = static_cast<int32_t>(domain);     // PCI_DOMAIN_ID
  a[51] = 32;                               // TEXTURE_PITCH_ALIGNMENT
  a[75] = major;                            // COMPUTE_CAPABILITY_MAJOR
  a[76] = minor;                            // COMPUTE_CAPABILITY_MINOR
  a[78] = 1;                                // STREAM_PRIORITIES_SUPPORTED
  a[79] = 1;                                // GLOBAL_L1_CACHE_SUPPORTED
  a[80] = 1;                                // LOCAL_L1_CACHE_SUPPORTED
  a[81] = arch.shared_per_sm;               // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
  a[82] = 65536;                            // MAX_REGISTERS_PER_MULTIPROCESSOR
  a[83] = 1;                                // MANAGED_MEMORY
  a[84] = 0;                                // MULTI_GPU_BOARD
  a[85] = ordinal;                          // MULTI_GPU_BOARD_GROUP_ID
  a[87] = 2;                                // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
  a[89] = 1;                                // CONCURRENT_MANAGED_ACCESS
  a[90] = 1;                                // COMPUTE_PREEMPTION_SUPPORTED
  a[95] = 1;                                // COOPERATIVE_LAUNCH
  a[97] = arch.shared_optin_per_block;      // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
  a[99] = 1;                                // HOST_REGISTER_SUPPORTED
  a[102] = 1;                               // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  a[103] = 1;                               // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
  a[106] = arch.blocks_per_sm;              // MAX_BLOCKS_PER_MULTIPROCESSOR
  a[111] = arch.reserved_shared_per_block;  // RESERVED_SHARED_MEMORY_PER_BLOCK
  a[115] = 1;                               // MEMORY_POOLS_SUPPORTED
  a[120] = hopper_or_later ? 1 : 0;         // CLUSTER_LAUNCH
  a[126] = hopper_or_later ? 4 : 1;         // MEM_SYNC_DOMAIN_COUNT
  a[127] = hopper_or_later ? 1 : 0;         // TENSOR_MAP_ACCESS_SUPPORTED
  a[131] = -1;                              // NUMA_ID: not a NUMA node
  a[134] = -1;                              // HOST_NUMA_ID: unknown
  return p;
}

}  // namespace hiber::device::sim
