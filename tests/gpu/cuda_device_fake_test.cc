// The CUDA backend's own logic against a fake driver (tests/gpu/fake_cuda.h), on any machine:
// entry-point resolution, contexts, the checks made before calling the driver, what is passed to
// it (access descriptors, launch buffers, stream priorities, contexts of peer copies) and how its
// answers come back. Whether a real driver behaves as the fake does is for the gpu tests.
//
// The test loads the fake (HIBER_FAKE_LIBCUDA) itself before creating a device, so the backend's
// dlopen("libcuda.so.1") finds it even on a machine with a real driver. ctest runs the binary once
// normally and once per failure scenario (FakeDriverScenario, driven by environment variables).
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/device/cuda_device.h"
#include "server/device/cuda_driver.h"
#include "tests/gpu/fake_cuda.h"

namespace hiber::device {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kGranularity = 2 << 20;

// Loads the fake by its path before the backend asks for "libcuda.so.1": the loader then hands
// the backend this library (it matches loaded libraries by SONAME), whatever driver the machine
// has. Kept loaded for the whole process, as the backend keeps the driver.
void load_fake() {
  static void* handle = dlopen(HIBER_FAKE_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
}

// What the fake's exported function `name` answers; null when the fake is not loaded.
template <typename T>
T* from_fake(const char* name) {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto get = reinterpret_cast<T* (*)()>(dlsym(handle, name));
  dlclose(handle);  // only drops the reference RTLD_NOLOAD took
  return get != nullptr ? get() : nullptr;
}

FakeCuda* fake() { return from_fake<FakeCuda>("fake_cuda"); }
// The fake's context current on this thread.
const void* current_fake_context() { return from_fake<const void>("fake_cuda_current_context"); }

using Bytes = std::vector<std::byte>;

template <typename T>
void poke(Bytes& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

Bytes bytes_of(std::string_view text) {
  Bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// PTX declaring the kernels every library of the fake has, with the fake's layouts.
constexpr std::string_view kFakePtx =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry _Z4noopv() { ret; }\n"
    ".visible .entry _Z11write_valuePii(.param .u64 p, .param .u32 v) { ret; }\n"
    ".visible .entry _Z10odd_paramsc9OddStructsPi(.param .u8 a, .param .align 8 .b8 b[24],"
    " .param .u16 c, .param .u64 d) { ret; }\n";

// A fatbin (docs/fatbin.md) with one uncompressed entry of `kind` (1 PTX, 2 cubin); `flags` and
// `uncompressed_bytes` let a test forge a compressed entry around `payload`.
Bytes fatbin_of(uint16_t kind, Bytes payload, uint64_t flags = 0x11,
                uint64_t uncompressed_bytes = 0) {
  const auto compressed_bytes = static_cast<uint32_t>(uncompressed_bytes != 0 ? payload.size() : 0);
  payload.resize((payload.size() + 7) / 8 * 8);
  Bytes image(16 + 64 + payload.size());
  poke<uint32_t>(image, 0, 0xBA55ED50u);
  poke<uint16_t>(image, 4, 1);
  poke<uint16_t>(image, 6, 16);
  poke<uint64_t>(image, 8, 64 + payload.size());
  poke<uint16_t>(image, 16, kind);
  poke<uint32_t>(image, 20, 64);
  poke<uint64_t>(image, 24, payload.size());
  poke<uint32_t>(image, 32, compressed_bytes);
  poke<uint32_t>(image, 44, 90);
  poke<uint64_t>(image, 56, flags);
  poke<uint64_t>(image, 72, uncompressed_bytes);
  std::memcpy(image.data() + 16 + 64, payload.data(), payload.size());
  return image;
}

Bytes fake_fatbin() { return fatbin_of(1, bytes_of(kFakePtx)); }

// The smallest cubin the reader accepts: an EM_CUDA ELF64 header and two sections (the null
// one and the section name table), no symbols and so no kernels.
Bytes tiny_cubin() {
  const std::string_view names("\0.shstrtab\0", 11);
  Bytes elf(64 + 16 + 2 * 64);
  std::memcpy(elf.data(),
              "\x7f"
              "ELF\x02\x01\x01",
              7);
  poke<uint16_t>(elf, 16, 2);    // ET_EXEC
  poke<uint16_t>(elf, 18, 190);  // EM_CUDA
  poke<uint64_t>(elf, 40, 80);   // section headers
  poke<uint16_t>(elf, 52, 64);
  poke<uint16_t>(elf, 58, 64);
  poke<uint16_t>(elf, 60, 2);
  poke<uint16_t>(elf, 62, 1);
  std::memcpy(elf.data() + 64, names.data(), names.size());
  const size_t shstrtab = 80 + 64;
  poke<uint32_t>(elf, shstrtab, 1);        // name
  poke<uint32_t>(elf, shstrtab + 4, 3);    // SHT_STRTAB
  poke<uint64_t>(elf, shstrtab + 24, 64);  // offset
  poke<uint64_t>(elf, shstrtab + 32, names.size());
  return elf;
}

class CudaDeviceFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("FAKE_CUDA_SCENARIO") != nullptr) GTEST_SKIP() << "a failure scenario run";
    ASSERT_NO_FATAL_FAILURE(load_fake());
    Result<std::unique_ptr<Device>> created = create_cuda_device({});
    ASSERT_TRUE(created.ok()) << created.status();
    device_ = std::move(created).value();
    fake_ = fake();
    ASSERT_NE(fake_, nullptr) << "the backend did not load the fake libcuda.so.1";
    std::lock_guard lock(fake_->mutex);
    fake_->copies.clear();
    fake_->launches.clear();
    fake_->kernel_attributes.clear();
    fake_->set_access_calls.clear();
    fake_->wrong_context_calls.clear();
    fake_->callback_status = CUDA_SUCCESS;
  }
  void TearDown() override {
    if (fake_ == nullptr) return;
    std::lock_guard lock(fake_->mutex);
    EXPECT_THAT(fake_->wrong_context_calls, ElementsAre())
        << "driver calls made without the GPU's context current";
  }

  DevicePtr mapped(int gpu, uint64_t bytes, std::vector<int> access) {
    Result<DevicePtr> va = device_->reserve_address_range(bytes, 0);
    EXPECT_TRUE(va.ok()) << va.status();
    Result<PhysicalMemory> memory = device_->create_physical(gpu, bytes);
    EXPECT_TRUE(memory.ok()) << memory.status();
    EXPECT_TRUE(device_->map(*va, bytes, *memory, 0).ok());
    EXPECT_TRUE(device_->set_access(*va, bytes, access).ok());
    EXPECT_TRUE(device_->release_physical(*memory).ok());  // the mapping keeps it
    return *va;
  }

  std::unique_ptr<Device> device_;
  FakeCuda* fake_ = nullptr;
};

TEST_F(CudaDeviceFakeTest, ResolvesEveryEntryPointAtItsVersionAndNothingElse) {
  std::vector<std::pair<std::string, int>> expected = {{"cuDriverGetVersion", 2020}};
#define HIBER_ROW_(name, version) expected.emplace_back(#name, version);
  HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_ROW_)
#undef HIBER_ROW_
  std::lock_guard lock(fake_->mutex);
  // Once per process, however many devices are created.
  EXPECT_EQ(fake_->resolved, expected);
  EXPECT_THAT(fake_->resolve_flags,
              ElementsAre(static_cast<unsigned long long>(CU_GET_PROC_ADDRESS_LEGACY_STREAM)));
  // The CUDA 13 ABIs where a header name maps to a newer variant.
  auto version_of = [&](const std::string& name) {
    for (auto& [n, v] : fake_->resolved)
      if (n == name) return v;
    return 0;
  };
  EXPECT_EQ(version_of("cuDeviceGetUuid"), 11040);
  EXPECT_EQ(version_of("cuEventElapsedTime"), 12080);
  EXPECT_EQ(version_of("cuMemGetInfo"), 3020);
  EXPECT_EQ(version_of("cuMemcpyHtoDAsync"), 3020);
}

TEST_F(CudaDeviceFakeTest, ReadsPropertiesAndNormalizesBusIds) {
  ASSERT_EQ(device_->gpu_count(), 2);
  EXPECT_EQ(device_->backend_name(), "cuda");
  const DeviceProperties& p = device_->properties(1);
  EXPECT_EQ(p.ordinal, 1);
  EXPECT_EQ(p.name, "Fake GPU");
  EXPECT_EQ(p.pci_bus_id, "0000:1b:00.0");
  EXPECT_EQ(p.uuid[0], 17);
  EXPECT_EQ(p.total_memory_bytes, 16ull << 30);
  EXPECT_EQ(p.attribute(kAttrWarpSize), 32);
  EXPECT_EQ(p.attribute(kAttrComputeCapabilityMajor), 9);
  EXPECT_EQ(p.attribute(20), 1020);  // filled by index
  EXPECT_EQ(p.attribute(92), 0);     // CUDA_ERROR_NOT_SUPPORTED
  EXPECT_EQ(p.attribute(150), 0);    // past CU_DEVICE_ATTRIBUTE_MAX: CUDA_ERROR_INVALID_VALUE
  EXPECT_EQ(p.attribute(0), 0);
  EXPECT_EQ(device_->allocation_granularity(0), kGranularity);
  Result<MemoryInfo> info = device_->memory_info(1);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->total_bytes, 16ull << 30);
  EXPECT_EQ(device_->memory_info(2).status().code(), ErrorCode::kInvalidDevice);
}

TEST_F(CudaDeviceFakeTest, RetainsOnePrimaryContextPerGpuAndReleasesIt) {
  std::map<int, int> before;
  {
    std::lock_guard lock(fake_->mutex);
    before = fake_->primary_context_refs;
    EXPECT_EQ(before[0], 1);
    EXPECT_EQ(before[1], 1);
  }
  {
    Result<std::unique_ptr<Device>> second = create_cuda_device({});
    ASSERT_TRUE(second.ok()) << second.status();
    std::lock_guard lock(fake_->mutex);
    EXPECT_EQ(fake_->primary_context_refs[0], 2);
    // Peer access was already enabled by the first device: tolerated.
    EXPECT_EQ(fake_->peer_access, (std::set<std::pair<int, int>>{{0, 1}, {1, 0}}));
  }
  std::lock_guard lock(fake_->mutex);
  EXPECT_EQ(fake_->primary_context_refs, before);
}

TEST_F(CudaDeviceFakeTest, DiscoversPeersAndEstimatesTheirLinks) {
  EXPECT_TRUE(device_->can_access_peer(0, 1));
  EXPECT_TRUE(device_->can_access_peer(1, 0));
  EXPECT_FALSE(device_->can_access_peer(1, 1));  // as cuDeviceCanAccessPeer
  EXPECT_FALSE(device_->can_access_peer(0, 2));
  const NodeConfig& node = device_->topology();
  ASSERT_EQ(node.gpu_count(), 2);
  EXPECT_EQ(node.gpus[0].model, "fake-gpu");
  EXPECT_EQ(node.gpus[0].pci_bus_id, "0000:1a:00.0");
  EXPECT_EQ(node.gpus[1].multiprocessors, 132);
  EXPECT_NEAR(node.gpus[0].memory_bandwidth_gbps, 3352.3, 0.1);
  ASSERT_EQ(node.nvlinks.size(), 1u);
  EXPECT_EQ(node.nvlinks[0].gpu_a, 0);
  EXPECT_EQ(node.nvlinks[0].gpu_b, 1);
  EXPECT_EQ(node.nvlinks[0].bandwidth_gbps, 450.0);  // sm_90, rank 0, native atomics
  // This machine's sysfs has no such buses: each GPU on a default link of its own.
  EXPECT_EQ(node.pcie_switches.size(), 2u);
}

TEST_F(CudaDeviceFakeTest, PeersOverPcieAreNoNvLink) {
  {
    std::lock_guard lock(fake_->mutex);
    fake_->p2p_atomics = false;  // peer access, but no native atomics: PCIe
  }
  Result<std::unique_ptr<Device>> pcie = create_cuda_device({});
  {
    std::lock_guard lock(fake_->mutex);
    fake_->p2p_atomics = true;
  }
  ASSERT_TRUE(pcie.ok()) << pcie.status();
  EXPECT_TRUE((*pcie)->can_access_peer(0, 1));
  EXPECT_TRUE((*pcie)->topology().nvlinks.empty());
}

TEST_F(CudaDeviceFakeTest, ReservesInAnyGpusGranularity) {
  constexpr uint64_t kLarge = 2 * kGranularity;
  {
    std::lock_guard lock(fake_->mutex);
    fake_->granularity[1] = kLarge;
  }
  Result<std::unique_ptr<Device>> mixed = create_cuda_device({});
  {
    std::lock_guard lock(fake_->mutex);
    fake_->granularity.clear();
  }
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  Device& d = **mixed;
  ASSERT_EQ(d.allocation_granularity(0), kGranularity);
  ASSERT_EQ(d.allocation_granularity(1), kLarge);
  // A multiple of GPU 0's granularity, for GPU 0's memory: reserved from the driver in, and
  // aligned to, GPU 1's larger one.
  Result<DevicePtr> va = d.reserve_address_range(3 * kGranularity, 0);
  ASSERT_TRUE(va.ok()) << va.status();
  EXPECT_EQ(*va % kLarge, 0u);
  {
    std::lock_guard lock(fake_->mutex);
    EXPECT_EQ(fake_->reserve_sizes.back(), 2 * kLarge);
    EXPECT_EQ(fake_->reserve_alignments.back(), kLarge);
  }
  Result<PhysicalMemory> memory = d.create_physical(0, kGranularity);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_TRUE(d.map(*va + 2 * kGranularity, kGranularity, *memory, 0).ok());
  EXPECT_EQ(d.map(*va + 3 * kGranularity, kGranularity, *memory, 0).code(),
            ErrorCode::kInvalidValue)
      << "past the range asked for";
  EXPECT_EQ(d.reserve_address_range(kGranularity / 2, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(d.free_address_range(*va, 2 * kLarge).code(), ErrorCode::kInvalidValue)
      << "given back as it was asked for";
  EXPECT_TRUE(d.unmap(*va + 2 * kGranularity, kGranularity).ok());
  EXPECT_TRUE(d.release_physical(*memory).ok());
  EXPECT_TRUE(d.free_address_range(*va, 3 * kGranularity).ok());  // the driver's 8 MiB
}

TEST_F(CudaDeviceFakeTest, TakesAConfiguredTopologyThatMatches) {
  CudaDeviceOptions options;
  options.node = device_->topology();
  options.node->name = "given";
  options.node->gpus[0].pci_bus_id = "0000:1A:00.0";
  Result<std::unique_ptr<Device>> given = create_cuda_device(options);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ((*given)->topology().name, "given");
  EXPECT_EQ((*given)->topology().gpus[0].pci_bus_id, "0000:1a:00.0");

  options.node->gpus.pop_back();
  Result<std::unique_ptr<Device>> too_few = create_cuda_device(options);
  ASSERT_FALSE(too_few.ok());
  EXPECT_EQ(too_few.status().code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(too_few.status().message(),
              HasSubstr("describes 1 GPUs but the NVIDIA driver sees 2"));

  options.node = device_->topology();
  std::swap(options.node->gpus[0].pci_bus_id, options.node->gpus[1].pci_bus_id);
  Result<std::unique_ptr<Device>> swapped = create_cuda_device(options);
  ASSERT_FALSE(swapped.ok());
  EXPECT_THAT(swapped.status().message(),
              HasSubstr("GPU 0 is at PCI bus 0000:1b:00.0 in the config but the driver's GPU 0 "
                        "is at 0000:1a:00.0"));
}

TEST_F(CudaDeviceFakeTest, ReservesAtLeastGranularityAligned) {
  Result<DevicePtr> va = device_->reserve_address_range(4 * kGranularity, 4096);
  ASSERT_TRUE(va.ok());
  Result<DevicePtr> big = device_->reserve_address_range(4 * kGranularity, 1ull << 30);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(*big % (1ull << 30), 0u);
  {
    std::lock_guard lock(fake_->mutex);
    ASSERT_GE(fake_->reserve_alignments.size(), 2u);
    EXPECT_EQ(fake_->reserve_alignments.end()[-2], kGranularity);
    EXPECT_EQ(fake_->reserve_alignments.end()[-1], 1ull << 30);
  }
  EXPECT_EQ(device_->reserve_address_range(0, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->reserve_address_range(kGranularity, 3).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_TRUE(device_->free_address_range(*va, 4 * kGranularity).ok());
  EXPECT_TRUE(device_->free_address_range(*big, 4 * kGranularity).ok());
}

TEST_F(CudaDeviceFakeTest, ChecksMapsAndUnmapsAgainstItsMappingTable) {
  const uint64_t g = kGranularity;
  Result<DevicePtr> va = device_->reserve_address_range(8 * g, 0);
  Result<PhysicalMemory> memory = device_->create_physical(1, 4 * g);
  ASSERT_TRUE(va.ok() && memory.ok());
  EXPECT_EQ(memory->gpu, 1);
  EXPECT_EQ(memory->bytes, 4 * g);
  EXPECT_EQ(device_->create_physical(0, g + 1).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->map(*va + 4096, g, *memory, 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->map(*va, 0, *memory, 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->map(*va, 2 * g, *memory, 3 * g).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->map(*va, g, PhysicalMemory{}, 0).code(), ErrorCode::kInvalidHandle);
  Status outside = device_->map(*va + 8 * g, g, *memory, 0);
  EXPECT_EQ(outside.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(outside.message(), HasSubstr("not inside one range from reserve_address_range"));
  EXPECT_EQ(device_->map(*va + 7 * g, 2 * g, *memory, 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->free_address_range(*va, 4 * g).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->free_address_range(*va + g, 7 * g).code(), ErrorCode::kInvalidValue);

  // [va, va+2g) and [va+2g, va+3g) from the same memory, [va+4g, va+5g) after a hole.
  ASSERT_TRUE(device_->map(*va, 2 * g, *memory, 0).ok());
  ASSERT_TRUE(device_->map(*va + 2 * g, g, *memory, 2 * g).ok());
  ASSERT_TRUE(device_->map(*va + 4 * g, g, *memory, 0).ok());
  Status overlap = device_->map(*va + g, 2 * g, *memory, 0);
  EXPECT_EQ(overlap.code(), ErrorCode::kAlreadyMapped);
  EXPECT_THAT(overlap.message(), HasSubstr("overlaps the mapping at"));
  EXPECT_EQ(device_->map(*va + 3 * g, 2 * g, *memory, 0).code(), ErrorCode::kAlreadyMapped);

  EXPECT_TRUE(device_->set_access(*va, 3 * g, std::vector<int>{1}).ok());  // two mappings
  EXPECT_EQ(device_->set_access(*va, 5 * g, std::vector<int>{1}).code(),   // the hole
            ErrorCode::kNotMapped);
  EXPECT_EQ(device_->set_access(*va + 5 * g, g, std::vector<int>{1}).code(), ErrorCode::kNotMapped);
  EXPECT_EQ(device_->unmap(*va + g, g).code(), ErrorCode::kInvalidValue);  // inside one
  EXPECT_EQ(device_->unmap(*va, g).code(), ErrorCode::kInvalidValue);      // half of one
  EXPECT_EQ(device_->unmap(*va + 6 * g, g).code(), ErrorCode::kNotMapped);
  EXPECT_EQ(device_->free_address_range(*va, 8 * g).code(), ErrorCode::kInvalidValue);

  EXPECT_TRUE(device_->unmap(*va, 3 * g).ok());
  EXPECT_TRUE(device_->map(*va + g, g, *memory, 0).ok());  // the space is free again
  EXPECT_TRUE(device_->unmap(*va + g, g).ok());
  EXPECT_TRUE(device_->unmap(*va + 4 * g, g).ok());
  EXPECT_TRUE(device_->release_physical(*memory).ok());
  EXPECT_TRUE(device_->free_address_range(*va, 8 * g).ok());
}

TEST_F(CudaDeviceFakeTest, SetAccessNamesEveryGpuSoOthersLoseAccess) {
  DevicePtr va = mapped(0, kGranularity, {0});
  auto last_call = [&] {
    std::lock_guard lock(fake_->mutex);
    std::vector<std::pair<int, unsigned long long>> out;
    for (const CUmemAccessDesc& d : fake_->set_access_calls.back()) {
      EXPECT_EQ(d.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
      out.emplace_back(d.location.id, d.flags);
    }
    return out;
  };
  using Flags = std::vector<std::pair<int, unsigned long long>>;
  EXPECT_EQ(last_call(),
            (Flags{{0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}, {1, CU_MEM_ACCESS_FLAGS_PROT_NONE}}));
  ASSERT_TRUE(device_->set_access(va, kGranularity, std::vector<int>{1, 1}).ok());
  EXPECT_EQ(last_call(),
            (Flags{{0, CU_MEM_ACCESS_FLAGS_PROT_NONE}, {1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}}));
  ASSERT_TRUE(device_->set_access(va, kGranularity, std::vector<int>{}).ok());
  EXPECT_EQ(last_call(),
            (Flags{{0, CU_MEM_ACCESS_FLAGS_PROT_NONE}, {1, CU_MEM_ACCESS_FLAGS_PROT_NONE}}));
  EXPECT_EQ(device_->set_access(va, kGranularity, std::vector<int>{2}).code(),
            ErrorCode::kInvalidDevice);
  EXPECT_EQ(device_->set_access(va, 0, std::vector<int>{0}).code(), ErrorCode::kInvalidValue);
}

TEST_F(CudaDeviceFakeTest, SetAccessWithoutPeerAccessLeavesUnreachableGpusOut) {
  {
    std::lock_guard lock(fake_->mutex);
    fake_->p2p = false;
  }
  Result<std::unique_ptr<Device>> isolated = create_cuda_device({});
  {
    std::lock_guard lock(fake_->mutex);
    fake_->p2p = true;
  }
  ASSERT_TRUE(isolated.ok()) << isolated.status();
  Device& d = **isolated;
  EXPECT_FALSE(d.can_access_peer(0, 1));
  EXPECT_TRUE(d.topology().nvlinks.empty());
  Result<DevicePtr> va = d.reserve_address_range(kGranularity, 0);
  Result<PhysicalMemory> memory = d.create_physical(0, kGranularity);
  ASSERT_TRUE(va.ok() && memory.ok());
  ASSERT_TRUE(d.map(*va, kGranularity, *memory, 0).ok());
  Status refused = d.set_access(*va, kGranularity, std::vector<int>{0, 1});
  EXPECT_EQ(refused.code(), ErrorCode::kPeerAccessUnsupported);
  EXPECT_THAT(refused.message(), HasSubstr("GPU 1 cannot access memory of GPU 0"));
  ASSERT_TRUE(d.set_access(*va, kGranularity, std::vector<int>{}).ok());
  {
    std::lock_guard lock(fake_->mutex);
    ASSERT_EQ(fake_->set_access_calls.back().size(), 1u);  // GPU 1 never had access
    EXPECT_EQ(fake_->set_access_calls.back()[0].location.id, 0);
  }
  EXPECT_TRUE(d.unmap(*va, kGranularity).ok());
  EXPECT_TRUE(d.release_physical(*memory).ok());
  EXPECT_TRUE(d.free_address_range(*va, kGranularity).ok());
}

TEST_F(CudaDeviceFakeTest, RegistersHostMemoryAndPassesDriverErrorsThrough) {
  std::vector<char> host(8192);
  EXPECT_TRUE(device_->register_host_memory(host.data(), host.size()).ok());
  Status twice = device_->register_host_memory(host.data(), host.size());
  EXPECT_EQ(static_cast<int>(twice.code()), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_THAT(twice.message(),
              HasSubstr("cuMemHostRegister: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (a fake "
                        "driver error)"));
  EXPECT_TRUE(device_->unregister_host_memory(host.data()).ok());
  EXPECT_EQ(static_cast<int>(device_->unregister_host_memory(host.data()).code()),
            CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(device_->register_host_memory(nullptr, 10).code(), ErrorCode::kInvalidValue);
}

TEST_F(CudaDeviceFakeTest, CreatesNonBlockingStreamsWithClampedPriorities) {
  for (int priority : {-100, -3, 0, 7}) {
    Result<Stream> s = device_->create_stream(1, priority);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->gpu, 1);
    EXPECT_NE(s->id, 0u);
    EXPECT_TRUE(device_->synchronize_stream(*s).ok());
    EXPECT_TRUE(device_->query_stream(*s).ok());
    EXPECT_TRUE(device_->destroy_stream(*s).ok());
  }
  std::lock_guard lock(fake_->mutex);
  EXPECT_THAT(std::vector<int>(fake_->stream_priorities.end() - 4, fake_->stream_priorities.end()),
              ElementsAre(-5, -3, 0, 0));
  for (unsigned flags : fake_->stream_flags) EXPECT_EQ(flags, CU_STREAM_NON_BLOCKING);
}

TEST_F(CudaDeviceFakeTest, RejectsHandlesItDidNotMake) {
  EXPECT_EQ(device_->synchronize_stream(Stream{0, 0}).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(device_->query_event(Event{0, 0}).code(), ErrorCode::kInvalidHandle);
  Result<Stream> s = device_->create_stream(0, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(device_->synchronize_stream(Stream{s->id, 5}).code(), ErrorCode::kInvalidDevice);
  EXPECT_EQ(device_->function_info(Function{1234}).status().code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(device_->launch(*s, Function{1234}, {}, {}).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(device_->unload_module(Module{}).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(device_->release_physical(PhysicalMemory{}).code(), ErrorCode::kInvalidHandle);
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
}

TEST_F(CudaDeviceFakeTest, EventsRecordOnTheirOwnGpuAndTime) {
  Result<Stream> s0 = device_->create_stream(0, 0);
  Result<Stream> s1 = device_->create_stream(1, 0);
  Result<Event> a = device_->create_event(0, false);
  Result<Event> b = device_->create_event(0, false);
  Result<Event> untimed = device_->create_event(0, true);
  Result<Event> on1 = device_->create_event(1, false);
  ASSERT_TRUE(s0.ok() && s1.ok() && a.ok() && b.ok() && untimed.ok() && on1.ok());
  EXPECT_EQ(on1->gpu, 1);
  EXPECT_EQ(device_->elapsed_ms(*a, *b).status().code(), ErrorCode::kInvalidHandle);  // unrecorded
  ASSERT_TRUE(device_->record_event(*a, *s0).ok());
  ASSERT_TRUE(device_->record_event(*b, *s0).ok());
  ASSERT_TRUE(device_->record_event(*untimed, *s0).ok());
  Status cross = device_->record_event(*on1, *s0);
  EXPECT_EQ(cross.code(), ErrorCode::kInvalidHandle);
  EXPECT_THAT(cross.message(), HasSubstr("event of GPU 1"));
  // Streams may wait on events of other GPUs.
  EXPECT_TRUE(device_->wait_event(*s1, *a).ok());
  EXPECT_TRUE(device_->synchronize_event(*b).ok());
  EXPECT_TRUE(device_->query_event(*b).ok());
  Result<float> ms = device_->elapsed_ms(*a, *b);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_FLOAT_EQ(*ms, 1.5f);
  EXPECT_EQ(device_->elapsed_ms(*a, *untimed).status().code(), ErrorCode::kInvalidHandle);
  for (Event e : {*a, *b, *untimed, *on1}) EXPECT_TRUE(device_->destroy_event(e).ok());
  EXPECT_TRUE(device_->destroy_stream(*s0).ok());
  EXPECT_TRUE(device_->destroy_stream(*s1).ok());
}

TEST_F(CudaDeviceFakeTest, CallbacksReceiveTheStatusOfEarlierWork) {
  Result<Stream> s = device_->create_stream(0, 0);
  ASSERT_TRUE(s.ok());
  std::promise<Status> ok;
  ASSERT_TRUE(device_->add_callback(*s, [&](Status st) { ok.set_value(st); }).ok());
  EXPECT_TRUE(ok.get_future().get().ok());
  {
    std::lock_guard lock(fake_->mutex);
    fake_->callback_status = CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  std::promise<Status> failed;
  ASSERT_TRUE(device_->add_callback(*s, [&](Status st) { failed.set_value(st); }).ok());
  Status st = failed.get_future().get();
  EXPECT_EQ(st.code(), ErrorCode::kIllegalAddress);
  EXPECT_FALSE(st.message().empty());
  EXPECT_EQ(device_->add_callback(*s, nullptr).code(), ErrorCode::kInvalidValue);
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
}

TEST_F(CudaDeviceFakeTest, CopiesRunInTheStreamsContext) {
  Result<Stream> s1 = device_->create_stream(1, 0);
  ASSERT_TRUE(s1.ok());
  char host[64] = {};
  ASSERT_TRUE(device_->copy_host_to_device(*s1, 0x1000, host, sizeof host).ok());
  ASSERT_TRUE(device_->copy_device_to_host(*s1, host, 0x2000, 32).ok());
  ASSERT_TRUE(device_->copy_device_to_device(*s1, 0x3000, 0x4000, 16).ok());
  ASSERT_TRUE(device_->copy_peer(*s1, 0x5000, 1, 0x6000, 0, 8).ok());
  EXPECT_EQ(device_->copy_peer(*s1, 0x5000, 1, 0x6000, 2, 8).code(), ErrorCode::kInvalidDevice);
  ASSERT_TRUE(device_->memset(*s1, 0x7000, 0x12345678, 1, 10).ok());
  ASSERT_TRUE(device_->memset(*s1, 0x7000, 0x12345678, 2, 11).ok());
  ASSERT_TRUE(device_->memset(*s1, 0x7000, 0x12345678, 4, 12).ok());
  Status odd = device_->memset(*s1, 0x7000, 0, 8, 1);
  EXPECT_EQ(odd.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(odd.message(), HasSubstr("1, 2 or 4"));
  EXPECT_TRUE(device_->destroy_stream(*s1).ok());
  std::lock_guard lock(fake_->mutex);
  const auto& c = fake_->copies;
  ASSERT_EQ(c.size(), 7u);
  for (const FakeCudaCopy& copy : c) EXPECT_EQ(copy.gpu, 1) << copy.kind;
  EXPECT_EQ(c[0].kind, "HtoD");
  EXPECT_EQ(c[0].dst, 0x1000u);
  EXPECT_EQ(c[0].count, 64u);
  EXPECT_EQ(c[1].kind, "DtoH");
  EXPECT_EQ(c[1].src, 0x2000u);
  EXPECT_EQ(c[2].kind, "DtoD");
  EXPECT_EQ(c[3].kind, "Peer");
  EXPECT_EQ(c[3].dst_gpu, 1);
  EXPECT_EQ(c[3].src_gpu, 0);
  EXPECT_EQ(c[3].dst, 0x5000u);
  EXPECT_EQ(c[3].src, 0x6000u);
  EXPECT_EQ(c[4].kind, "D8");
  EXPECT_EQ(c[4].value, 0x78u);
  EXPECT_EQ(c[4].count, 10u);
  EXPECT_EQ(c[5].kind, "D16");
  EXPECT_EQ(c[5].value, 0x5678u);
  EXPECT_EQ(c[5].count, 11u);
  EXPECT_EQ(c[6].kind, "D32");
  EXPECT_EQ(c[6].value, 0x12345678u);
  EXPECT_EQ(c[6].count, 12u);
}

TEST_F(CudaDeviceFakeTest, ZeroSizedWorkNeverReachesTheDriver) {
  Result<Stream> s = device_->create_stream(0, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(device_->copy_host_to_device(*s, 0, nullptr, 0).ok());
  EXPECT_TRUE(device_->copy_device_to_host(*s, nullptr, 0, 0).ok());
  EXPECT_TRUE(device_->copy_device_to_device(*s, 0, 0, 0).ok());
  EXPECT_TRUE(device_->copy_peer(*s, 0, 1, 0, 0, 0).ok());
  EXPECT_TRUE(device_->memset(*s, 0x1000, 7, 4, 0).ok());
  // Still checked: the element size, the alignment and the stream.
  EXPECT_EQ(device_->memset(*s, 0x1000, 7, 3, 0).code(), ErrorCode::kInvalidValue);
  Status misaligned = device_->memset(*s, 0x1002, 7, 4, 1);
  EXPECT_EQ(misaligned.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(misaligned.message(), HasSubstr("aligned to the element size"));
  EXPECT_EQ(device_->memset(*s, 0x1001, 7, 2, 1).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->copy_device_to_device(Stream{}, 0, 0, 0).code(), ErrorCode::kInvalidHandle);
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
  std::lock_guard lock(fake_->mutex);
  EXPECT_TRUE(fake_->copies.empty());
}

TEST_F(CudaDeviceFakeTest, LaunchRefusesDimensionsBeyondTheGpusLimits) {
  Result<Module> module = device_->load_module(fake_fatbin());
  ASSERT_TRUE(module.ok());
  Result<Function> noop = device_->get_function(*module, "_Z4noopv");
  Result<Stream> s = device_->create_stream(0, 0);
  ASSERT_TRUE(noop.ok() && s.ok());
  for (LaunchConfig bad :
       {LaunchConfig{{0, 1, 1}, {1, 1, 1}, 0}, LaunchConfig{{1, 1, 1}, {1, 0, 1}, 0},
        LaunchConfig{{1, 1, 1}, {1025, 1, 1}, 0},
        LaunchConfig{{1, 1, 1}, {64, 32, 1}, 0},  // 2048 threads
        LaunchConfig{{1, 1, 1}, {1, 1, 65}, 0}, LaunchConfig{{1, 65536, 1}, {1, 1, 1}, 0},
        LaunchConfig{{1, 1, 65536}, {1, 1, 1}, 0}}) {
    Status refused = device_->launch(*s, *noop, bad, {});
    EXPECT_EQ(refused.code(), ErrorCode::kInvalidValue) << refused;
  }
  Status big = device_->launch(*s, *noop, {{1, 1, 1}, {2048, 1, 1}, 0}, {});
  EXPECT_THAT(big.message(), HasSubstr("block 2048x1x1 exceeds GPU 0's limits (1024x1024x64, "
                                       "1024 threads)"));
  EXPECT_TRUE(device_->launch(*s, *noop, {{2147483647u, 65535, 65535}, {32, 32, 1}, 0}, {}).ok());
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
  EXPECT_TRUE(device_->unload_module(*module).ok());
  std::lock_guard lock(fake_->mutex);
  EXPECT_EQ(fake_->launches.size(), 1u);
}

TEST_F(CudaDeviceFakeTest, LoadsModulesAndLaunchesWithThePackedBuffer) {
  Result<Module> module = device_->load_module(fake_fatbin());
  ASSERT_TRUE(module.ok()) << module.status();

  Result<Function> odd = device_->get_function(*module, "_Z10odd_paramsc9OddStructsPi");
  ASSERT_TRUE(odd.ok()) << odd.status();
  Result<KernelInfo> info = device_->function_info(*odd);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->name, "_Z10odd_paramsc9OddStructsPi");
  EXPECT_EQ(info->params, (std::vector<ParamInfo>{{0, 1}, {8, 24}, {32, 2}, {40, 8}}));
  Result<Function> again = device_->get_function(*module, "_Z10odd_paramsc9OddStructsPi");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, odd->id);
  Status missing = device_->get_function(*module, "nope").status();
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("'nope'"));

  Result<Stream> s = device_->create_stream(1, 0);
  ASSERT_TRUE(s.ok());
  std::vector<std::byte> params(48);
  for (size_t i = 0; i < params.size(); ++i) params[i] = std::byte(i);
  LaunchConfig config{{4, 2, 1}, {128, 1, 1}, 256};
  Status wrong = device_->launch(*s, *odd, config, std::span(params).first(40));
  EXPECT_EQ(wrong.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(wrong.message(), HasSubstr("takes 48 bytes of parameters (4 parameters), got 40"));
  ASSERT_TRUE(device_->launch(*s, *odd, config, params).ok());

  Result<Function> noop = device_->get_function(*module, "_Z4noopv");
  ASSERT_TRUE(noop.ok());
  ASSERT_TRUE(device_->launch(*s, *noop, {}, {}).ok());
  {
    std::lock_guard lock(fake_->mutex);
    ASSERT_EQ(fake_->launches.size(), 2u);  // the wrong one never reached the driver
    const FakeCudaLaunch& l = fake_->launches[0];
    EXPECT_EQ(l.kernel, "_Z10odd_paramsc9OddStructsPi");
    EXPECT_THAT(l.grid, ElementsAre(4, 2, 1));
    EXPECT_THAT(l.block, ElementsAre(128, 1, 1));
    EXPECT_EQ(l.shared_memory_bytes, 256u);
    EXPECT_EQ(l.gpu, 1);
    EXPECT_TRUE(l.had_extra);
    EXPECT_EQ(l.params, params);
    EXPECT_FALSE(fake_->launches[1].had_extra);  // no parameters, no buffer
  }
  EXPECT_TRUE(device_->unload_module(*module).ok());
  EXPECT_EQ(device_->function_info(*odd).status().code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(device_->launch(*s, *noop, {}, {}).code(), ErrorCode::kInvalidHandle);
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
}

// Kernel deadlines (issue 18, item 3): the backend records an event after a launch with a
// deadline and polls it; a launch whose event is still pending past the deadline is reported
// once, later kernels of the lost context never reach the driver, and the event is destroyed once
// the work is seen done.
TEST_F(CudaDeviceFakeTest, ALaunchPastItsDeadlineIsReportedOnceAndItsContextsKernelsRefused) {
  Result<Module> module = device_->load_module(fake_fatbin());
  ASSERT_TRUE(module.ok()) << module.status();
  Result<Function> noop = device_->get_function(*module, "_Z4noopv");
  ASSERT_TRUE(noop.ok());
  Result<Stream> s = device_->create_stream(1, 0);
  ASSERT_TRUE(s.ok());
  int destroyed_before = 0;
  {
    std::lock_guard lock(fake_->mutex);
    fake_->events_pending = true;
    destroyed_before = fake_->events_destroyed;
  }
  auto lost = std::make_shared<std::atomic<bool>>(false);
  std::atomic<int> reports{0};
  std::promise<Status> told;
  LaunchConfig config;
  config.deadline = std::chrono::milliseconds(30);
  config.context_lost = lost;
  config.on_timeout = [&](const Status& why) {
    lost->store(true);
    if (reports.fetch_add(1) == 0) told.set_value(why);
  };
  ASSERT_TRUE(device_->launch(*s, *noop, config, {}).ok());
  const Status late = told.get_future().get();
  EXPECT_EQ(late.code(), ErrorCode::kLaunchTimeout) << late;
  EXPECT_THAT(late.message(), HasSubstr("_Z4noopv ran past its deadline of 30 ms"));
  EXPECT_EQ(device_->launch(*s, *noop, config, {}).code(), ErrorCode::kLaunchTimeout);

  {
    std::lock_guard lock(fake_->mutex);
    EXPECT_EQ(fake_->launches.size(), 1u) << "the refused launch never reached the driver";
    fake_->events_pending = false;  // the kernel ends at last
  }
  while (true) {
    {
      std::lock_guard lock(fake_->mutex);
      if (fake_->events_destroyed > destroyed_before) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(reports.load(), 1) << "reported once";
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
  EXPECT_TRUE(device_->unload_module(*module).ok());
}

// Shared mode's recovery: reset_shared_context resets the GPU's primary context with
// cuDevicePrimaryCtxReset, which ends its streams, events and sticky error; the backend then
// gives it a new probe (context_status answers again), enables peer access again both ways,
// and never passes a stream of the old context to the driver. Memory mappings stay.
TEST_F(CudaDeviceFakeTest, ResettingTheSharedContextEndsItsFaultAndItsStreams) {
  Result<Module> module = device_->load_module(fake_fatbin());
  ASSERT_TRUE(module.ok()) << module.status();
  Result<Function> write = device_->get_function(*module, "_Z11write_valuePii");
  ASSERT_TRUE(write.ok()) << write.status();
  const DevicePtr va = mapped(1, 2 << 20, {1});
  Result<Stream> before = device_->create_stream(1, 0);
  Result<Stream> other_gpu = device_->create_stream(0, 0);
  ASSERT_TRUE(before.ok() && other_gpu.ok());
  {
    std::lock_guard lock(fake_->mutex);
    fake_->faulting_kernel = "_Z11write_valuePii";
    fake_->peer_access.clear();
  }
  std::vector<std::byte> params(12);
  ASSERT_TRUE(device_->launch(*before, *write, {}, params).ok());
  EXPECT_EQ(device_->synchronize_stream(*before).code(), ErrorCode::kIllegalAddress);
  EXPECT_EQ(device_->context_status(device_->shared_context(1)).code(), ErrorCode::kIllegalAddress);
  {
    std::lock_guard lock(fake_->mutex);
    fake_->faulting_kernel.clear();
  }

  ASSERT_TRUE(device_->reset_shared_context(1).ok());
  EXPECT_TRUE(device_->context_status(device_->shared_context(1)).ok());
  Result<Stream> after = device_->create_stream(1, 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(device_->launch(*after, *write, {}, params).ok());
  EXPECT_TRUE(device_->synchronize_stream(*after).ok());
  EXPECT_TRUE(device_->synchronize_stream(*other_gpu).ok()) << "GPU 0 was not touched";
  EXPECT_TRUE(device_->destroy_stream(*after).ok());
  EXPECT_TRUE(device_->destroy_stream(*other_gpu).ok());
  EXPECT_TRUE(device_->unmap(va, 2 << 20).ok()) << "the mapping outlived the reset";
  EXPECT_TRUE(device_->free_address_range(va, 2 << 20).ok());
  EXPECT_TRUE(device_->unload_module(*module).ok());
  std::lock_guard lock(fake_->mutex);
  EXPECT_THAT(fake_->primary_context_resets, ElementsAre(1));
  EXPECT_EQ(fake_->stale_handle_calls, 0) << "a stream of the old context was passed again";
  EXPECT_EQ(fake_->peer_access.count({0, 1}), 1u);
  EXPECT_EQ(fake_->peer_access.count({1, 0}), 1u);
}

// Contexts (issue 29): create_context makes a context with cuCtxCreate and leaves the thread's
// context stack as it was; streams and events live in their context, and every call on them
// makes that context current; a fault in one context is sticky there and nowhere else; a
// destroyed context is gone, and the primary (shared) one cannot be destroyed.
TEST_F(CudaDeviceFakeTest, EachContextKeepsItsStreamsAndItsFaultToItself) {
  Result<Module> module = device_->load_module(fake_fatbin());
  ASSERT_TRUE(module.ok()) << module.status();
  Result<Function> write = device_->get_function(*module, "_Z11write_valuePii");
  ASSERT_TRUE(write.ok()) << write.status();
  int created_before = 0, destroyed_before = 0;
  {
    std::lock_guard lock(fake_->mutex);
    created_before = fake_->contexts_created;
    destroyed_before = fake_->contexts_destroyed;
    fake_->faulting_kernel = "_Z11write_valuePii";
  }
  Result<Stream> primary = device_->create_stream(1, 0);  // leaves GPU 1's primary current
  ASSERT_TRUE(primary.ok());
  const void* current_before = current_fake_context();

  Result<Context> faulty = device_->create_context(1);
  ASSERT_TRUE(faulty.ok()) << faulty.status();
  Result<Context> healthy = device_->create_context(1);
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  EXPECT_EQ(current_fake_context(), current_before) << "cuCtxCreate's push was popped";
  EXPECT_NE(faulty->id, healthy->id);
  EXPECT_NE(faulty->id, device_->shared_context(1).id);
  EXPECT_EQ(faulty->gpu, 1);

  Result<Stream> bad = device_->create_stream(*faulty, 0);
  Result<Stream> good = device_->create_stream(*healthy, 0);
  Result<Event> good_event = device_->create_event(*healthy, false);
  ASSERT_TRUE(bad.ok() && good.ok() && good_event.ok());
  EXPECT_EQ(bad->context, faulty->id);
  EXPECT_EQ(good_event->context, healthy->id);
  EXPECT_EQ(device_->record_event(*good_event, *bad).code(), ErrorCode::kInvalidHandle)
      << "an event is recorded in its own context only";

  std::vector<std::byte> params(12);
  ASSERT_TRUE(device_->launch(*bad, *write, {}, params).ok()) << "the fault shows later";
  EXPECT_EQ(device_->synchronize_stream(*bad).code(), ErrorCode::kIllegalAddress);
  EXPECT_EQ(device_->query_stream(*bad).code(), ErrorCode::kIllegalAddress) << "sticky";
  EXPECT_EQ(device_->context_status(*faulty).code(), ErrorCode::kIllegalAddress);
  EXPECT_EQ(device_->launch(*bad, *write, {}, params).code(), ErrorCode::kIllegalAddress);

  // The other context of the GPU, and its primary context, go on.
  {
    std::lock_guard lock(fake_->mutex);
    fake_->faulting_kernel.clear();
  }
  EXPECT_TRUE(device_->context_status(*healthy).ok());
  EXPECT_TRUE(device_->context_status(device_->shared_context(1)).ok());
  EXPECT_TRUE(device_->launch(*good, *write, {}, params).ok());
  EXPECT_TRUE(device_->record_event(*good_event, *good).ok());
  EXPECT_TRUE(device_->synchronize_event(*good_event).ok());
  EXPECT_TRUE(device_->synchronize_stream(*good).ok());

  EXPECT_EQ(device_->destroy_context(device_->shared_context(1)).code(), ErrorCode::kInvalidValue);
  EXPECT_TRUE(device_->destroy_stream(*bad).ok()) << "cleaning up after a fault works";
  EXPECT_TRUE(device_->destroy_context(*faulty).ok());
  EXPECT_EQ(device_->destroy_context(*faulty).code(), ErrorCode::kInvalidContext);
  EXPECT_EQ(device_->context_status(*faulty).code(), ErrorCode::kInvalidContext);
  EXPECT_TRUE(device_->destroy_event(*good_event).ok());
  EXPECT_TRUE(device_->destroy_stream(*good).ok());
  EXPECT_TRUE(device_->destroy_context(*healthy).ok());
  {
    std::lock_guard lock(fake_->mutex);
    EXPECT_EQ(fake_->contexts_created - created_before, 2);
    EXPECT_EQ(fake_->contexts_destroyed - destroyed_before, 2);
  }
  EXPECT_TRUE(device_->destroy_stream(*primary).ok());
  EXPECT_TRUE(device_->unload_module(*module).ok());
}

TEST_F(CudaDeviceFakeTest, LoadsEveryKindOfImageTheReaderAccepts) {
  auto loads = [&] {
    std::lock_guard lock(fake_->mutex);
    return fake_->library_loads;
  };
  const int before = loads();
  // PTX without a terminating NUL is copied before the driver reads it (ASan would see the
  // fake's strlen run past the buffer otherwise), and so is PTX after a comment.
  for (const Bytes& image :
       {fake_fatbin(), fatbin_of(2, tiny_cubin()), tiny_cubin(), bytes_of(kFakePtx),
        bytes_of(std::string("// generated\n") + std::string(kFakePtx))}) {
    Result<Module> module = device_->load_module(image);
    ASSERT_TRUE(module.ok()) << module.status();
    EXPECT_TRUE(device_->unload_module(*module).ok());
  }
  EXPECT_EQ(loads(), before + 5);
}

TEST_F(CudaDeviceFakeTest, RefusesForgedImagesBeforeTheDriverSeesThem) {
  auto loads = [&] {
    std::lock_guard lock(fake_->mutex);
    return fake_->library_loads;
  };
  const int before = loads();
  auto refused = [&](const Bytes& image, std::string_view fragment) {
    Status status = device_->load_module(image).status();
    EXPECT_EQ(status.code(), ErrorCode::kInvalidImage) << status;
    EXPECT_THAT(status.message(), HasSubstr(std::string(fragment)));
  };

  // The container's header claims more than the bytes hold.
  Bytes truncated = fake_fatbin();
  truncated.resize(60);
  refused(truncated, "header declares");
  refused(Bytes(truncated.begin(), truncated.begin() + 10), "shorter than its 16-byte header");
  // An entry whose payload runs past the container.
  Bytes long_entry = fake_fatbin();
  poke<uint64_t>(long_entry, 24, 1 << 20);
  refused(long_entry, "runs past the end");
  // A cubin inside a fatbin whose section lies past the end of its entry (the container's own
  // sizes are consistent, so only reading the cubin finds it).
  Bytes cubin = tiny_cubin();
  poke<uint64_t>(cubin, 80 + 64 + 24, cubin.size() + 64);
  refused(fatbin_of(2, cubin), "past the end");
  // The same cubin alone, and one whose section headers lie past the end.
  refused(cubin, "past the end");
  Bytes headers_outside = tiny_cubin();
  poke<uint64_t>(headers_outside, 40, 4096);
  refused(headers_outside, "section header table");
  // A compressed entry claiming 1 GiB: a Zstandard frame header that says so, and no data.
  const unsigned char frame[] = {0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x58, 0, 0, 0, 0x40, 0, 0, 0, 0};
  Bytes bomb(sizeof frame);
  std::memcpy(bomb.data(), frame, sizeof frame);
  refused(fatbin_of(1, bomb, 0x8011, uint64_t{1} << 30), "Zstandard data ends inside its frame");
  // Text that is not PTX, though it names the directives somewhere.
  refused(bytes_of("garbage, then .version 8.0 .target sm_90"), "not a fatbin, cubin or PTX");
  refused(bytes_of("// a comment, then\n.target sm_90\n.version 8.0\n"), ".version");
  // The wrapper nvcc puts around a fatbin: its pointer is the client's.
  Bytes wrapper(24);
  poke<uint32_t>(wrapper, 0, 0x466243b1u);
  poke<uint32_t>(wrapper, 4, 1);
  poke<uint64_t>(wrapper, 8, 0x7f0012345000ull);
  refused(wrapper, "fatbin wrapper");
  refused(Bytes(100, std::byte{0x42}), "not a fatbin, cubin or PTX");
  refused({}, "not a fatbin, cubin or PTX");
  EXPECT_EQ(loads(), before) << "a refused image reached cuLibraryLoadData";
}

TEST_F(CudaDeviceFakeTest, KernelsOptInToMoreThan48KiBOfSharedMemoryPerGpu) {
  Result<Module> module = device_->load_module(fake_fatbin());
  ASSERT_TRUE(module.ok()) << module.status();
  Result<Function> noop = device_->get_function(*module, "_Z4noopv");
  Result<Stream> s0 = device_->create_stream(0, 0);
  Result<Stream> s1 = device_->create_stream(1, 0);
  ASSERT_TRUE(noop.ok() && s0.ok() && s1.ok());
  auto launch = [&](Stream s, uint32_t shared) {
    return device_->launch(s, *noop, {{1, 1, 1}, {32, 1, 1}, shared}, {});
  };
  EXPECT_TRUE(launch(*s1, 48 << 10).ok()) << "the default limit needs no opt-in";
  EXPECT_TRUE(launch(*s1, 64 << 10).ok());
  EXPECT_TRUE(launch(*s1, 64 << 10).ok()) << "asked once";
  EXPECT_TRUE(launch(*s1, 50 << 10).ok()) << "a smaller size is covered";
  EXPECT_TRUE(launch(*s1, 100 << 10).ok());
  EXPECT_TRUE(launch(*s0, 64 << 10).ok()) << "per GPU";
  Status too_much = launch(*s0, (227 << 10) + 1);
  EXPECT_EQ(too_much.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(too_much.message(), HasSubstr("exceed GPU 0's limit of 232448"));
  {
    std::lock_guard lock(fake_->mutex);
    EXPECT_EQ(fake_->launches.size(), 6u);
    ASSERT_EQ(fake_->kernel_attributes.size(), 3u);
    std::vector<std::pair<int, int>> set;  // (GPU, bytes)
    for (const FakeCudaKernelAttribute& a : fake_->kernel_attributes) {
      EXPECT_EQ(a.kernel, "_Z4noopv");
      EXPECT_EQ(a.attribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
      set.emplace_back(a.gpu, a.value);
    }
    EXPECT_THAT(
        set, ElementsAre(std::pair{1, 64 << 10}, std::pair{1, 100 << 10}, std::pair{0, 64 << 10}));
  }
  EXPECT_TRUE(device_->destroy_stream(*s0).ok());
  EXPECT_TRUE(device_->destroy_stream(*s1).ok());
  EXPECT_TRUE(device_->unload_module(*module).ok());
}

TEST_F(CudaDeviceFakeTest, EveryThreadGetsTheRightContext) {
  // Each thread works on both GPUs in turn; the fake records any call made while another GPU's
  // context was current (checked in TearDown).
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        int gpu = (t + i) % 2;
        Result<Stream> s = device_->create_stream(gpu, 0);
        ASSERT_TRUE(s.ok());
        char host[8];
        ASSERT_TRUE(device_->copy_device_to_host(*s, host, 0x1000, sizeof host).ok());
        ASSERT_TRUE(device_->synchronize_stream(*s).ok());
        Result<PhysicalMemory> m = device_->create_physical(1 - gpu, kGranularity);
        ASSERT_TRUE(m.ok());
        ASSERT_TRUE(device_->release_physical(*m).ok());
        ASSERT_TRUE(device_->destroy_stream(*s).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// Run by ctest entries that configure the fake to fail (tests/gpu/CMakeLists.txt):
// FAKE_CUDA_SCENARIO names the scenario, HIBER_EXPECT_CODE the CUresult creation must fail with
// and HIBER_EXPECT_TEXT a part of its message.
TEST(FakeDriverScenario, FailsWithTheExpectedOneLineReason) {
  const char* scenario = std::getenv("FAKE_CUDA_SCENARIO");
  if (scenario == nullptr) GTEST_SKIP() << "not a failure scenario run";
  ASSERT_NO_FATAL_FAILURE(load_fake());
  Result<std::unique_ptr<Device>> created = create_cuda_device({});
  ASSERT_FALSE(created.ok()) << scenario;
  std::cout << scenario << ": " << created.status() << "\n";
  EXPECT_EQ(static_cast<int>(created.status().code()), std::atoi(std::getenv("HIBER_EXPECT_CODE")));
  EXPECT_THAT(created.status().message(), HasSubstr(std::getenv("HIBER_EXPECT_TEXT")));
  EXPECT_THAT(created.status().message(), ::testing::Not(HasSubstr("\n")));
}

}  // namespace
}  // namespace hiber::device
