// libhibernvml.so: the NVML queries frameworks make before they touch CUDA (soname
// libnvidia-ml.so.1; dlopen of libnvidia-ml.so* is redirected here by dl_interpose.cc).
//
// Every answer comes from the shim's one session with hiberd, through the driver entry points
// libhibercuda.so exports (this library links against it), so NVML and CUDA agree by
// construction: the devices are the ones the function was granted, with their names, UUIDs,
// PCI bus ids and compute capabilities as cuDeviceGet* report them, and a device's memory is the
// function's quota (total) and what it has allocated (used), as cudaMemGetInfo reports them.
// The quota is the function's, not per device, so every device reports the same figures.
//
// Functions not implemented here that frameworks are known to probe return
// NVML_ERROR_NOT_SUPPORTED and log their name once; any other NVML function is absent (a program
// linked against it fails to load, dlsym finds nothing), never a silent success.
//
// Symbol versions: the real libnvidia-ml.so.1 exports its functions unversioned, with "_v2" /
// "_v3" names for newer ABIs, so the symbols here are unversioned too.
#include <cuda.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "client_shim/nvml_abi.h"
#include "client_shim/nvml_entry_decls.h"

namespace {

constexpr int kMaxDevices = 64;

// A device handle: the address of its slot.
struct nvmlDeviceSlot {
  int index = 0;
};
nvmlDeviceSlot slots[kMaxDevices];

std::mutex mu;
int init_count = 0;  // nvmlInit / nvmlShutdown nest, as in NVML

nvmlReturn_t from_cu(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return NVML_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: return NVML_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_NO_DEVICE: return NVML_ERROR_DRIVER_NOT_LOADED;
    case CUDA_ERROR_NOT_INITIALIZED: return NVML_ERROR_UNINITIALIZED;
    default: return NVML_ERROR_UNKNOWN;
  }
}

bool initialized() {
  std::lock_guard lock(mu);
  return init_count > 0;
}

int device_count() {
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS) return 0;
  return count < kMaxDevices ? count : kMaxDevices;
}

// The device behind a handle, or -1.
int index_of(nvmlDevice_t device) {
  auto* slot = reinterpret_cast<nvmlDeviceSlot*>(device);
  if (slot < slots || slot >= slots + kMaxDevices) return -1;
  return slot->index < device_count() ? slot->index : -1;
}

nvmlDevice_t handle_of(int index) {
  slots[index].index = index;
  return reinterpret_cast<nvmlDevice_t>(&slots[index]);
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and NVML write UUIDs.
std::string uuid_text(const CUuuid& uuid) {
  std::string text = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += hex;
  }
  return text;
}

struct BusId {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  bool operator==(const BusId&) const = default;
};

bool parse_bus_id(const char* text, BusId* id) {
  return std::sscanf(text, "%x:%x:%x.%x", &id->domain, &id->bus, &id->device, &id->function) == 4;
}

nvmlReturn_t copy_string(const std::string& value, char* out, unsigned int length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (value.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, value.c_str(), value.size() + 1);
  return NVML_SUCCESS;
}

#define HIBER_NVML_DEVICE(device, index)               \
  if (!initialized()) return NVML_ERROR_UNINITIALIZED; \
  const int index = index_of(device);                  \
  if (index < 0) return NVML_ERROR_INVALID_ARGUMENT

}  // namespace

nvmlReturn_t hiber_entry::nvmlInitWithFlags(unsigned int) {
  // Opens (or joins) the shim's session; without hiberd NVML has no driver, as without a GPU.
  const CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) return NVML_ERROR_DRIVER_NOT_LOADED;
  std::lock_guard lock(mu);
  ++init_count;
  return NVML_SUCCESS;
}

nvmlReturn_t hiber_entry::nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t hiber_entry::nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t hiber_entry::nvmlShutdown(void) {
  std::lock_guard lock(mu);
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --init_count;
  return NVML_SUCCESS;
}

const char* hiber_entry::nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
  }
}

nvmlReturn_t hiber_entry::nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  // hiberd does not tell the kernel driver's version; this is the CUDA driver API version the
  // shim implements, which is what a function can rely on.
  int v = 0;
  if (nvmlReturn_t r = from_cu(cuDriverGetVersion(&v)); r != NVML_SUCCESS) return r;
  return copy_string(std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10), version,
                     length);
}

nvmlReturn_t hiber_entry::nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  return copy_string("hiber-nvml", version, length);
}

nvmlReturn_t hiber_entry::nvmlSystemGetCudaDriverVersion(int* version) {
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return from_cu(cuDriverGetVersion(version));
}

nvmlReturn_t hiber_entry::nvmlSystemGetCudaDriverVersion_v2(int* version) {
  return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = static_cast<unsigned>(device_count());
  return NVML_SUCCESS;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetCount(unsigned int* count) {
  return nvmlDeviceGetCount_v2(count);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= static_cast<unsigned>(device_count())) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *device = handle_of(static_cast<int>(index));
  return NVML_SUCCESS;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return hiber_entry::nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < device_count(); ++i) {
    CUuuid id{};
    if (cuDeviceGetUuid(&id, i) == CUDA_SUCCESS && uuid_text(id) == uuid) {
      *device = handle_of(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id,
                                                           nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  BusId wanted;
  if (bus_id == nullptr || device == nullptr || !parse_bus_id(bus_id, &wanted)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < device_count(); ++i) {
    char text[64];
    BusId id;
    if (cuDeviceGetPCIBusId(text, sizeof(text), i) == CUDA_SUCCESS && parse_bus_id(text, &id) &&
        id == wanted) {
      *device = handle_of(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetHandleByPciBusId(const char* bus_id, nvmlDevice_t* device) {
  return hiber_entry::nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  HIBER_NVML_DEVICE(device, i);
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = static_cast<unsigned>(i);
  return NVML_SUCCESS;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  HIBER_NVML_DEVICE(device, i);
  char text[256];
  if (nvmlReturn_t r = from_cu(cuDeviceGetName(text, sizeof(text), i)); r != NVML_SUCCESS) {
    return r;
  }
  return copy_string(text, name, length);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  HIBER_NVML_DEVICE(device, i);
  CUuuid id{};
  if (nvmlReturn_t r = from_cu(cuDeviceGetUuid(&id, i)); r != NVML_SUCCESS) return r;
  return copy_string(uuid_text(id), uuid, length);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  HIBER_NVML_DEVICE(device, i);
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  char text[64];
  BusId id;
  if (nvmlReturn_t r = from_cu(cuDeviceGetPCIBusId(text, sizeof(text), i)); r != NVML_SUCCESS) {
    return r;
  }
  if (!parse_bus_id(text, &id)) return NVML_ERROR_UNKNOWN;
  std::memset(pci, 0, sizeof(*pci));
  pci->domain = id.domain;
  pci->bus = id.bus;
  pci->device = id.device;
  std::snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", id.domain, id.bus, id.device,
                id.function);
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", id.domain & 0xffff,
                id.bus, id.device, id.function);
  // The PCI device and subsystem ids are not known to hiberd's clients: 0.
  return NVML_SUCCESS;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return hiber_entry::nvmlDeviceGetPciInfo_v3(device, pci);
}
nvmlReturn_t hiber_entry::nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return hiber_entry::nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t hiber_entry::nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                             int* minor) {
  HIBER_NVML_DEVICE(device, i);
  if (major == nullptr || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (nvmlReturn_t r =
          from_cu(cuDeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i));
      r != NVML_SUCCESS) {
    return r;
  }
  return from_cu(cuDeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, i));
}

// The function's quota and what it has allocated, the figures cudaMemGetInfo reports.
nvmlReturn_t hiber_entry::nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  HIBER_NVML_DEVICE(device, i);
  (void)i;
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  size_t free_bytes = 0, total_bytes = 0;
  if (nvmlReturn_t r = from_cu(cuMemGetInfo(&free_bytes, &total_bytes)); r != NVML_SUCCESS) {
    return r;
  }
  memory->total = total_bytes;
  memory->free = free_bytes;
  memory->used = total_bytes - free_bytes;
  return NVML_SUCCESS;
}

nvmlReturn_t hiber_entry::nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  nvmlMemory_t v1{};
  if (nvmlReturn_t r = hiber_entry::nvmlDeviceGetMemoryInfo(device, &v1); r != NVML_SUCCESS)
    return r;
  memory->total = v1.total;
  memory->reserved = 0;
  memory->free = v1.free;
  memory->used = v1.used;
  return NVML_SUCCESS;
}
