// The CUDA backend on a real GPU: the shared Device behavioural suite
// (tests/unit/device_contract.h) instantiated for it, and what only the CUDA backend has to get
// right (driver properties, topology discovery, access revocation enforced by the hardware,
// parameter layouts from the driver). Without a GPU every test skips with one line saying why, and
// the binary passes.
//
// Tests that make a GPU fault on purpose run in a child process (gtest's "threadsafe" death-test
// style re-executes this binary for them): a fault poisons the CUDA context for the rest of the
// process, which must not take the other tests with it.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/device/cuda_device.h"
#include "server/device/cuda_driver.h"
#include "tests/kernels/test_kernels.h"
#include "tests/unit/device_contract.h"

namespace hiber::device {
namespace {

using testing::DeviceContractTest;
using testing::DeviceUnderTest;
using ::testing::HasSubstr;

bool means_no_gpu(const Status& s) {
  return s.code() == ErrorCode::kNoDevice || s.code() == ErrorCode::kStubLibrary ||
         s.code() == ErrorCode::kNotInitialized;
}

INSTANTIATE_TEST_SUITE_P(Cuda, DeviceContractTest,
                         ::testing::Values(DeviceUnderTest{
                             "Cuda",
                             [] { return create_cuda_device({}); },
                             HIBER_TEST_KERNELS_FATBIN,
                         }),
                         testing::device_test_name);

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Death tests re-execute the binary; "threadsafe" keeps the child from inheriting a
    // half-initialised driver through fork().
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    Result<std::unique_ptr<Device>> created = create_cuda_device({});
    if (!created.ok() && means_no_gpu(created.status())) {
      GTEST_SKIP() << "no GPU: " << created.status();
    }
    ASSERT_TRUE(created.ok()) << created.status();
    device_ = std::move(created).value();
    granularity_ = device_->allocation_granularity(0);
  }

  // Reserves, creates and maps `bytes` on `gpu`, accessible from `access`.
  struct Buffer {
    DevicePtr va = 0;
    uint64_t bytes = 0;
    PhysicalMemory memory;
  };
  Buffer make_buffer(int gpu, uint64_t bytes, std::vector<int> access) {
    Buffer b;
    b.bytes = bytes;
    Result<DevicePtr> va = device_->reserve_address_range(bytes, 0);
    EXPECT_TRUE(va.ok()) << va.status();
    if (!va.ok()) return b;
    b.va = *va;
    Result<PhysicalMemory> memory = device_->create_physical(gpu, bytes);
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return b;
    b.memory = *memory;
    EXPECT_TRUE(device_->map(b.va, bytes, b.memory, 0).ok());
    EXPECT_TRUE(device_->set_access(b.va, bytes, access).ok());
    return b;
  }
  void free_buffer(const Buffer& b) {
    EXPECT_TRUE(device_->unmap(b.va, b.bytes).ok());
    EXPECT_TRUE(device_->release_physical(b.memory).ok());
    EXPECT_TRUE(device_->free_address_range(b.va, b.bytes).ok());
  }

  // The access flags the driver reports for `gpu` on `va` (CU_MEM_ACCESS_FLAGS_PROT_*).
  unsigned long long access_flags(DevicePtr va, int gpu) {
    Result<const cuda_driver::CudaDriver*> cu = cuda_driver::load_driver();
    EXPECT_TRUE(cu.ok());
    CUmemLocation location = {};
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = gpu;  // our GPU index is the CUDA ordinal
    unsigned long long flags = 0xdead;
    EXPECT_EQ((*cu)->pfn_cuMemGetAccess(&flags, &location, va), CUDA_SUCCESS);
    return flags;
  }

  std::unique_ptr<Device> device_;
  uint64_t granularity_ = 0;
};

// ---- The driver and the node ----

TEST_F(CudaDeviceTest, ResolvesEveryEntryPoint) {
  Result<const cuda_driver::CudaDriver*> cu = cuda_driver::load_driver();
  ASSERT_TRUE(cu.ok()) << cu.status();
#define HIBER_EXPECT_RESOLVED_(name, version) \
  EXPECT_NE((*cu)->pfn_##name, nullptr) << #name " at " #version;
  HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_EXPECT_RESOLVED_)
#undef HIBER_EXPECT_RESOLVED_
  EXPECT_GE((*cu)->driver_version, cuda_driver::kRequiredDriverVersion);
  std::cout << "driver " << (*cu)->library_path << ", CUDA " << (*cu)->driver_version << "\n";
}

TEST_F(CudaDeviceTest, ReportsPropertiesFromTheDriver) {
  ASSERT_GE(device_->gpu_count(), 1);
  EXPECT_EQ(device_->backend_name(), "cuda");
  for (int g = 0; g < device_->gpu_count(); ++g) {
    const DeviceProperties& p = device_->properties(g);
    EXPECT_EQ(p.ordinal, g);
    EXPECT_FALSE(p.name.empty());
    EXPECT_TRUE(std::any_of(p.uuid.begin(), p.uuid.end(), [](uint8_t b) { return b != 0; }));
    EXPECT_THAT(p.pci_bus_id,
                ::testing::MatchesRegex("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]"));
    EXPECT_GT(p.total_memory_bytes, 1ull << 30);
    ASSERT_EQ(p.attributes.size(), static_cast<size_t>(kAttrCount));
    EXPECT_EQ(p.attribute(kAttrWarpSize), 32);
    EXPECT_GE(p.attribute(kAttrComputeCapabilityMajor), 7);
    EXPECT_EQ(p.attribute(kAttrVirtualMemoryManagementSupported), 1);
    EXPECT_EQ(p.attribute(kAttrUnifiedAddressing), 1);
    EXPECT_GT(p.attribute(kAttrMultiprocessorCount), 0);
    EXPECT_GE(p.attribute(kAttrMaxThreadsPerBlock), 1024);
    std::cout << "GPU " << g << ": " << p.name << ", bus " << p.pci_bus_id << ", "
              << (p.total_memory_bytes >> 20) << " MiB, sm_"
              << p.attribute(kAttrComputeCapabilityMajor)
              << p.attribute(kAttrComputeCapabilityMinor) << "\n";
  }
}

TEST_F(CudaDeviceTest, DiscoversATopologyConsistentWithTheDriver) {
  const NodeConfig& node = device_->topology();
  std::cout << describe(node);
  ASSERT_EQ(node.gpu_count(), device_->gpu_count());
  EXPECT_FALSE(node.name.empty());
  for (int g = 0; g < node.gpu_count(); ++g) {
    const GpuSpec& spec = node.gpus[g];
    const DeviceProperties& p = device_->properties(g);
    EXPECT_EQ(spec.product_name, p.name);
    EXPECT_EQ(spec.memory_bytes, p.total_memory_bytes);
    EXPECT_EQ(spec.pci_bus_id, p.pci_bus_id);
    EXPECT_EQ(spec.compute_capability_major, p.attribute(kAttrComputeCapabilityMajor));
    EXPECT_EQ(spec.compute_capability_minor, p.attribute(kAttrComputeCapabilityMinor));
    EXPECT_EQ(spec.multiprocessors, p.attribute(kAttrMultiprocessorCount));
    EXPECT_FALSE(spec.model.empty());
    ASSERT_GE(spec.pcie_switch, 0);
    ASSERT_LT(spec.pcie_switch, static_cast<int>(node.pcie_switches.size()));
  }
  for (const PcieSwitchSpec& s : node.pcie_switches) {
    // Anything from PCIe 1.0 x1 to PCIe 6.0 x16.
    EXPECT_GE(s.host_to_device_gbps, 0.25);
    EXPECT_LE(s.host_to_device_gbps, 130);
    EXPECT_EQ(s.host_to_device_gbps, s.device_to_host_gbps);
  }
  for (const NvLinkSpec& l : node.nvlinks) {
    EXPECT_LT(l.gpu_a, l.gpu_b);
    EXPECT_LT(l.gpu_b, node.gpu_count());
    EXPECT_TRUE(device_->can_access_peer(l.gpu_a, l.gpu_b));
    EXPECT_TRUE(device_->can_access_peer(l.gpu_b, l.gpu_a));
    EXPECT_GT(l.bandwidth_gbps, 0);
  }
  for (int g = 0; g < node.gpu_count(); ++g) EXPECT_FALSE(device_->can_access_peer(g, g));
  EXPECT_FALSE(device_->can_access_peer(0, node.gpu_count()));
}

TEST_F(CudaDeviceTest, UsesAConfiguredTopologyOnlyIfItMatchesTheNode) {
  // The default simulated node (8x H100 on NVSwitch) is not this machine.
  CudaDeviceOptions wrong;
  wrong.node = default_node_config();
  Result<std::unique_ptr<Device>> refused = create_cuda_device(wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("node config '" + default_node_config().name + "'"));

  // The discovered node with other bandwidths and a name is accepted as given.
  CudaDeviceOptions right;
  right.node = device_->topology();
  right.node->name = "configured";
  for (PcieSwitchSpec& s : right.node->pcie_switches) s.host_to_device_gbps = 12.5;
  // Bus ids as the driver spells them (upper case) still match.
  for (GpuSpec& g : right.node->gpus) {
    std::transform(g.pci_bus_id.begin(), g.pci_bus_id.end(), g.pci_bus_id.begin(), ::toupper);
  }
  Result<std::unique_ptr<Device>> configured = create_cuda_device(right);
  ASSERT_TRUE(configured.ok()) << configured.status();
  EXPECT_EQ((*configured)->topology().name, "configured");
  EXPECT_EQ((*configured)->topology().pcie_switches[0].host_to_device_gbps, 12.5);
  EXPECT_EQ((*configured)->topology().gpus[0].pci_bus_id, device_->properties(0).pci_bus_id);

  // One bus id off: refused, naming the GPU.
  right.node->gpus[0].pci_bus_id = "0000:ff:1f.7";
  Result<std::unique_ptr<Device>> mismatched = create_cuda_device(right);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(mismatched.status().message(), HasSubstr("GPU 0 is at PCI bus 0000:ff:1f.7"));
}

TEST_F(CudaDeviceTest, ReportsGranularityAndMemory) {
  for (int g = 0; g < device_->gpu_count(); ++g) {
    uint64_t granularity = device_->allocation_granularity(g);
    EXPECT_GE(granularity, 4096u);
    EXPECT_EQ(granularity & (granularity - 1), 0u) << granularity;
    Result<MemoryInfo> info = device_->memory_info(g);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_GT(info->total_bytes, 0u);
    EXPECT_LE(info->free_bytes, info->total_bytes);
    EXPECT_LE(info->total_bytes, device_->properties(g).total_memory_bytes);
  }
  EXPECT_EQ(device_->allocation_granularity(-1), 0u);
  EXPECT_EQ(device_->memory_info(device_->gpu_count()).status().code(), ErrorCode::kInvalidDevice);
}

// ---- Virtual memory ----

TEST_F(CudaDeviceTest, ChecksMappingsBeforeTheDriverSeesThem) {
  const uint64_t g = granularity_;
  Result<DevicePtr> va = device_->reserve_address_range(4 * g, 0);
  ASSERT_TRUE(va.ok()) << va.status();
  Result<PhysicalMemory> memory = device_->create_physical(0, 2 * g);
  ASSERT_TRUE(memory.ok()) << memory.status();

  EXPECT_EQ(device_->reserve_address_range(g + 1, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->reserve_address_range(g, 3 * g).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->create_physical(0, g / 2).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->create_physical(device_->gpu_count(), g).status().code(),
            ErrorCode::kInvalidDevice);

  Status misaligned = device_->map(*va + 4096, g, *memory, 0);
  EXPECT_EQ(misaligned.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(misaligned.message(), HasSubstr("granularity"));
  EXPECT_EQ(device_->map(*va, g + 4096, *memory, 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->map(*va, g, *memory, 4096).code(), ErrorCode::kInvalidValue);
  Status past_end = device_->map(*va, 2 * g, *memory, g);
  EXPECT_EQ(past_end.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(past_end.message(), HasSubstr("past the end"));

  ASSERT_TRUE(device_->map(*va, 2 * g, *memory, 0).ok());
  EXPECT_EQ(device_->map(*va + g, g, *memory, 0).code(), ErrorCode::kAlreadyMapped);
  EXPECT_EQ(device_->unmap(*va, g).code(), ErrorCode::kInvalidValue);       // half a mapping
  EXPECT_EQ(device_->unmap(*va + 2 * g, g).code(), ErrorCode::kNotMapped);  // nothing there
  EXPECT_EQ(device_->set_access(*va, 3 * g, std::vector<int>{0}).code(), ErrorCode::kNotMapped);
  EXPECT_EQ(device_->set_access(*va, 2 * g, std::vector<int>{device_->gpu_count()}).code(),
            ErrorCode::kInvalidDevice);
  EXPECT_EQ(device_->free_address_range(*va, 4 * g).code(), ErrorCode::kInvalidValue);

  // The same memory at a second address too.
  ASSERT_TRUE(device_->map(*va + 2 * g, g, *memory, g).ok());
  EXPECT_TRUE(device_->set_access(*va, 3 * g, std::vector<int>{0}).ok());
  EXPECT_TRUE(device_->unmap(*va, 3 * g).ok());  // both mappings at once
  EXPECT_TRUE(device_->release_physical(*memory).ok());
  EXPECT_TRUE(device_->free_address_range(*va, 4 * g).ok());
}

TEST_F(CudaDeviceTest, SetAccessGrantsExactlyTheGivenGpus) {
  const int n = device_->gpu_count();
  for (int owner = 0; owner < n; ++owner) {
    Buffer b = make_buffer(owner, granularity_, {owner});
    EXPECT_EQ(access_flags(b.va, owner), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    for (int other = 0; other < n; ++other) {
      if (other == owner || !device_->can_access_peer(other, owner)) continue;
      EXPECT_EQ(access_flags(b.va, other), CU_MEM_ACCESS_FLAGS_PROT_NONE);
      // Hand it to the peer alone: the owner loses access.
      ASSERT_TRUE(device_->set_access(b.va, b.bytes, std::vector<int>{other}).ok());
      EXPECT_EQ(access_flags(b.va, other), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
      EXPECT_EQ(access_flags(b.va, owner), CU_MEM_ACCESS_FLAGS_PROT_NONE);
      ASSERT_TRUE(device_->set_access(b.va, b.bytes, std::vector<int>{owner}).ok());
    }
    ASSERT_TRUE(device_->set_access(b.va, b.bytes, std::vector<int>{}).ok());
    for (int g = 0; g < n; ++g) {
      if (device_->can_access_peer(g, owner)) {
        EXPECT_EQ(access_flags(b.va, g), CU_MEM_ACCESS_FLAGS_PROT_NONE) << "GPU " << g;
      }
    }
    free_buffer(b);
  }
}

// In a child process: copies from memory whose access was revoked must fail. Exits 0 if the
// copy failed (at enqueue or at synchronisation), 1 if it succeeded, 2 if setup failed.
void copy_after_revoke(Device& device, uint64_t bytes) {
  Result<Stream> stream = device.create_stream(0, 0);
  Result<DevicePtr> va = device.reserve_address_range(bytes, 0);
  Result<PhysicalMemory> memory = device.create_physical(0, bytes);
  if (!stream.ok() || !va.ok() || !memory.ok()) _exit(2);
  if (!device.map(*va, bytes, *memory, 0).ok()) _exit(2);
  if (!device.set_access(*va, bytes, std::vector<int>{0}).ok()) _exit(2);
  std::vector<uint8_t> host(bytes, 0x5a);
  if (!device.copy_host_to_device(*stream, *va, host.data(), bytes).ok()) _exit(2);
  if (!device.synchronize_stream(*stream).ok()) _exit(2);
  if (!device.set_access(*va, bytes, std::vector<int>{}).ok()) _exit(2);
  Status copied = device.copy_device_to_host(*stream, host.data(), *va, bytes);
  if (copied.ok()) copied = device.synchronize_stream(*stream);
  std::cerr << "copy after revoke: " << copied << "\n";
  _exit(copied.ok() ? 1 : 0);
}

TEST_F(CudaDeviceTest, RevokedAccessReallyStopsTheGpu) {
  EXPECT_EXIT(copy_after_revoke(*device_, granularity_), ::testing::ExitedWithCode(0), "");
}

// In a child process: GPU 0 copies from GPU 1 memory that only GPU 1 may access.
void peer_copy_without_access(Device& device, uint64_t bytes) {
  Result<Stream> stream = device.create_stream(0, 0);
  Result<DevicePtr> src = device.reserve_address_range(bytes, 0);
  Result<DevicePtr> dst = device.reserve_address_range(bytes, 0);
  Result<PhysicalMemory> src_memory = device.create_physical(1, bytes);
  Result<PhysicalMemory> dst_memory = device.create_physical(0, bytes);
  if (!stream.ok() || !src.ok() || !dst.ok() || !src_memory.ok() || !dst_memory.ok()) _exit(2);
  if (!device.map(*src, bytes, *src_memory, 0).ok()) _exit(2);
  if (!device.map(*dst, bytes, *dst_memory, 0).ok()) _exit(2);
  if (!device.set_access(*src, bytes, std::vector<int>{1}).ok()) _exit(2);
  if (!device.set_access(*dst, bytes, std::vector<int>{0}).ok()) _exit(2);
  Status copied = device.copy_device_to_device(*stream, *dst, *src, bytes);
  if (copied.ok()) copied = device.synchronize_stream(*stream);
  std::cerr << "peer copy without access: " << copied << "\n";
  _exit(copied.ok() ? 1 : 0);
}

TEST_F(CudaDeviceTest, PeerCopyFromAGpuWithoutAccessFails) {
  if (device_->gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this node has 1";
  if (!device_->can_access_peer(0, 1)) GTEST_SKIP() << "GPU 0 has no peer access to GPU 1";
  EXPECT_EXIT(peer_copy_without_access(*device_, granularity_), ::testing::ExitedWithCode(0), "");
}

TEST_F(CudaDeviceTest, PeerCopyWithAccessMovesTheBytes) {
  if (device_->gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this node has 1";
  const uint64_t bytes = granularity_;
  Buffer on1 = make_buffer(1, bytes, {1});
  Buffer on0 = make_buffer(0, bytes, {0});
  Result<Stream> s1 = device_->create_stream(1, 0);
  Result<Stream> s0 = device_->create_stream(0, 0);
  ASSERT_TRUE(s1.ok() && s0.ok());
  std::vector<uint8_t> pattern(bytes);
  std::iota(pattern.begin(), pattern.end(), 7);
  ASSERT_TRUE(device_->copy_host_to_device(*s1, on1.va, pattern.data(), bytes).ok());
  ASSERT_TRUE(device_->synchronize_stream(*s1).ok());
  ASSERT_TRUE(device_->copy_peer(*s0, on0.va, 0, on1.va, 1, bytes).ok());
  std::vector<uint8_t> back(bytes, 0);
  ASSERT_TRUE(device_->copy_device_to_host(*s0, back.data(), on0.va, bytes).ok());
  ASSERT_TRUE(device_->synchronize_stream(*s0).ok());
  EXPECT_EQ(back, pattern);
  EXPECT_TRUE(device_->destroy_stream(*s0).ok());
  EXPECT_TRUE(device_->destroy_stream(*s1).ok());
  free_buffer(on0);
  free_buffer(on1);
}

// ---- Streams, host memory, memset ----

TEST_F(CudaDeviceTest, ClampsStreamPriorities) {
  for (int priority : {-1000, -1, 0, 1000}) {
    Result<Stream> s = device_->create_stream(0, priority);
    ASSERT_TRUE(s.ok()) << priority << ": " << s.status();
    EXPECT_EQ(s->gpu, 0);
    EXPECT_TRUE(device_->destroy_stream(*s).ok());
  }
  EXPECT_EQ(device_->create_stream(-1, 0).status().code(), ErrorCode::kInvalidDevice);
  EXPECT_EQ(device_->synchronize_stream(Stream{}).code(), ErrorCode::kInvalidHandle);
}

TEST_F(CudaDeviceTest, MemsetTakesOneTwoOrFourByteElements) {
  Buffer b = make_buffer(0, granularity_, {0});
  Result<Stream> s = device_->create_stream(0, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(device_->memset(*s, b.va, 0, 3, 4).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(device_->memset(*s, b.va, 0, 8, 4).code(), ErrorCode::kInvalidValue);
  ASSERT_TRUE(device_->memset(*s, b.va, 0x11223344, 4, 2).ok());
  ASSERT_TRUE(device_->memset(*s, b.va + 8, 0xaabb, 2, 2).ok());
  ASSERT_TRUE(device_->memset(*s, b.va + 12, 0x1ff, 1, 3).ok());
  uint8_t back[16] = {};
  ASSERT_TRUE(device_->copy_device_to_host(*s, back, b.va, sizeof back).ok());
  ASSERT_TRUE(device_->synchronize_stream(*s).ok());
  const uint8_t expected[16] = {0x44, 0x33, 0x22, 0x11, 0x44, 0x33, 0x22, 0x11,
                                0xbb, 0xaa, 0xbb, 0xaa, 0xff, 0xff, 0xff, 0};
  EXPECT_EQ(std::memcmp(back, expected, sizeof back), 0);
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
  free_buffer(b);
}

TEST_F(CudaDeviceTest, RegistersHostMemoryForEveryGpu) {
  const size_t bytes = 4 << 20;
  void* host = aligned_alloc(4096, bytes);
  ASSERT_NE(host, nullptr);
  ASSERT_TRUE(device_->register_host_memory(host, bytes).ok());
  // Registering twice is the driver's error, passed through unchanged.
  Status twice = device_->register_host_memory(host, bytes);
  EXPECT_FALSE(twice.ok());
  EXPECT_THAT(twice.message(), HasSubstr("cuMemHostRegister"));
  Buffer b = make_buffer(device_->gpu_count() - 1, granularity_, {device_->gpu_count() - 1});
  Result<Stream> s = device_->create_stream(device_->gpu_count() - 1, 0);
  ASSERT_TRUE(s.ok());
  std::memset(host, 0x3c, granularity_);
  ASSERT_TRUE(device_->copy_host_to_device(*s, b.va, host, granularity_).ok());
  ASSERT_TRUE(device_->synchronize_stream(*s).ok());
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
  free_buffer(b);
  EXPECT_TRUE(device_->unregister_host_memory(host).ok());
  EXPECT_FALSE(device_->unregister_host_memory(host).ok());
  EXPECT_FALSE(device_->register_host_memory(nullptr, bytes).ok());
  free(host);
}

// ---- Code ----

TEST_F(CudaDeviceTest, ReadsParameterLayoutsFromTheDriverForEveryImageKind) {
  for (const char* path :
       {HIBER_TEST_KERNELS_FATBIN, HIBER_TEST_KERNELS_CUBIN, HIBER_TEST_KERNELS_PTX}) {
    SCOPED_TRACE(path);
    std::vector<std::byte> image = read_file(path);
    ASSERT_FALSE(image.empty());
    Result<Module> module = device_->load_module(image);
    if (!module.ok() && module.status().code() == ErrorCode::kNoBinaryForGpu) {
      std::cout << path << ": no code for this GPU, skipped\n";
      continue;
    }
    ASSERT_TRUE(module.ok()) << module.status();
    for (const KernelInfo& expected : test_kernels::expected_kernels()) {
      Result<Function> f = device_->get_function(*module, expected.name);
      ASSERT_TRUE(f.ok()) << expected.name << ": " << f.status();
      Result<KernelInfo> info = device_->function_info(*f);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(*info, expected);
    }
    EXPECT_EQ(device_->get_function(*module, "no_such_kernel").status().code(),
              ErrorCode::kNotFound);
    Result<Function> noop = device_->get_function(*module, test_kernels::kNoop);
    ASSERT_TRUE(noop.ok());
    EXPECT_TRUE(device_->unload_module(*module).ok());
    // Its functions are gone with it.
    EXPECT_EQ(device_->function_info(*noop).status().code(), ErrorCode::kInvalidHandle);
  }
}

TEST_F(CudaDeviceTest, RejectsImagesThatDoNotSayHowLongTheyAre) {
  std::vector<std::byte> fatbin = read_file(HIBER_TEST_KERNELS_FATBIN);
  ASSERT_GT(fatbin.size(), 64u);
  std::vector<std::byte> truncated(fatbin.begin(), fatbin.begin() + fatbin.size() / 2);
  EXPECT_EQ(device_->load_module(truncated).status().code(), ErrorCode::kInvalidImage);
  std::vector<std::byte> cubin = read_file(HIBER_TEST_KERNELS_CUBIN);
  std::vector<std::byte> cut(cubin.begin(), cubin.begin() + 100);
  EXPECT_EQ(device_->load_module(cut).status().code(), ErrorCode::kInvalidImage);
  std::vector<std::byte> garbage(256, std::byte{0x42});
  EXPECT_EQ(device_->load_module(garbage).status().code(), ErrorCode::kInvalidImage);
  EXPECT_EQ(device_->load_module({}).status().code(), ErrorCode::kInvalidImage);
}

TEST_F(CudaDeviceTest, LaunchChecksTheParameterBufferAndRunsOnEveryGpu) {
  std::vector<std::byte> image = read_file(HIBER_TEST_KERNELS_FATBIN);
  Result<Module> module = device_->load_module(image);
  ASSERT_TRUE(module.ok()) << module.status();
  Result<Function> write = device_->get_function(*module, test_kernels::kWriteValue);
  Result<Function> noop = device_->get_function(*module, test_kernels::kNoop);
  ASSERT_TRUE(write.ok() && noop.ok());

  for (int g = 0; g < device_->gpu_count(); ++g) {
    SCOPED_TRACE(str_cat("GPU ", g));
    Buffer b = make_buffer(g, granularity_, {g});
    Result<Stream> s = device_->create_stream(g, 0);
    ASSERT_TRUE(s.ok());
    // write_value(int* p, int v): 8-byte pointer at 0, int at 8; 12 bytes.
    std::byte params[12];
    DevicePtr target = b.va;
    int value = 1234 + g;
    std::memcpy(params, &target, 8);
    std::memcpy(params + 8, &value, 4);
    LaunchConfig one;
    Status short_buffer = device_->launch(*s, *write, one, std::span(params, 8));
    EXPECT_EQ(short_buffer.code(), ErrorCode::kInvalidValue);
    EXPECT_THAT(short_buffer.message(), HasSubstr("12 bytes"));
    ASSERT_TRUE(device_->launch(*s, *write, one, params).ok());
    ASSERT_TRUE(device_->launch(*s, *noop, one, {}).ok());
    EXPECT_EQ(device_->launch(*s, *noop, one, std::span(params, 4)).code(),
              ErrorCode::kInvalidValue);
    int back = 0;
    ASSERT_TRUE(device_->copy_device_to_host(*s, &back, b.va, sizeof back).ok());
    ASSERT_TRUE(device_->synchronize_stream(*s).ok());
    EXPECT_EQ(back, value);
    EXPECT_TRUE(device_->destroy_stream(*s).ok());
    free_buffer(b);
  }
  EXPECT_TRUE(device_->unload_module(*module).ok());
}

// Kernel deadlines on a real driver (issue 18, item 3): a kernel that spins until told to stop
// is reported past its deadline, once; later kernels of its lost context are refused; and the GPU
// comes back once the kernel ends (the driver cannot stop one kernel of a shared context).
TEST_F(CudaDeviceTest, AKernelPastItsDeadlineIsReportedAndItsGpuComesBackWhenItEnds) {
  std::vector<std::byte> image = read_file(HIBER_TEST_KERNELS_FATBIN);
  Result<Module> module = device_->load_module(image);
  ASSERT_TRUE(module.ok()) << module.status();
  Result<Function> spin = device_->get_function(*module, test_kernels::kSpinUntil);
  Result<Function> write = device_->get_function(*module, test_kernels::kWriteValue);
  ASSERT_TRUE(spin.ok() && write.ok());
  Buffer flag = make_buffer(0, granularity_, {0});
  Result<Stream> s = device_->create_stream(0, 0);
  Result<Stream> other = device_->create_stream(0, 0);
  ASSERT_TRUE(s.ok() && other.ok());
  ASSERT_TRUE(device_->memset(*other, flag.va, 0, 4, 1).ok());
  ASSERT_TRUE(device_->synchronize_stream(*other).ok());

  auto lost = std::make_shared<std::atomic<bool>>(false);
  std::atomic<int> reports{0};
  std::promise<Status> told;
  LaunchConfig config;
  config.deadline = std::chrono::milliseconds(200);
  config.context_lost = lost;
  config.on_timeout = [&](const Status& why) {
    lost->store(true);
    if (reports.fetch_add(1) == 0) told.set_value(why);
  };
  std::byte params[8];
  const DevicePtr stop = flag.va;
  std::memcpy(params, &stop, 8);
  ASSERT_TRUE(device_->launch(*s, *spin, config, params).ok());
  std::future<Status> report = told.get_future();
  // A bound so a broken watch fails the test instead of hanging it; not a timing assertion.
  ASSERT_EQ(report.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "no deadline report: the kernel still spins";
  const Status late = report.get();
  EXPECT_EQ(late.code(), ErrorCode::kLaunchTimeout) << late;
  EXPECT_THAT(late.message(), HasSubstr("ran past its deadline of 200 ms"));
  std::byte write_params[12] = {};
  EXPECT_EQ(device_->launch(*other, *write, config, write_params).code(), ErrorCode::kLaunchTimeout)
      << "a kernel of the lost context reached the driver";

  // The kernel ends once the flag is set from another stream; then its stream drains.
  ASSERT_TRUE(device_->memset(*other, flag.va, 1, 4, 1).ok());
  EXPECT_TRUE(device_->synchronize_stream(*other).ok());
  // Returns at all: the kernel ended (its status is the session's business, already told).
  const Status drained = device_->synchronize_stream(*s);
  LOG(INFO) << "the late kernel's stream drained: " << drained;
  EXPECT_EQ(reports.load(), 1) << "reported once";
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
  EXPECT_TRUE(device_->destroy_stream(*other).ok());
  free_buffer(flag);
  EXPECT_TRUE(device_->unload_module(*module).ok());
}

TEST_F(CudaDeviceTest, CallbacksSeeTheStreamStatusAndEventsTime) {
  Result<Stream> s = device_->create_stream(0, 0);
  Result<Event> start = device_->create_event(0, false);
  Result<Event> end = device_->create_event(0, false);
  Result<Event> untimed = device_->create_event(0, true);
  ASSERT_TRUE(s.ok() && start.ok() && end.ok() && untimed.ok());
  ASSERT_TRUE(device_->record_event(*start, *s).ok());
  ASSERT_TRUE(device_->record_event(*end, *s).ok());
  ASSERT_TRUE(device_->record_event(*untimed, *s).ok());
  std::promise<Status> called;
  ASSERT_TRUE(device_->add_callback(*s, [&](Status st) { called.set_value(st); }).ok());
  EXPECT_TRUE(called.get_future().get().ok());
  ASSERT_TRUE(device_->synchronize_event(*end).ok());
  Result<float> ms = device_->elapsed_ms(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);
  EXPECT_EQ(device_->elapsed_ms(*start, *untimed).status().code(), ErrorCode::kInvalidHandle);
  EXPECT_TRUE(device_->query_stream(*s).ok());
  EXPECT_TRUE(device_->query_event(*end).ok());
  if (device_->gpu_count() > 1) {
    Result<Event> other = device_->create_event(1, false);
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(device_->record_event(*other, *s).code(), ErrorCode::kInvalidHandle);
    EXPECT_TRUE(device_->destroy_event(*other).ok());
  }
  for (Event e : {*start, *end, *untimed}) EXPECT_TRUE(device_->destroy_event(e).ok());
  EXPECT_TRUE(device_->destroy_stream(*s).ok());
}

}  // namespace
}  // namespace hiber::device
