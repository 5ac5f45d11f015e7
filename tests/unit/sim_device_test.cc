// The simulated GPU: the behavioural suite (device_contract.cc) on it, and what only the
// simulator can show: host pointers into device memory, access enforcement, link throttling,
// faults inside kernels, kernel plugins and handle checks.
//
// Sim-only kernels are declared in a small hand-written PTX module and implemented here with
// register_kernel(), so these tests need no CUDA toolkit.
#include "server/device/sim_device.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <tuple>

#include "tests/kernels/host_kernel_util.h"
#include "tests/unit/device_contract.h"

namespace hiber::device {
namespace {

using testing::DeviceContractTest;
using testing::DeviceUnderTest;
using Bytes = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

#ifdef HIBER_TEST_KERNELS_FATBIN
constexpr const char* kFatbin = HIBER_TEST_KERNELS_FATBIN;
#else
constexpr const char* kFatbin = "";
#endif

SimDeviceOptions options_with_plugin() {
  SimDeviceOptions options;
  options.kernel_plugins = {HIBER_TEST_KERNELS_PLUGIN};
  return options;
}

std::function<Result<std::unique_ptr<Device>>()> sim_factory(SimDeviceOptions options) {
  return [options]() -> Result<std::unique_ptr<Device>> {
    HIBER_ASSIGN_OR_RETURN(auto device, SimDevice::create(options));
    return std::unique_ptr<Device>(std::move(device));
  };
}

DeviceUnderTest throttled_sim() {
  SimDeviceOptions options = options_with_plugin();
  options.throttle_copies = true;
  return {"SimThrottled", sim_factory(options), kFatbin};
}

DeviceUnderTest torpor_sim() {
  auto create = []() -> Result<std::unique_ptr<Device>> {
    SimDeviceOptions options = options_with_plugin();
    HIBER_ASSIGN_OR_RETURN(options.node,
                           load_node_config(HIBER_SOURCE_DIR "/configs/nodes/torpor-4gpu.json"));
    return sim_factory(options)();
  };
  return {"SimTorpor", create, kFatbin};
}

// The suite on the default node (8 H100s on one NVSwitch), unthrottled and throttled, and on
// the paper's 4x V100 node (PCIe switches and point-to-point NVLink).
INSTANTIATE_TEST_SUITE_P(
    Sim, DeviceContractTest,
    ::testing::Values(DeviceUnderTest{"Sim", sim_factory(options_with_plugin()), kFatbin},
                      throttled_sim(), torpor_sim()),
    testing::device_test_name);

// ---- Helpers ----

constexpr std::string_view kSimOnlyPtx = R"(
.version 8.0
.target sm_80
.address_size 64
.visible .entry sim_poke(.param .u64 sim_poke_p, .param .u32 sim_poke_v) { ret; }
.visible .entry sim_fail(.param .u32 sim_fail_code) { ret; }
.visible .entry sim_copy_param(.param .u64 out, .param .u64 value) { ret; }
.visible .entry sim_store_through(.param .u64 table, .param .u32 value) { ret; }
.visible .entry sim_ignore_refusal(.param .u64 table) { ret; }
.visible .entry sim_unimplemented() { ret; }
)";

using sim_kernels::arg;

int sim_poke(const HiberSimLaunch* l) {
  *arg<int*>(l, 0) = arg<int>(l, 1);
  return 0;
}
int sim_fail(const HiberSimLaunch* l) { return arg<int>(l, 0); }
int sim_copy_param(const HiberSimLaunch* l) {
  *arg<uint64_t*>(l, 0) = arg<uint64_t>(l, 1);
  return 0;
}
// *table[0] = value: through a pointer the kernel loads from device memory, checked first.
int sim_store_through(const HiberSimLaunch* l) {
  auto table = arg<int* const*>(l, 0);
  if (!sim_kernels::may_access(l, table, 1)) return sim_kernels::kIllegalAddress;
  int* target = table[0];
  if (!sim_kernels::may_access(l, target, 1)) return sim_kernels::kIllegalAddress;
  *target = arg<int>(l, 1);
  return 0;
}
// Asks about the pointer at table[0] and, refused or not, reports success.
int sim_ignore_refusal(const HiberSimLaunch* l) {
  (void)sim_kernels::may_access(l, *arg<int* const*>(l, 0), 1);
  return 0;
}

Bytes bytes_of(std::string_view text) {
  Bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

template <typename... Args>
Bytes pack(const Args&... args) {
  Bytes out;
  auto put = [&](const auto& v) {  // at the next multiple of its alignment, as the ABI does
    const size_t align = alignof(std::decay_t<decltype(v)>);
    const size_t at = (out.size() + align - 1) / align * align;
    out.resize(at + sizeof(v));
    std::memcpy(out.data() + at, &v, sizeof(v));
  };
  (put(args), ...);
  return out;
}

NodeConfig node_from_json(const std::string& json) {
  auto node = parse_node_config(json);
  EXPECT_TRUE(node.ok()) << node.status();
  return node.ok() ? *node : NodeConfig{};
}

// Three small GPUs: 0 and 1 behind PCIe switch 0 with an NVLink between them, 2 alone behind
// switch 1. Slow links, so throttled copies take milliseconds.
NodeConfig slow_node() {
  return node_from_json(R"({
    "name": "slow-test-node",
    "gpuModels": [{"name": "m", "productName": "Hiber Test GPU", "memoryBytes": 268435456,
                   "computeCapabilityMajor": 8, "computeCapabilityMinor": 6,
                   "multiprocessors": 10, "memoryBandwidthGBps": 2, "clockRateKhz": 1000000,
                   "memoryClockRateKhz": 1000000, "memoryBusWidthBits": 256,
                   "l2CacheBytes": 1048576}],
    "gpus": [{"model": "m", "pcieSwitch": 0, "pciBusId": "0000:3b:00.0"},
             {"model": "m", "pcieSwitch": 0, "pciBusId": "0000:3c:00.0"},
             {"model": "m", "pcieSwitch": 1, "pciBusId": "0001:af:1f.0"}],
    "pcieSwitches": [{"hostToDeviceGBps": 1, "deviceToHostGBps": 1},
                     {"hostToDeviceGBps": 1, "deviceToHostGBps": 0.5}],
    "nvlinks": [{"gpuA": 0, "gpuB": 1, "bandwidthGBps": 4}]
  })");
}

// The suite once more on a node where not every pair of GPUs are peers.
INSTANTIATE_TEST_SUITE_P(SimPartlyPeered, DeviceContractTest,
                         ::testing::Values(DeviceUnderTest{"SimPartlyPeered",
                                                           [] {
                                                             SimDeviceOptions options =
                                                                 options_with_plugin();
                                                             options.node = slow_node();
                                                             return sim_factory(options)();
                                                           },
                                                           kFatbin}),
                         testing::device_test_name);

class SimDeviceTest : public ::testing::Test {
 protected:
  struct Allocation {
    DevicePtr va = 0;
    uint64_t bytes = 0;
    PhysicalMemory memory;
  };

  void make(SimDeviceOptions options) {
    auto device = SimDevice::create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
  }
  // The paper's 4-GPU node: these tests name GPUs and peers of its topology.
  void make_default() {
    SimDeviceOptions options;
    options.node = paper_node_config();
    make(options);
  }

  // Sim-only kernels: the hand-written PTX module with host implementations registered.
  Module load_sim_kernels() {
    EXPECT_TRUE(device_->register_kernel("sim_poke", sim_poke).ok());
    EXPECT_TRUE(device_->register_kernel("sim_fail", sim_fail).ok());
    EXPECT_TRUE(device_->register_kernel("sim_copy_param", sim_copy_param).ok());
    EXPECT_TRUE(device_->register_kernel("sim_store_through", sim_store_through).ok());
    EXPECT_TRUE(device_->register_kernel("sim_ignore_refusal", sim_ignore_refusal).ok());
    auto module = device_->load_module(bytes_of(kSimOnlyPtx));
    EXPECT_TRUE(module.ok()) << module.status();
    return module.ok() ? *module : Module{};
  }
  Function function(Module m, const std::string& name) {
    auto f = device_->get_function(m, name);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : Function{};
  }

  Allocation allocate(int gpu, uint64_t bytes, std::vector<int> access = {}) {
    const uint64_t g = device_->allocation_granularity(gpu);
    Allocation a;
    a.bytes = (bytes + g - 1) / g * g;
    auto va = device_->reserve_address_range(a.bytes, 0);
    auto memory = device_->create_physical(gpu, a.bytes);
    EXPECT_TRUE(va.ok() && memory.ok()) << va.status() << memory.status();
    if (!va.ok() || !memory.ok()) return {};
    a.va = *va;
    a.memory = *memory;
    if (access.empty()) access = {gpu};
    HIBER_EXPECT_OK(device_->map(a.va, a.bytes, a.memory, 0));
    HIBER_EXPECT_OK(device_->set_access(a.va, a.bytes, access));
    return a;
  }
  void free(const Allocation& a) {
    HIBER_EXPECT_OK(device_->unmap(a.va, a.bytes));
    HIBER_EXPECT_OK(device_->release_physical(a.memory));
    HIBER_EXPECT_OK(device_->free_address_range(a.va, a.bytes));
  }
  Stream stream(int gpu, int priority = 0) {
    auto s = device_->create_stream(gpu, priority);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Stream{};
  }
  // A stream in a context of its own on `gpu`, for work that faults (a fault ends its context).
  Stream stream_in_new_context(int gpu) {
    auto c = device_->create_context(gpu);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return Stream{};
    auto s = device_->create_stream(*c, 0);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Stream{};
  }

  std::unique_ptr<SimDevice> device_;
};

// Blocks a stream until opened (or destroyed).
class Gate {
 public:
  Gate() : future_(promise_.get_future().share()) {}
  ~Gate() { open(); }
  StreamCallback callback() {
    return [f = future_](Status) { f.wait(); };
  }
  void open() {
    if (!opened_.exchange(true)) promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
  std::atomic<bool> opened_{false};
};

// ---- Memory: host pointers, aliasing, access ----

TEST_F(SimDeviceTest, AliasedMappingsShowTheSameBytesThroughHostPointers) {
  make_default();
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr a, device_->reserve_address_range(2 * g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr b, device_->reserve_address_range(g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory memory, device_->create_physical(0, 2 * g));
  HIBER_ASSERT_OK(device_->map(a, 2 * g, memory, 0));
  HIBER_ASSERT_OK(device_->map(b, g, memory, g));  // b aliases the second half of a
  auto* pa = reinterpret_cast<uint32_t*>(a);
  auto* pb = reinterpret_cast<uint32_t*>(b);
  pa[g / 4] = 0xfeedface;
  pa[g / 4 + 100] = 7;
  EXPECT_EQ(pb[0], 0xfeedfaceu);
  EXPECT_EQ(pb[100], 7u);
  pb[5] = 99;
  EXPECT_EQ(pa[g / 4 + 5], 99u);
  HIBER_ASSERT_OK(device_->unmap(a, 2 * g));
  EXPECT_EQ(pb[100], 7u) << "still mapped at b";
  HIBER_EXPECT_OK(device_->unmap(b, g));
  HIBER_EXPECT_OK(device_->release_physical(memory));
  HIBER_EXPECT_OK(device_->free_address_range(a, 2 * g));
  HIBER_EXPECT_OK(device_->free_address_range(b, g));
}

// Clients reserve their grant of device addresses in their own process, so the addresses come
// from a region processes leave empty, not from among hiberd's own mmaps and libraries (where a
// client has its own, and a grant could collide with them: see address_space.cc).
TEST_F(SimDeviceTest, AddressRangesComeFromTheRegionClientsKeepFree) {
  make_default();
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr a, device_->reserve_address_range(32 * g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr b, device_->reserve_address_range(g, 4 * g));
  for (DevicePtr va : {a, b}) {
    EXPECT_GE(va, 0x7e8000000000u) << std::hex << va;
    EXPECT_LT(va, 0x7f8000000000u) << std::hex << va;
  }
  EXPECT_EQ(b % (4 * g), 0u) << "aligned as asked";
  EXPECT_TRUE(b >= a + 32 * g || b + g <= a) << "disjoint";
  HIBER_EXPECT_OK(device_->free_address_range(a, 32 * g));
  HIBER_EXPECT_OK(device_->free_address_range(b, g));
}

TEST_F(SimDeviceTest, FreedMemoryReturnsToTheGpuAndTheHost) {
  make_default();
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo empty, device_->memory_info(0));
  EXPECT_EQ(empty.total_bytes, device_->topology().gpus[0].memory_bytes);
  EXPECT_EQ(empty.free_bytes, empty.total_bytes / g * g);

  Allocation a = allocate(0, 8 * g);
  std::memset(reinterpret_cast<void*>(a.va), 0x77, a.bytes);
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo used, device_->memory_info(0));
  EXPECT_EQ(used.free_bytes, empty.free_bytes - 8 * g);
  // Released but still mapped: the memory is still in use.
  HIBER_ASSERT_OK(device_->release_physical(a.memory));
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo released, device_->memory_info(0));
  EXPECT_EQ(released.free_bytes, used.free_bytes);
  HIBER_ASSERT_OK(device_->unmap(a.va, a.bytes));
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo unmapped, device_->memory_info(0));
  EXPECT_EQ(unmapped.free_bytes, empty.free_bytes);
  HIBER_ASSERT_OK(device_->free_address_range(a.va, a.bytes));

  // First fit hands out the same range again; its pages were punched out, so it reads zeros.
  Allocation again = allocate(0, 8 * g);
  const std::vector<char> zeros(again.bytes, 0);
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(again.va), zeros.data(), again.bytes), 0);
  free(again);
}

TEST_F(SimDeviceTest, OutOfMemoryAndFragmentation) {
  SimDeviceOptions options;
  options.node = slow_node();  // 256 MiB GPUs
  make(options);
  const uint64_t g = device_->allocation_granularity(0);
  const uint64_t total = 256 << 20;
  std::vector<PhysicalMemory> blocks;
  for (uint64_t i = 0; i < total / (16 * g); ++i) {
    HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory m, device_->create_physical(0, 16 * g));
    blocks.push_back(m);
  }
  HIBER_EXPECT_CODE(device_->create_physical(0, g), ErrorCode::kOutOfMemory);
  HIBER_EXPECT_OK(device_->create_physical(1, g)) << "another GPU has its own memory";
  // Free every other block: plenty free, but no range of two blocks.
  for (size_t i = 0; i < blocks.size(); i += 2)
    HIBER_ASSERT_OK(device_->release_physical(blocks[i]));
  HIBER_EXPECT_CODE(device_->create_physical(0, 32 * g), ErrorCode::kOutOfMemory);
  // Freeing a neighbour coalesces.
  HIBER_ASSERT_OK(device_->release_physical(blocks[1]));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory big, device_->create_physical(0, 48 * g));
  HIBER_EXPECT_OK(device_->release_physical(big));
  for (size_t i = 3; i < blocks.size(); i += 2)
    HIBER_EXPECT_OK(device_->release_physical(blocks[i]));
}

TEST_F(SimDeviceTest, CopiesAndMemsetsNeedMappedAccessibleMemory) {
  make_default();
  const uint64_t g = device_->allocation_granularity(0);
  Stream s0 = stream(0);
  Stream s1 = stream(1);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr va, device_->reserve_address_range(3 * g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory memory, device_->create_physical(0, g));
  Bytes host(2 * g);

  // Reserved but not mapped.
  auto unmapped = device_->copy_host_to_device(s0, va, host.data(), 16);
  HIBER_EXPECT_CODE(unmapped, ErrorCode::kInvalidValue);
  EXPECT_NE(unmapped.message().find(str_cat("0x", std::hex, va)), std::string::npos) << unmapped;

  // Mapped, but no GPU may access it yet.
  HIBER_ASSERT_OK(device_->map(va + g, g, memory, 0));
  auto no_access = device_->memset(s0, va + g, 0, 1, 16);
  HIBER_EXPECT_CODE(no_access, ErrorCode::kInvalidValue);
  EXPECT_NE(no_access.message().find("not accessible from GPU 0"), std::string::npos) << no_access;

  // Accessible from GPU 1 only.
  const int gpu1[] = {1};
  HIBER_ASSERT_OK(device_->set_access(va + g, g, gpu1));
  HIBER_EXPECT_CODE(device_->copy_device_to_host(s0, host.data(), va + g, 16),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_OK(device_->copy_device_to_host(s1, host.data(), va + g, 16));
  // A copy that runs off the end of the mapping into unmapped space.
  auto past_end = device_->copy_host_to_device(s1, va + g, host.data(), g + 1);
  HIBER_EXPECT_CODE(past_end, ErrorCode::kInvalidValue);
  EXPECT_NE(past_end.message().find(str_cat("0x", std::hex, va + 2 * g)), std::string::npos)
      << past_end;
  // Peer copy: each side is checked against its own GPU. (Stream s1 still reads va + g; the
  // copy below writes it from s0, so s1 must be done first, as on a real GPU.)
  HIBER_ASSERT_OK(device_->synchronize_stream(s1));
  Allocation on0 = allocate(0, g);
  HIBER_EXPECT_OK(device_->copy_peer(s0, va + g, 1, on0.va, 0, 64));
  HIBER_EXPECT_CODE(device_->copy_peer(s0, va + g, 0, on0.va, 0, 64), ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->copy_peer(s0, va + g, 1, on0.va, 1, 64), ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->copy_peer(s0, va + g, 9, on0.va, 0, 64), ErrorCode::kInvalidDevice);

  HIBER_EXPECT_OK(device_->synchronize_stream(s0));
  HIBER_EXPECT_OK(device_->synchronize_stream(s1));

  // Access can be taken away again; work already enqueued is checked again when it runs.
  {
    Gate gate;
    HIBER_ASSERT_OK(device_->add_callback(s1, gate.callback()));
    HIBER_ASSERT_OK(device_->copy_device_to_host(s1, host.data(), va + g, 16));
    HIBER_ASSERT_OK(device_->set_access(va + g, g, {}));
  }
  Status revoked = device_->synchronize_stream(s1);
  HIBER_EXPECT_CODE(revoked, ErrorCode::kIllegalAddress);
  EXPECT_NE(revoked.message().find("not accessible from GPU 1"), std::string::npos) << revoked;
  HIBER_EXPECT_CODE(device_->memset(s1, va + g, 0, 4, 4), ErrorCode::kInvalidValue);
  const int bad[] = {0, 4};
  HIBER_EXPECT_CODE(device_->set_access(va + g, g, bad), ErrorCode::kInvalidDevice);
  const int gpu0[] = {0};
  HIBER_EXPECT_CODE(device_->set_access(va + g, g / 2, gpu0), ErrorCode::kInvalidValue)
      << "part of a mapping";
  HIBER_EXPECT_CODE(device_->set_access(va, 2 * g, gpu0), ErrorCode::kInvalidValue)
      << "a range with a hole";
  HIBER_EXPECT_CODE(device_->unmap(va + g, g / 2), ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->free_address_range(va, 3 * g), ErrorCode::kInvalidValue)
      << "still mapped";
  HIBER_EXPECT_CODE(device_->map(va + g, g, memory, 0), ErrorCode::kAlreadyMapped);

  HIBER_EXPECT_OK(device_->synchronize_stream(s0));
  HIBER_EXPECT_OK(device_->synchronize_stream(s1));
  HIBER_EXPECT_OK(device_->unmap(va + g, g));
  HIBER_EXPECT_OK(device_->release_physical(memory));
  HIBER_EXPECT_OK(device_->free_address_range(va, 3 * g));
  free(on0);
}

TEST_F(SimDeviceTest, AccessGoesOnlyToTheOwnerAndItsPeers) {
  SimDeviceOptions options;
  options.node = slow_node();  // GPU 2 shares no switch and no link with GPUs 0 and 1
  make(options);
  ASSERT_FALSE(device_->can_access_peer(0, 2));
  ASSERT_TRUE(device_->can_access_peer(0, 1));
  const uint64_t g = device_->allocation_granularity(0);
  Allocation on2 = allocate(2, g);
  const int with0[] = {0, 2};
  Status refused = device_->set_access(on2.va, on2.bytes, with0);
  HIBER_EXPECT_CODE(refused, ErrorCode::kPeerAccessUnsupported);
  EXPECT_NE(refused.message().find("GPU 0 cannot access memory of GPU 2"), std::string::npos)
      << refused;
  // Nothing changed: GPU 2 still has access, GPU 0 still none.
  Bytes host(16);
  HIBER_EXPECT_OK(device_->copy_device_to_host(stream(2), host.data(), on2.va, host.size()));
  HIBER_EXPECT_CODE(device_->copy_device_to_host(stream(0), host.data(), on2.va, host.size()),
                    ErrorCode::kInvalidValue);
  // Peers over NVLink may share. (Into a buffer of its own: the copy above may still run.)
  Allocation on0 = allocate(0, g, {0, 1});
  Bytes from_peer(16);
  HIBER_EXPECT_OK(
      device_->copy_device_to_host(stream(1), from_peer.data(), on0.va, from_peer.size()));
  // A range over memory of two GPUs: each GPU granted must reach both.
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr va, device_->reserve_address_range(2 * g, 0));
  HIBER_ASSERT_OK(device_->map(va, g, on0.memory, 0));
  HIBER_ASSERT_OK(device_->map(va + g, g, on2.memory, 0));
  const int just2[] = {2};
  HIBER_EXPECT_CODE(device_->set_access(va, 2 * g, just2), ErrorCode::kPeerAccessUnsupported);
  const int just1[] = {1};
  HIBER_EXPECT_CODE(device_->set_access(va, 2 * g, just1), ErrorCode::kPeerAccessUnsupported);
  HIBER_EXPECT_OK(device_->set_access(va, g, just1));
  HIBER_EXPECT_OK(device_->set_access(va, 2 * g, {}));
  HIBER_EXPECT_OK(device_->unmap(va, 2 * g));
  HIBER_EXPECT_OK(device_->free_address_range(va, 2 * g));
  for (int gpu = 0; gpu < 3; ++gpu) HIBER_EXPECT_OK(device_->synchronize_stream(stream(gpu)));
  free(on0);
  free(on2);
}

TEST_F(SimDeviceTest, SetAccessAndUnmapMayCoverAdjacentMappings) {
  make_default();
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr va, device_->reserve_address_range(2 * g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory m1, device_->create_physical(0, g));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory m2, device_->create_physical(2, g));
  HIBER_ASSERT_OK(device_->map(va, g, m1, 0));
  HIBER_ASSERT_OK(device_->map(va + g, g, m2, 0));
  const int all[] = {0, 2};
  HIBER_ASSERT_OK(device_->set_access(va, 2 * g, all));
  Stream s = stream(2);
  Bytes data(2 * g, std::byte{3});
  HIBER_EXPECT_OK(device_->copy_host_to_device(s, va, data.data(), data.size()));
  HIBER_EXPECT_OK(device_->synchronize_stream(s));
  HIBER_ASSERT_OK(device_->unmap(va, 2 * g));
  HIBER_EXPECT_OK(device_->release_physical(m1));
  HIBER_EXPECT_OK(device_->release_physical(m2));
  HIBER_EXPECT_OK(device_->free_address_range(va, 2 * g));
}

TEST_F(SimDeviceTest, UnmappingUnderAPendingCopyFailsTheCopyNotTheProcess) {
  SimDeviceOptions options;
  options.node = slow_node();
  options.node.pcie_switches[0].host_to_device_gbps = 0.05;
  options.throttle_copies = true;
  make(options);
  Allocation a = allocate(0, 32 << 20);
  Stream s = stream(0);
  Bytes host(a.bytes, std::byte{1});
  // 32 MiB at 0.05 GB/s would take 0.7 s; the unmap lands early in it and ends it.
  HIBER_ASSERT_OK(device_->copy_host_to_device(s, a.va, host.data(), host.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  HIBER_ASSERT_OK(device_->unmap(a.va, a.bytes));
  Status copy = device_->synchronize_stream(s);
  HIBER_EXPECT_CODE(copy, ErrorCode::kIllegalAddress);
  EXPECT_NE(copy.message().find("copy_host_to_device"), std::string::npos) << copy;
  HIBER_EXPECT_OK(device_->synchronize_stream(s)) << "the error was reported once";
  HIBER_EXPECT_OK(device_->release_physical(a.memory));
  HIBER_EXPECT_OK(device_->free_address_range(a.va, a.bytes));
}

// ---- Throttling ----

// Milliseconds that `bytes` take at `gbps` GB/s.
double model_ms(uint64_t bytes, double gbps) { return static_cast<double>(bytes) / (gbps * 1e6); }

class ThrottledSimTest : public SimDeviceTest {
 protected:
  void SetUp() override {
    SimDeviceOptions options;
    options.node = slow_node();
    options.throttle_copies = true;
    make(options);
  }
  // Runs enqueue() between two event records on `s`; returns the milliseconds between them.
  float timed(Stream s, const std::function<void()>& enqueue) {
    auto start = device_->create_event(s.gpu, false);
    auto end = device_->create_event(s.gpu, false);
    EXPECT_TRUE(start.ok() && end.ok());
    HIBER_EXPECT_OK(device_->record_event(*start, s));
    enqueue();
    HIBER_EXPECT_OK(device_->record_event(*end, s));
    HIBER_EXPECT_OK(device_->synchronize_stream(s));
    auto ms = device_->elapsed_ms(*start, *end);
    EXPECT_TRUE(ms.ok()) << ms.status();
    HIBER_EXPECT_OK(device_->destroy_event(*start));
    HIBER_EXPECT_OK(device_->destroy_event(*end));
    return ms.ok() ? *ms : 0;
  }
};

TEST_F(ThrottledSimTest, EachPathTakesAtLeastSizeOverItsBandwidth) {
  const uint64_t size = 4 << 20;
  Allocation on0 = allocate(0, size), other0 = allocate(0, size);
  Allocation on1 = allocate(1, size), on2 = allocate(2, size);
  Stream s0 = stream(0), s2 = stream(2);
  Bytes host(size, std::byte{9});
  // Lower bounds only: a loaded machine may always be slower.
  EXPECT_GE(
      timed(s0,
            [&] { HIBER_EXPECT_OK(device_->copy_host_to_device(s0, on0.va, host.data(), size)); }),
      model_ms(size, 1.0))
      << "host to device through switch 0 at 1 GB/s";
  EXPECT_GE(
      timed(s2,
            [&] { HIBER_EXPECT_OK(device_->copy_device_to_host(s2, host.data(), on2.va, size)); }),
      model_ms(size, 0.5))
      << "device to host through switch 1 at 0.5 GB/s";
  EXPECT_GE(
      timed(s0,
            [&] { HIBER_EXPECT_OK(device_->copy_device_to_device(s0, other0.va, on0.va, size)); }),
      model_ms(size, 2.0))
      << "within GPU 0 at its 2 GB/s memory";
  EXPECT_GE(timed(s0, [&] { HIBER_EXPECT_OK(device_->copy_peer(s0, on1.va, 1, on0.va, 0, size)); }),
            model_ms(size, 4.0))
      << "GPU 0 to 1 over their 4 GB/s NVLink";
  EXPECT_GE(timed(s0, [&] { HIBER_EXPECT_OK(device_->copy_peer(s0, on2.va, 2, on0.va, 0, size)); }),
            model_ms(size, 1.0))
      << "GPU 0 to 2 through the host: switch 0 up, switch 1 down";
  EXPECT_GE(timed(s0, [&] { HIBER_EXPECT_OK(device_->memset(s0, on0.va, 0, 4, size / 4)); }),
            model_ms(size, 2.0))
      << "memset at GPU 0's memory bandwidth";
  for (const Allocation& a : {on0, other0, on1, on2}) free(a);
}

TEST_F(ThrottledSimTest, ConcurrentCopiesShareTheirSwitch) {
  // GPUs 0 and 1 share switch 0's host-to-device link: two copies at once get half of it each.
  const uint64_t size = 8 << 20;
  Allocation on0 = allocate(0, size), on1 = allocate(1, size);
  Stream s0 = stream(0), s1 = stream(1);
  Bytes host(size, std::byte{5});
  HIBER_ASSERT_OK_AND_ASSIGN(Event start0, device_->create_event(0, false));
  HIBER_ASSERT_OK_AND_ASSIGN(Event end0, device_->create_event(0, false));
  HIBER_ASSERT_OK_AND_ASSIGN(Event start1, device_->create_event(1, false));
  HIBER_ASSERT_OK_AND_ASSIGN(Event end1, device_->create_event(1, false));
  {
    Gate gate;  // both copies start together
    for (auto [s, on, start, end] :
         {std::tuple{s0, on0, start0, end0}, std::tuple{s1, on1, start1, end1}}) {
      HIBER_ASSERT_OK(device_->add_callback(s, gate.callback()));
      HIBER_ASSERT_OK(device_->record_event(start, s));
      HIBER_ASSERT_OK(device_->copy_host_to_device(s, on.va, host.data(), size));
      HIBER_ASSERT_OK(device_->record_event(end, s));
    }
    gate.open();
  }
  HIBER_ASSERT_OK(device_->synchronize_stream(s0));
  HIBER_ASSERT_OK(device_->synchronize_stream(s1));
  HIBER_ASSERT_OK_AND_ASSIGN(float d0, device_->elapsed_ms(start0, end0));
  HIBER_ASSERT_OK_AND_ASSIGN(float d1, device_->elapsed_ms(start1, end1));
  HIBER_ASSERT_OK_AND_ASSIGN(float skew, device_->elapsed_ms(start0, start1));
  HIBER_ASSERT_OK_AND_ASSIGN(float span0, device_->elapsed_ms(start0, end1));
  HIBER_ASSERT_OK_AND_ASSIGN(float span1, device_->elapsed_ms(start1, end0));
  const double alone = model_ms(size, 1.0);
  // Only while the other had not started yet (the skew between the start events, plus the
  // moment from a start event to its copy) can either copy have had the link to itself.
  const double slack = std::abs(skew) + 0.5;
  EXPECT_GE(d0, 2 * alone - slack) << "alone it takes " << alone << " ms; skew " << skew;
  EXPECT_GE(d1, 2 * alone - slack) << "alone it takes " << alone << " ms; skew " << skew;
  const float both = skew >= 0 ? std::max(d0, span0) : std::max(d1, span1);
  EXPECT_GE(both, 2 * alone) << "both copies through one link take twice as long as one";
  for (Event e : {start0, end0, start1, end1}) HIBER_EXPECT_OK(device_->destroy_event(e));
  free(on0);
  free(on1);
}

// ---- Kernels ----

TEST_F(SimDeviceTest, KernelTouchingUnmappedMemoryFailsWithIllegalAddress) {
  make_default();
  Module m = load_sim_kernels();
  Function poke = function(m, "sim_poke");
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr reserved, device_->reserve_address_range(g, 0));
  for (DevicePtr target : {reserved + 64, DevicePtr{16}}) {
    // Each fault ends its context, so each goes in a context of its own.
    Stream s = stream_in_new_context(0);
    Bytes params = pack(target, 5);
    HIBER_ASSERT_OK(device_->launch(s, poke, {}, params));
    Status status = device_->synchronize_stream(s);
    HIBER_EXPECT_CODE(status, ErrorCode::kIllegalAddress);
    EXPECT_NE(status.message().find(str_cat("0x", std::hex, target)), std::string::npos) << status;
    EXPECT_NE(status.message().find("sim_poke"), std::string::npos) << status;
    HIBER_EXPECT_CODE(device_->synchronize_stream(s), ErrorCode::kIllegalAddress) << "sticky";
  }
  // The process, the workers and the GPU's other contexts all carry on.
  Stream s = stream(0);
  Allocation a = allocate(0, g);
  Bytes params = pack(a.va + 8, 1234);
  HIBER_ASSERT_OK(device_->launch(s, poke, {}, params));
  HIBER_ASSERT_OK(device_->synchronize_stream(s));
  EXPECT_EQ(reinterpret_cast<int*>(a.va)[2], 1234);
  free(a);
  HIBER_EXPECT_OK(device_->free_address_range(reserved, g));
}

// Issue 18, item 9. A kernel reaches only memory its GPU may access, which under Hiber is the
// calling function's own blocks (each mapped for the GPU its function leases, and only while it
// does). Function V's block is mapped for GPU 0, X's for GPU 1, as two concurrent leases leave
// them. X's kernels on GPU 1 name V's block as an argument and through a pointer stored in X's
// own memory: each launch fails with kIllegalAddress naming the address, before the kernel
// touches it, and V's bytes stay as V wrote them. X's own pointers (one past the end included),
// integers that are no device address, and V's own use of the same kernels still work.
TEST_F(SimDeviceTest, AKernelReachesOnlyTheMemoryItsGpuMayAccess) {
  make_default();
  Module m = load_sim_kernels();
  Function poke = function(m, "sim_poke");
  Function copy_param = function(m, "sim_copy_param");
  Function store_through = function(m, "sim_store_through");
  const uint64_t g = device_->allocation_granularity(0);
  Allocation victim = allocate(0, g);
  Allocation own = allocate(1, g);
  Stream on_victim = stream(0), on_own = stream(1);
  std::vector<int> written(g / sizeof(int));
  for (size_t i = 0; i < written.size(); ++i) written[i] = static_cast<int>(i * 7 + 3);
  HIBER_ASSERT_OK(device_->copy_host_to_device(on_victim, victim.va, written.data(), g));
  HIBER_ASSERT_OK(device_->synchronize_stream(on_victim));

  // Each refusal is a fault, which ends its context: each runs in a context of its own.
  auto expect_refused = [&](Function f, const Bytes& params, DevicePtr named) {
    Stream refused = stream_in_new_context(1);
    HIBER_ASSERT_OK(device_->launch(refused, f, {}, params));
    Status status = device_->synchronize_stream(refused);
    HIBER_EXPECT_CODE(status, ErrorCode::kIllegalAddress);
    EXPECT_NE(status.message().find(str_cat("0x", std::hex, named)), std::string::npos) << status;
    EXPECT_NE(status.message().find("not accessible from GPU 1"), std::string::npos) << status;
    EXPECT_NE(status.message().find("not memory of the caller's own blocks"), std::string::npos)
        << status;
  };
  // As an argument: the kernel never runs.
  expect_refused(poke, pack(victim.va + 8, 99), victim.va + 8);
  // Through a pointer X stored in its own memory.
  const DevicePtr stored = victim.va + 16;
  HIBER_ASSERT_OK(device_->copy_host_to_device(on_own, own.va, &stored, sizeof(stored)));
  HIBER_ASSERT_OK(device_->synchronize_stream(on_own));  // the refused kernels run elsewhere
  expect_refused(store_through, pack(own.va, 77), stored);
  // A refusal fails the launch even if the kernel carries on and reports success.
  expect_refused(function(m, "sim_ignore_refusal"), pack(own.va), stored);

  std::vector<int> after(written.size());
  HIBER_ASSERT_OK(device_->copy_device_to_host(on_victim, after.data(), victim.va, g));
  HIBER_ASSERT_OK(device_->synchronize_stream(on_victim));
  EXPECT_EQ(after, written);

  // X's own memory, one past its end, and an integer that is no device address all pass.
  const uint64_t integer = 0x123456789abcdef;
  for (uint64_t value : {own.va + g, integer}) {
    HIBER_ASSERT_OK(device_->launch(on_own, copy_param, {}, pack(own.va + 64, value)));
    HIBER_ASSERT_OK(device_->synchronize_stream(on_own));
    EXPECT_EQ(reinterpret_cast<const uint64_t*>(own.va)[8], value);
  }
  const DevicePtr own_target = own.va + 128;
  HIBER_ASSERT_OK(device_->copy_host_to_device(on_own, own.va, &own_target, sizeof(own_target)));
  HIBER_ASSERT_OK(device_->launch(on_own, store_through, {}, pack(own.va, 77)));
  HIBER_ASSERT_OK(device_->synchronize_stream(on_own));
  EXPECT_EQ(reinterpret_cast<const int*>(own.va)[32], 77);
  // One past X's last byte is not one past the end when another function's range starts there:
  // that is the other function's first block.
  Allocation next = allocate(0, g);
  ASSERT_EQ(next.va, own.va + g) << "reservations are made one after another";
  expect_refused(copy_param, pack(own.va + 64, next.va), next.va);
  free(next);
  // V's kernels on GPU 0 reach V's block, through the same pointer X was refused.
  HIBER_ASSERT_OK(device_->copy_host_to_device(on_victim, victim.va + 64, &stored, 8));
  HIBER_ASSERT_OK(device_->launch(on_victim, store_through, {}, pack(victim.va + 64, 55)));
  HIBER_ASSERT_OK(device_->synchronize_stream(on_victim));
  EXPECT_EQ(reinterpret_cast<const int*>(victim.va)[4], 55);
  free(victim);
  free(own);
}

// Signal handlers of the fault tests (async-signal-safe: write, _exit, atomics).
void write_stderr(std::string_view text) { (void)!::write(2, text.data(), text.size()); }

void marker_handler(int, siginfo_t*, void*) {
  write_stderr("hiber-test: the previous SIGSEGV handler ran\n");
  _exit(3);
}

// A handler installed after the device's, which chains to the one it replaced, as crash
// reporters do. A second call means the handlers call each other in a cycle.
constexpr int kCycleExit = 42;
struct sigaction g_replaced;
std::atomic<int> g_chained_calls{0};
void chaining_handler(int sig, siginfo_t* info, void* context) {
  if (++g_chained_calls > 1) {
    write_stderr("hiber-test: the chaining handler ran again: a cycle\n");
    _exit(kCycleExit);
  }
  write_stderr("hiber-test: the chaining handler ran once\n");
  if (g_replaced.sa_flags & SA_SIGINFO) {
    g_replaced.sa_sigaction(sig, info, context);
  } else if (g_replaced.sa_handler != SIG_DFL && g_replaced.sa_handler != SIG_IGN) {
    g_replaced.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);
  }
}

void install_handler(void (*handler)(int, siginfo_t*, void*), struct sigaction* replaced) {
  struct sigaction action {};
  action.sa_sigaction = handler;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGSEGV, &action, replaced), 0);
}

void fault_outside_kernels() {
  void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  *static_cast<volatile int*>(page) = 1;
}

TEST_F(SimDeviceTest, FaultsOutsideKernelsStillReachThePreviousHandler) {
  // The device's handler goes in at the first launch, over the one installed here; a fault
  // outside any kernel must still reach that one. (The death test runs in a fresh process, so
  // no earlier test has installed the device's handler there yet.)
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        install_handler(marker_handler, nullptr);
        make_default();
        Module m = load_sim_kernels();
        Stream s = stream(0);
        Allocation a = allocate(0, 4096);
        Bytes params = pack(a.va, 1);
        (void)device_->launch(s, function(m, "sim_poke"), {}, params);
        (void)device_->synchronize_stream(s);
        fault_outside_kernels();
      },
      "hiber-test: the previous SIGSEGV handler ran");
}

TEST_F(SimDeviceTest, AHandlerInstalledAfterALaunchIsNotChainedBack) {
  // A handler installed after the device's and chaining to it is called once for a fault outside
  // kernels, which then goes on to the handler before the device's (the default action, or the
  // sanitizer's report): later launches do not re-install the device's handler over it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        make_default();
        Module m = load_sim_kernels();
        Function poke = function(m, "sim_poke");
        Stream s = stream(0);
        Allocation a = allocate(0, 4096);
        Bytes params = pack(a.va, 1);
        (void)device_->launch(s, poke, {}, params);
        (void)device_->synchronize_stream(s);
        install_handler(chaining_handler, &g_replaced);
        (void)device_->launch(s, poke, {}, params);
        (void)device_->synchronize_stream(s);
        fault_outside_kernels();
      },
      [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == kCycleExit); },
      "hiber-test: the chaining handler ran once");
}

TEST_F(SimDeviceTest, KernelFaultsAreCaughtWhileAChainingHandlerIsInstalled) {
  make_default();
  Module m = load_sim_kernels();
  Function poke = function(m, "sim_poke");
  Stream s = stream(0);
  Allocation a = allocate(0, 4096);
  HIBER_ASSERT_OK(device_->launch(s, poke, {}, pack(a.va, 1)));
  HIBER_ASSERT_OK(device_->synchronize_stream(s));
  // The chaining handler passes faults inside kernels on to the device's, which still catches
  // them; it is taken out again so later tests see the process as it was.
  struct sigaction replaced {};
  install_handler(chaining_handler, &g_replaced);
  HIBER_ASSERT_OK(device_->launch(s, poke, {}, pack(DevicePtr{16}, 1)));
  HIBER_EXPECT_CODE(device_->synchronize_stream(s), ErrorCode::kIllegalAddress);
  ASSERT_EQ(sigaction(SIGSEGV, &g_replaced, &replaced), 0);
  EXPECT_EQ(g_chained_calls.exchange(0), 1);
  free(a);
}

// A kernel that never returns. Under TSan the loop also sleeps: TSan holds an asynchronous
// signal back until the thread enters one of its interceptors, which a bare loop never does.
int spin_forever(const HiberSimLaunch*) {
  volatile uint64_t turns = 0;
  for (;;) {
    turns = turns + 1;
#if defined(__SANITIZE_THREAD__)
    usleep(1000);
#endif
  }
}

// Issue 18, item 3: a kernel that runs past its deadline is stopped, fails its launch with
// CUDA_ERROR_LAUNCH_TIMEOUT and tells the launcher; kernels queued behind it on a lost context
// do not run; and other streams of the same GPU run correctly throughout.
TEST_F(SimDeviceTest, AKernelPastItsDeadlineIsStoppedWhileOtherStreamsRunOn) {
  make_default();
  // sim_unimplemented (no parameters) gets a host implementation that never ends.
  HIBER_ASSERT_OK(device_->register_kernel("sim_unimplemented", spin_forever));
  Module m = load_sim_kernels();
  Function spin = function(m, "sim_unimplemented");
  Function copy = function(m, "sim_copy_param");
  Stream runaway = stream_in_new_context(0);  // its overrun ends its context
  Stream other = stream(0);
  Allocation a = allocate(0, 4096);

  auto lost = std::make_shared<std::atomic<bool>>(false);
  std::atomic<int> timeouts{0};
  LaunchConfig limited;
  limited.deadline = std::chrono::milliseconds(100);
  limited.context_lost = lost;
  limited.on_timeout = [&](const Status& why) {
    EXPECT_EQ(why.code(), ErrorCode::kLaunchTimeout) << why;
    lost->store(true);
    timeouts.fetch_add(1);
  };
  HIBER_ASSERT_OK(device_->launch(runaway, spin, limited, {}));
  // Queued behind it on the same context: skipped once the context is lost.
  HIBER_ASSERT_OK(device_->launch(runaway, spin, limited, {}));
  // The other stream's work runs meanwhile (the GPU has two workers), with a deadline it keeps.
  for (uint64_t v = 1; v <= 20; ++v) {
    HIBER_ASSERT_OK(device_->launch(other, copy, limited, pack(a.va, v)));
    HIBER_ASSERT_OK(device_->synchronize_stream(other));
    EXPECT_EQ(*reinterpret_cast<volatile uint64_t*>(a.va), v);
  }

  const Status stopped = device_->synchronize_stream(runaway);
  HIBER_EXPECT_CODE(stopped, ErrorCode::kLaunchTimeout);
  EXPECT_NE(stopped.message().find("ran past its deadline of 100 ms"), std::string::npos)
      << stopped;
  EXPECT_EQ(timeouts.load(), 1) << "the second launch never ran, so it did not time out";
  EXPECT_EQ(*reinterpret_cast<volatile uint64_t*>(a.va), 20u);

  // Its context is ended for good; the GPU's other context goes on, and its result is right.
  HIBER_EXPECT_CODE(device_->launch(runaway, copy, {}, pack(a.va, uint64_t{77})),
                    ErrorCode::kLaunchTimeout);
  HIBER_ASSERT_OK(device_->launch(other, copy, {}, pack(a.va, uint64_t{77})));
  HIBER_EXPECT_OK(device_->synchronize_stream(other));
  EXPECT_EQ(*reinterpret_cast<volatile uint64_t*>(a.va), 77u);
  free(a);
}

TEST_F(SimDeviceTest, KernelErrorsAreReportedAtTheNextSynchronisation) {
  make_default();
  Module m = load_sim_kernels();
  Function fail = function(m, "sim_fail");
  Stream s = stream(0);
  Bytes code = pack(static_cast<int>(ErrorCode::kLaunchOutOfResources));
  std::promise<Status> seen;
  HIBER_ASSERT_OK(device_->launch(s, fail, {}, code));
  HIBER_ASSERT_OK(device_->add_callback(s, [&](Status st) { seen.set_value(st); }));
  Status callback_status = seen.get_future().get();
  HIBER_EXPECT_CODE(callback_status, ErrorCode::kLaunchOutOfResources);
  HIBER_EXPECT_CODE(device_->synchronize_stream(s), ErrorCode::kLaunchOutOfResources);
  HIBER_EXPECT_OK(device_->synchronize_stream(s)) << "reported once";

  // query reports (and clears) it too; the first error wins.
  Bytes other = pack(static_cast<int>(ErrorCode::kInvalidValue));
  HIBER_ASSERT_OK(device_->launch(s, fail, {}, code));
  HIBER_ASSERT_OK(device_->launch(s, fail, {}, other));
  Status queried;
  do {
    queried = device_->query_stream(s);
  } while (queried.code() == ErrorCode::kNotReady);
  HIBER_EXPECT_CODE(queried, ErrorCode::kLaunchOutOfResources);
  HIBER_EXPECT_OK(device_->query_stream(s)) << "reported once";
  HIBER_EXPECT_OK(device_->synchronize_stream(s));
}

TEST_F(SimDeviceTest, EventsReportTheErrorsOfTheWorkBeforeThem) {
  make_default();
  Module m = load_sim_kernels();
  Function fail = function(m, "sim_fail");
  Function poke = function(m, "sim_poke");
  Stream s = stream(0);
  HIBER_ASSERT_OK_AND_ASSIGN(Event e, device_->create_event(0, true));
  HIBER_ASSERT_OK(
      device_->launch(s, fail, {}, pack(static_cast<int>(ErrorCode::kLaunchOutOfResources))));
  HIBER_ASSERT_OK(device_->record_event(e, s));
  HIBER_EXPECT_CODE(device_->synchronize_event(e), ErrorCode::kLaunchOutOfResources);
  HIBER_EXPECT_CODE(device_->query_event(e), ErrorCode::kLaunchOutOfResources) << "and again";
  HIBER_EXPECT_CODE(device_->synchronize_stream(s), ErrorCode::kLaunchOutOfResources)
      << "the stream too";
  // Recorded after the stream reported its error: nothing failed before this record.
  HIBER_ASSERT_OK(device_->record_event(e, s));
  HIBER_EXPECT_OK(device_->synchronize_event(e));
  HIBER_EXPECT_OK(device_->query_event(e));

  // A kernel that touches memory it may not.
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr reserved, device_->reserve_address_range(g, 0));
  HIBER_ASSERT_OK(device_->launch(s, poke, {}, pack(reserved + 64, 1)));
  // The fault ends the context: a record after it is refused with the fault, and one enqueued
  // before it reports the fault.
  const Status recorded = device_->record_event(e, s);
  Status faulted = recorded.ok() ? device_->synchronize_event(e) : recorded;
  HIBER_EXPECT_CODE(faulted, ErrorCode::kIllegalAddress);
  EXPECT_NE(faulted.message().find("sim_poke"), std::string::npos) << faulted;
  HIBER_EXPECT_CODE(device_->query_event(e), ErrorCode::kIllegalAddress);
  HIBER_EXPECT_CODE(device_->synchronize_stream(s), ErrorCode::kIllegalAddress);
  HIBER_EXPECT_OK(device_->free_address_range(reserved, g));
  HIBER_EXPECT_OK(device_->destroy_event(e));
}

TEST_F(SimDeviceTest, ACallbackSeesTheErrorEvenIfASyncReportedItMeanwhile) {
  // The stream's error is reported (and cleared) by a synchronize_stream that waited only for
  // the failing kernel, before a worker is free to run the callback enqueued after it.
  SimDeviceOptions options;
  options.workers_per_gpu = 1;
  make(options);
  Module m = load_sim_kernels();
  Function fail = function(m, "sim_fail");
  Stream failing = stream(0);
  Stream urgent = stream(0, -1);  // runs first once ready, holding the only worker
  HIBER_ASSERT_OK_AND_ASSIGN(Event failed, device_->create_event(0, true));
  Gate start, hold;
  HIBER_ASSERT_OK(device_->add_callback(failing, start.callback()));
  HIBER_ASSERT_OK(
      device_->launch(failing, fail, {}, pack(static_cast<int>(ErrorCode::kLaunchOutOfResources))));
  auto sync = std::async(std::launch::async, [&] { return device_->synchronize_stream(failing); });
  // Let the synchronisation take its target (the gate and the kernel) before more is enqueued.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::promise<Status> seen;
  HIBER_ASSERT_OK(device_->record_event(failed, failing));
  HIBER_ASSERT_OK(device_->add_callback(failing, [&](Status st) { seen.set_value(st); }));
  // Once the kernel has failed, the record wakes `urgent`, whose gate takes the worker first.
  HIBER_ASSERT_OK(device_->wait_event(urgent, failed));
  HIBER_ASSERT_OK(device_->add_callback(urgent, hold.callback()));
  start.open();
  // Normally the synchronisation returns now, with the worker held; had it not taken its target
  // in time, it returns after the callback, and the test shows nothing (but does not hang).
  if (sync.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
    HIBER_EXPECT_CODE(sync.get(), ErrorCode::kLaunchOutOfResources);
  }
  hold.open();
  HIBER_EXPECT_CODE(seen.get_future().get(), ErrorCode::kLaunchOutOfResources);
  if (sync.valid()) (void)sync.get();
  HIBER_EXPECT_OK(device_->synchronize_stream(urgent));
  HIBER_EXPECT_OK(device_->destroy_event(failed));
}

TEST_F(SimDeviceTest, ParametersAreCopiedWhenTheKernelIsLaunched) {
  make_default();
  Module m = load_sim_kernels();
  Stream s = stream(0);
  Allocation a = allocate(0, 64);
  Bytes params = pack(a.va, uint64_t{0x1122334455667788});
  {
    Gate gate;  // the kernel runs only after the buffer was overwritten
    HIBER_ASSERT_OK(device_->add_callback(s, gate.callback()));
    HIBER_ASSERT_OK(device_->launch(s, function(m, "sim_copy_param"), {}, params));
    std::fill(params.begin(), params.end(), std::byte{0});
    gate.open();
  }
  HIBER_ASSERT_OK(device_->synchronize_stream(s));
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(a.va), 0x1122334455667788u);
  free(a);
}

TEST_F(SimDeviceTest, LaunchWithoutHostImplementationIsNotSupported) {
  SimDeviceOptions options;  // no plugins
  make(options);
  Module m = load_sim_kernels();
  Stream s = stream(0);
  Status status = device_->launch(s, function(m, "sim_unimplemented"), {}, {});
  HIBER_EXPECT_CODE(status, ErrorCode::kNotSupported);
  EXPECT_NE(status.message().find("sim_unimplemented"), std::string::npos) << status;
  EXPECT_NE(status.message().find("register_kernel"), std::string::npos) << status;
  // Registered later, it runs.
  HIBER_ASSERT_OK(
      device_->register_kernel("sim_unimplemented", [](const HiberSimLaunch*) { return 0; }));
  HIBER_EXPECT_OK(device_->launch(s, function(m, "sim_unimplemented"), {}, {}));
  HIBER_EXPECT_OK(device_->synchronize_stream(s));
}

TEST_F(SimDeviceTest, KernelPluginErrorsNameWhatWentWrong) {
  make(options_with_plugin());
  Status missing = device_->load_kernel_plugin("/nonexistent/libplugin.so");
  HIBER_EXPECT_CODE(missing, ErrorCode::kFileNotFound);
  EXPECT_NE(missing.message().find("/nonexistent/libplugin.so"), std::string::npos) << missing;

  Status not_a_library = device_->load_kernel_plugin(HIBER_SOURCE_DIR "/CMakeLists.txt");
  HIBER_EXPECT_CODE(not_a_library, ErrorCode::kInvalidImage);

  Status no_symbol = device_->load_kernel_plugin(HIBER_TEST_PLUGIN_NO_SYMBOL);
  HIBER_EXPECT_CODE(no_symbol, ErrorCode::kNotFound);
  EXPECT_NE(no_symbol.message().find("hiber_sim_kernels_v1"), std::string::npos) << no_symbol;

  Status duplicate = device_->load_kernel_plugin(HIBER_TEST_PLUGIN_DUPLICATE);
  HIBER_EXPECT_CODE(duplicate, ErrorCode::kInvalidValue);
  EXPECT_NE(duplicate.message().find("_Z4noopv"), std::string::npos) << duplicate;
  EXPECT_NE(duplicate.message().find(HIBER_TEST_PLUGIN_DUPLICATE), std::string::npos) << duplicate;
  EXPECT_NE(duplicate.message().find(HIBER_TEST_KERNELS_PLUGIN), std::string::npos) << duplicate;

  // Nothing of the rejected plugin was registered: its own kernel is still free to register.
  HIBER_EXPECT_OK(
      device_->register_kernel("_Z9only_herev", [](const HiberSimLaunch*) { return 0; }));
  Status again = device_->register_kernel("_Z4noopv", [](const HiberSimLaunch*) { return 0; });
  HIBER_EXPECT_CODE(again, ErrorCode::kInvalidValue);
  EXPECT_NE(again.message().find(HIBER_TEST_KERNELS_PLUGIN), std::string::npos) << again;
  HIBER_EXPECT_CODE(device_->register_kernel("", [](const HiberSimLaunch*) { return 0; }),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->register_kernel("x", nullptr), ErrorCode::kInvalidValue);

  SimDeviceOptions bad;
  bad.kernel_plugins = {"/nonexistent/libplugin.so"};
  HIBER_EXPECT_CODE(SimDevice::create(bad), ErrorCode::kFileNotFound);
}

TEST_F(SimDeviceTest, ModulesOfAnyArchitectureLoad) {
  make_default();
  // Real GPUs run only code of their architecture (the default node's H100s: sm_90), but the
  // simulator runs host code for any.
  for (const char* path :
       {kFatbin,
#ifdef HIBER_TEST_KERNELS_FATBIN
        HIBER_TEST_KERNELS_FATBIN_ZSTD, HIBER_TEST_KERNELS_FATBIN_LZ4,
        HIBER_TEST_KERNELS_FATBIN_PTX, HIBER_TEST_KERNELS_CUBIN, HIBER_TEST_KERNELS_PTX
#endif
       }) {
    if (std::string(path).empty()) continue;
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto module = device_->load_module(bytes_of(text));
    ASSERT_TRUE(module.ok()) << path << ": " << module.status();
    HIBER_EXPECT_OK(device_->get_function(*module, "_Z7vec_addPKfS0_Pfi")) << path;
    HIBER_EXPECT_OK(device_->unload_module(*module));
  }
  // A fatbin with nothing loadable in it (one LTO-IR entry, kind 8).
  Bytes lto(16 + 64 + 8);
  const uint32_t magic = 0xBA55ED50;
  const uint16_t version = 1, header = 16, kind = 8;
  const uint64_t body = 64 + 8, payload = 8;
  const uint32_t entry_header = 64;
  std::memcpy(lto.data(), &magic, 4);
  std::memcpy(lto.data() + 4, &version, 2);
  std::memcpy(lto.data() + 6, &header, 2);
  std::memcpy(lto.data() + 8, &body, 8);
  std::memcpy(lto.data() + 16, &kind, 2);
  std::memcpy(lto.data() + 20, &entry_header, 4);
  std::memcpy(lto.data() + 24, &payload, 8);
  HIBER_EXPECT_CODE(device_->load_module(lto), ErrorCode::kNoBinaryForGpu);
  HIBER_EXPECT_CODE(device_->load_module({}), ErrorCode::kInvalidImage);
}

// ---- Streams ----

TEST_F(SimDeviceTest, LowerPriorityValuesRunFirst) {
  SimDeviceOptions options;
  options.workers_per_gpu = 1;  // one worker: the order of ready streams is observable
  make(options);
  Stream blocker = stream(0), low = stream(0, 0), high = stream(0, -1);
  std::mutex mu;
  std::vector<std::string> order;
  auto note = [&](std::string what) {
    return [&, what](Status) {
      std::lock_guard lock(mu);
      order.push_back(what);
    };
  };
  {
    Gate gate;
    HIBER_ASSERT_OK(device_->add_callback(blocker, gate.callback()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker is now blocked
    HIBER_ASSERT_OK(device_->add_callback(low, note("low 1")));
    HIBER_ASSERT_OK(device_->add_callback(low, note("low 2")));
    HIBER_ASSERT_OK(device_->add_callback(high, note("high 1")));
    HIBER_ASSERT_OK(device_->add_callback(high, note("high 2")));
    gate.open();
  }
  for (Stream s : {blocker, low, high}) HIBER_EXPECT_OK(device_->synchronize_stream(s));
  std::lock_guard lock(mu);
  EXPECT_EQ(order, (std::vector<std::string>{"high 1", "high 2", "low 1", "low 2"}));
}

TEST_F(SimDeviceTest, AStreamWaitingOnAnEventHoldsNoWorker) {
  SimDeviceOptions options;
  options.workers_per_gpu = 1;
  make(options);
  Stream waiting = stream(0), busy = stream(0), other_gpu = stream(1);
  HIBER_ASSERT_OK_AND_ASSIGN(Event e, device_->create_event(1, true));
  Gate gate;
  HIBER_ASSERT_OK(device_->add_callback(other_gpu, gate.callback()));
  HIBER_ASSERT_OK(device_->record_event(e, other_gpu));
  HIBER_ASSERT_OK(device_->wait_event(waiting, e));
  std::atomic<bool> after_wait{false};
  HIBER_ASSERT_OK(device_->add_callback(waiting, [&](Status) { after_wait = true; }));
  // GPU 0's only worker is free for other streams meanwhile.
  std::atomic<bool> ran{false};
  HIBER_ASSERT_OK(device_->add_callback(busy, [&](Status) { ran = true; }));
  HIBER_ASSERT_OK(device_->synchronize_stream(busy));
  EXPECT_TRUE(ran);
  EXPECT_FALSE(after_wait);
  HIBER_EXPECT_CODE(device_->query_stream(waiting), ErrorCode::kNotReady);
  gate.open();
  HIBER_ASSERT_OK(device_->synchronize_stream(waiting));
  EXPECT_TRUE(after_wait);
  HIBER_EXPECT_OK(device_->destroy_event(e));
}

TEST_F(SimDeviceTest, DestroyedStreamsAndDevicesFinishTheirWork) {
  make_default();
  std::atomic<int> done{0};
  Stream s = stream(0);
  for (int i = 0; i < 3; ++i) {
    HIBER_ASSERT_OK(device_->add_callback(s, [&](Status) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ++done;
    }));
  }
  HIBER_ASSERT_OK(device_->destroy_stream(s));
  Stream t = stream(1);
  HIBER_ASSERT_OK(device_->add_callback(t, [&](Status) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ++done;
  }));
  device_.reset();
  EXPECT_EQ(done, 4);
}

TEST_F(SimDeviceTest, EventsOfOneGpuAreRecordedOnItsStreamsOnly) {
  make_default();
  Stream s0 = stream(0);
  HIBER_ASSERT_OK_AND_ASSIGN(Event e1, device_->create_event(1, false));
  HIBER_EXPECT_CODE(device_->record_event(e1, s0), ErrorCode::kInvalidHandle);
  HIBER_EXPECT_OK(device_->wait_event(s0, e1)) << "waiting across GPUs is fine";
  HIBER_EXPECT_OK(device_->destroy_event(e1));
}

TEST_F(SimDeviceTest, InvalidHandlesAreRejected) {
  make_default();
  Module m = load_sim_kernels();
  Function f = function(m, "sim_poke");
  Stream live = stream(0);
  HIBER_ASSERT_OK_AND_ASSIGN(Stream dead, device_->create_stream(0, 0));
  HIBER_ASSERT_OK(device_->destroy_stream(dead));
  HIBER_ASSERT_OK_AND_ASSIGN(Event dead_event, device_->create_event(0, false));
  HIBER_ASSERT_OK(device_->destroy_event(dead_event));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory dead_memory,
                             device_->create_physical(0, device_->allocation_granularity(0)));
  HIBER_ASSERT_OK(device_->release_physical(dead_memory));
  const Stream made_up{987654321, 0};
  const Stream wrong_gpu{live.id, 1};
  const Event stream_as_event{live.id, 0};
  constexpr auto kInvalid = ErrorCode::kInvalidHandle;

  for (Stream s : {dead, made_up, wrong_gpu}) {
    SCOPED_TRACE(str_cat("stream ", s.id, " on GPU ", s.gpu));
    HIBER_EXPECT_CODE(device_->destroy_stream(s), kInvalid);
    HIBER_EXPECT_CODE(device_->synchronize_stream(s), kInvalid);
    HIBER_EXPECT_CODE(device_->query_stream(s), kInvalid);
    HIBER_EXPECT_CODE(device_->add_callback(s, [](Status) {}), kInvalid);
    HIBER_EXPECT_CODE(device_->copy_host_to_device(s, 0, &s, 0), kInvalid);
    HIBER_EXPECT_CODE(device_->memset(s, 0, 0, 1, 1), kInvalid);
    HIBER_EXPECT_CODE(device_->launch(s, f, {}, pack(uint64_t{0}, 0)), kInvalid);
  }
  for (Event e : {dead_event, stream_as_event, Event{live.id + 1000, 0}}) {
    HIBER_EXPECT_CODE(device_->destroy_event(e), kInvalid);
    HIBER_EXPECT_CODE(device_->record_event(e, live), kInvalid);
    HIBER_EXPECT_CODE(device_->wait_event(live, e), kInvalid);
    HIBER_EXPECT_CODE(device_->synchronize_event(e), kInvalid);
    HIBER_EXPECT_CODE(device_->query_event(e), kInvalid);
    HIBER_EXPECT_CODE(device_->elapsed_ms(e, e), kInvalid);
  }
  HIBER_EXPECT_CODE(device_->release_physical(dead_memory), kInvalid);
  HIBER_EXPECT_CODE(device_->map(0, 0, dead_memory, 0), kInvalid);
  HIBER_EXPECT_CODE(device_->release_physical(PhysicalMemory{live.id, 0, 4096}), kInvalid);
  HIBER_EXPECT_CODE(device_->get_function(Module{f.id}, "sim_poke"), kInvalid);
  HIBER_EXPECT_CODE(device_->function_info(Function{m.id}), kInvalid);
  HIBER_EXPECT_CODE(device_->launch(live, Function{12345678}, {}, {}), kInvalid);
  HIBER_ASSERT_OK(device_->unload_module(m));
  HIBER_EXPECT_CODE(device_->unload_module(m), kInvalid);
  HIBER_EXPECT_CODE(device_->function_info(f), kInvalid) << "functions go with their module";
  HIBER_EXPECT_CODE(device_->launch(live, f, {}, pack(uint64_t{0}, 0)), kInvalid);
  HIBER_EXPECT_CODE(device_->create_stream(4, 0), ErrorCode::kInvalidDevice);
  HIBER_EXPECT_CODE(device_->create_event(-1, false), ErrorCode::kInvalidDevice);
  EXPECT_EQ(device_->properties(17).ordinal, -1);
}

TEST_F(SimDeviceTest, HostMemoryRegistration) {
  make_default();
  std::vector<char> arena(1 << 16);
  HIBER_EXPECT_OK(device_->register_host_memory(arena.data(), arena.size()));
  HIBER_EXPECT_CODE(device_->register_host_memory(arena.data() + 100, 10),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->unregister_host_memory(arena.data() + 1), ErrorCode::kInvalidValue);
  HIBER_EXPECT_OK(device_->unregister_host_memory(arena.data()));
  HIBER_EXPECT_CODE(device_->unregister_host_memory(arena.data()), ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->register_host_memory(nullptr, 10), ErrorCode::kInvalidValue);
}

// ---- What the simulated GPUs report ----

TEST_F(SimDeviceTest, PropertiesComeFromTheConfig) {
  SimDeviceOptions options;
  options.node = slow_node();
  make(options);
  const DeviceProperties& p = device_->properties(2);
  EXPECT_EQ(p.name, "Hiber Test GPU");
  EXPECT_EQ(p.total_memory_bytes, 268435456u);
  EXPECT_EQ(p.pci_bus_id, "0001:af:1f.0");
  EXPECT_EQ(p.attribute(33), 0xaf) << "PCI bus";
  EXPECT_EQ(p.attribute(34), 0x1f) << "PCI device";
  EXPECT_EQ(p.attribute(50), 1) << "PCI domain";
  EXPECT_EQ(p.attribute(kAttrComputeCapabilityMajor), 8);
  EXPECT_EQ(p.attribute(kAttrComputeCapabilityMinor), 6);
  EXPECT_EQ(p.attribute(kAttrMaxThreadsPerMultiprocessor), 1536) << "8.6";
  EXPECT_EQ(p.attribute(kAttrMultiprocessorCount), 10);
  EXPECT_EQ(p.attribute(kAttrL2CacheSize), 1048576);
  EXPECT_EQ(p.attribute(97), 101376) << "shared memory per block, opt-in, on 8.6";
  EXPECT_EQ(device_->properties(0).attribute(kAttrMaxThreadsPerMultiprocessor), 1536);
  // Stable across devices of the same node, different across nodes.
  auto again = SimDevice::create(options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->properties(2).uuid, p.uuid);
  EXPECT_NE(SimDevice::create(SimDeviceOptions{}).value()->properties(2).uuid, p.uuid);
  // Peers: an NVLink or a shared switch.
  EXPECT_TRUE(device_->can_access_peer(0, 1));
  EXPECT_FALSE(device_->can_access_peer(0, 2));
  EXPECT_FALSE(device_->can_access_peer(1, 2));
  EXPECT_EQ(device_->topology().name, "slow-test-node");
  EXPECT_EQ(device_->backend_name(), "sim");
}

TEST_F(SimDeviceTest, BadOptionsAreRejected) {
  SimDeviceOptions options;
  options.allocation_granularity = 3 << 20;
  HIBER_EXPECT_CODE(SimDevice::create(options), ErrorCode::kInvalidValue);
  options = SimDeviceOptions{};
  options.workers_per_gpu = 0;
  HIBER_EXPECT_CODE(SimDevice::create(options), ErrorCode::kInvalidValue);
  options = SimDeviceOptions{};
  options.node.gpus[1].pcie_switch = 7;
  HIBER_EXPECT_CODE(SimDevice::create(options), ErrorCode::kInvalidValue);
  options = SimDeviceOptions{};
  options.node.gpus.clear();
  HIBER_EXPECT_CODE(SimDevice::create(options), ErrorCode::kInvalidValue);
}

TEST_F(SimDeviceTest, ReservePoolStopsAtTheReserve) {
  SimDeviceOptions options;
  options.node = slow_node();
  make(options);
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(auto chunks, reserve_pool(*device_, 0, 100 << 20, 10 << 20));
  // 256 MiB less a 100 MiB reserve leaves 156 MiB: fifteen 10 MiB chunks.
  EXPECT_EQ(chunks.size(), 15u);
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo info, device_->memory_info(0));
  EXPECT_EQ(info.free_bytes, (256u << 20) - 15 * (10u << 20));
  for (const PhysicalMemory& m : chunks) HIBER_EXPECT_OK(device_->release_physical(m));
  // Chunks larger than what is left: none, and no error.
  HIBER_ASSERT_OK_AND_ASSIGN(auto none, reserve_pool(*device_, 0, 0, 512 << 20));
  EXPECT_TRUE(none.empty());
  HIBER_EXPECT_CODE(reserve_pool(*device_, 9, 0, g), ErrorCode::kInvalidDevice);
}

// ---- Concurrency (run under ThreadSanitizer too) ----

TEST_F(SimDeviceTest, ManyThreadsMappingCopyingAndLaunchingAtOnce) {
  SimDeviceOptions options;
  options.allocation_granularity = 64 << 10;  // small buffers: many rounds, little copying
  make(options);
  Module m = load_sim_kernels();
  Function poke = function(m, "sim_poke");
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int gpu = t % device_->gpu_count();
      auto s = device_->create_stream(gpu, t % 2 ? 0 : -1);
      if (!s.ok()) return void(++failures);
      std::mt19937 rng(t);
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t bytes = device_->allocation_granularity(gpu) * (1 + rng() % 3);
        Allocation a = allocate(gpu, bytes);
        std::vector<int> in(bytes / 4), out(bytes / 4);
        for (int& v : in) v = static_cast<int>(rng());
        Bytes params = pack(a.va + 4 * (rng() % in.size()), t * 1000 + r);
        bool ok = device_->copy_host_to_device(*s, a.va, in.data(), bytes).ok() &&
                  device_->launch(*s, poke, {}, params).ok() &&
                  device_->copy_device_to_host(*s, out.data(), a.va, bytes).ok() &&
                  device_->synchronize_stream(*s).ok();
        DevicePtr poked;
        std::memcpy(&poked, params.data(), 8);
        in[(poked - a.va) / 4] = t * 1000 + r;
        if (!ok || in != out) ++failures;
        free(a);
      }
      if (!device_->destroy_stream(*s).ok()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace hiber::device
