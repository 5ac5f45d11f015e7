// The Device behavioural suite (device_contract.h). Everything is checked through the Device
// interface only: device memory is read back with copies, results are compared with what the
// CPU computes.
#include "tests/unit/device_contract.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <mutex>
#include <numeric>
#include <set>

#include "tests/kernels/test_kernels.h"

namespace hiber::device::testing {
namespace {

namespace names = test_kernels;
using Bytes = std::vector<std::byte>;

// Seeded pseudo-random bytes (splitmix64: cheap enough for megabytes in sanitizer builds).
Bytes random_bytes(size_t n, uint64_t seed) {
  Bytes out(n);
  uint64_t state = seed;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, n - i));
  }
  return out;
}

template <typename T>
Bytes as_bytes(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> from_bytes(const Bytes& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

// Index of the first differing byte, for readable failures on large buffers.
::testing::AssertionResult same_bytes(const Bytes& got, const Bytes& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  if (std::memcmp(got.data(), want.data(), got.size()) == 0) return ::testing::AssertionSuccess();
  auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  return ::testing::AssertionFailure()
         << "first difference at byte " << (diff.first - got.begin()) << ": got "
         << static_cast<int>(*diff.first) << ", want " << static_cast<int>(*diff.second);
}

// A callback that blocks its stream until released; releases on destruction so that a failing
// test never leaves a stream blocked.
class StreamGate {
 public:
  StreamGate() : opened_(promise_.get_future().share()) {}
  ~StreamGate() { open(); }
  StreamCallback callback() {
    return [f = opened_](Status) { f.wait(); };
  }
  void open() {
    if (!done_.exchange(true)) promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_;
  std::atomic<bool> done_{false};
};

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// write_value(where, value) as one thread on a stream.
struct WriteValue {
  Device& device;
  Function function;
  KernelInfo info;
  Status operator()(Stream stream, DevicePtr where, int value) const;
};

}  // namespace

std::string device_test_name(const ::testing::TestParamInfo<DeviceUnderTest>& info) {
  return info.param.name;
}

void PrintTo(const DeviceUnderTest& device, std::ostream* out) { *out << device.name; }

// ---- Fixture ----

void DeviceContractTest::SetUp() {
  auto device = GetParam().create();
  if (!device.ok()) {
    const ErrorCode code = device.status().code();
    if (code == ErrorCode::kNoDevice || code == ErrorCode::kStubLibrary ||
        code == ErrorCode::kNotInitialized)
      GTEST_SKIP() << "no GPU here: " << device.status();
    FAIL() << "creating the " << GetParam().name << " device: " << device.status();
  }
  device_ = std::move(device).value();
}

void DeviceContractTest::TearDown() {
  if (!device_) return;
  for (const Stream& s : streams_) (void)device_->synchronize_stream(s);
  for (const Stream& s : streams_) HIBER_EXPECT_OK(device_->destroy_stream(s));
  for (const Event& e : events_) HIBER_EXPECT_OK(device_->destroy_event(e));
  for (const Module& m : modules_) HIBER_EXPECT_OK(device_->unload_module(m));
  for (const Allocation& a : allocations_) {
    HIBER_EXPECT_OK(device_->unmap(a.va, a.bytes));
    HIBER_EXPECT_OK(device_->release_physical(a.memory));
    HIBER_EXPECT_OK(device_->free_address_range(a.va, a.bytes));
  }
  device_.reset();
}

DeviceContractTest::Allocation DeviceContractTest::allocate(int gpu, uint64_t bytes,
                                                            std::vector<int> access) {
  Allocation a;
  a.bytes = round_up(std::max<uint64_t>(bytes, 1), device_->allocation_granularity(gpu));
  auto va = device_->reserve_address_range(a.bytes, 0);
  auto memory = device_->create_physical(gpu, a.bytes);
  if (!va.ok() || !memory.ok()) {
    ADD_FAILURE() << "allocate(" << gpu << ", " << bytes << "): " << va.status() << " / "
                  << memory.status();
    return {};
  }
  a.va = *va;
  a.memory = *memory;
  if (access.empty()) access = {gpu};
  HIBER_EXPECT_OK(device_->map(a.va, a.bytes, a.memory, 0));
  HIBER_EXPECT_OK(device_->set_access(a.va, a.bytes, access));
  allocations_.push_back(a);
  return a;
}

Stream DeviceContractTest::make_stream(int gpu, int priority) {
  auto stream = device_->create_stream(gpu, priority);
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) return {};
  streams_.push_back(*stream);
  return *stream;
}

Event DeviceContractTest::make_event(int gpu, bool disable_timing) {
  auto event = device_->create_event(gpu, disable_timing);
  EXPECT_TRUE(event.ok()) << event.status();
  if (!event.ok()) return {};
  events_.push_back(*event);
  return *event;
}

Module DeviceContractTest::load_test_kernels() {
  const std::string& path = GetParam().kernels_fatbin;
  if (path.empty()) return {};
  Bytes image = read_file(path);
  EXPECT_FALSE(image.empty()) << "cannot read " << path;
  auto module = device_->load_module(image);
  EXPECT_TRUE(module.ok()) << module.status();
  if (!module.ok()) return {};
  modules_.push_back(*module);
  return *module;
}

Function DeviceContractTest::function(Module module, const std::string& name) {
  auto f = device_->get_function(module, name);
  EXPECT_TRUE(f.ok()) << name << ": " << f.status();
  return f.ok() ? *f : Function{};
}

void DeviceContractTest::upload(Stream stream, DevicePtr dst, std::span<const std::byte> data) {
  HIBER_EXPECT_OK(device_->copy_host_to_device(stream, dst, data.data(), data.size()));
  HIBER_EXPECT_OK(device_->synchronize_stream(stream));
}

Bytes DeviceContractTest::download(Stream stream, DevicePtr src, uint64_t bytes) {
  Bytes out(bytes);
  HIBER_EXPECT_OK(device_->copy_device_to_host(stream, out.data(), src, bytes));
  HIBER_EXPECT_OK(device_->synchronize_stream(stream));
  return out;
}

KernelParams::KernelParams(KernelInfo info)
    : info_(std::move(info)), buffer_(info_.param_bytes()) {}

void KernelParams::place(const void* value, size_t size) {
  if (next_ >= info_.params.size()) {
    ADD_FAILURE() << info_.name << " takes " << info_.params.size() << " parameters, not more";
    return;
  }
  const ParamInfo& p = info_.params[next_++];
  if (p.bytes != size) {
    ADD_FAILURE() << info_.name << " parameter " << next_ - 1 << " is " << p.bytes
                  << " bytes, the value " << size;
    return;
  }
  std::memcpy(buffer_.data() + p.offset, value, size);
}

Status WriteValue::operator()(Stream stream, DevicePtr where, int value) const {
  KernelParams params(info);
  params.add(where).add(value);
  return device.launch(stream, function, LaunchConfig{{1, 1, 1}, {1, 1, 1}, 0}, params.bytes());
}

// Skips the test when the suite has no test kernels (no toolkit at build time).
#define SKIP_WITHOUT_KERNELS()           \
  if (GetParam().kernels_fatbin.empty()) \
  GTEST_SKIP() << "no test kernel fatbin: the CUDA toolkit was absent at build time"

// ---- The node ----

TEST_P(DeviceContractTest, PropertiesAndTopologyAreConsistent) {
  const int n = device_->gpu_count();
  ASSERT_GE(n, 1);
  EXPECT_EQ(device_->topology().gpu_count(), n);
  EXPECT_FALSE(device_->backend_name().empty());
  std::set<std::array<uint8_t, 16>> uuids;
  std::set<std::string> bus_ids;
  for (int g = 0; g < n; ++g) {
    SCOPED_TRACE(str_cat("GPU ", g));
    const DeviceProperties& p = device_->properties(g);
    EXPECT_EQ(p.ordinal, g);
    EXPECT_FALSE(p.name.empty());
    EXPECT_GT(p.total_memory_bytes, 0u);
    EXPECT_NE(p.uuid, (std::array<uint8_t, 16>{}));
    uuids.insert(p.uuid);
    EXPECT_FALSE(p.pci_bus_id.empty());
    bus_ids.insert(p.pci_bus_id);
    EXPECT_EQ(p.attribute(kAttrWarpSize), 32);
    EXPECT_GE(p.attribute(kAttrMaxThreadsPerBlock), 1024);
    EXPECT_GE(p.attribute(kAttrMaxBlockDimX), 1024);
    EXPECT_EQ(p.attribute(kAttrMaxGridDimX), 2147483647);
    EXPECT_GE(p.attribute(kAttrMaxSharedMemoryPerBlock), 49152);
    EXPECT_GT(p.attribute(kAttrMultiprocessorCount), 0);
    EXPECT_GT(p.attribute(kAttrClockRate), 0);
    EXPECT_GE(p.attribute(kAttrMaxThreadsPerMultiprocessor), 1024);
    EXPECT_GE(p.attribute(kAttrComputeCapabilityMajor), 6);
    EXPECT_EQ(p.attribute(kAttrUnifiedAddressing), 1);
    EXPECT_EQ(p.attribute(kAttrVirtualMemoryManagementSupported), 1);
    EXPECT_EQ(p.attribute(-1), 0);
    EXPECT_EQ(p.attribute(kAttrCount + 5), 0);
    const uint64_t granularity = device_->allocation_granularity(g);
    EXPECT_GT(granularity, 0u);
    EXPECT_EQ(granularity & (granularity - 1), 0u) << granularity;
    EXPECT_FALSE(device_->can_access_peer(g, g));
    for (int peer = 0; peer < n; ++peer)
      EXPECT_EQ(device_->can_access_peer(g, peer), device_->can_access_peer(peer, g)) << peer;
  }
  EXPECT_EQ(uuids.size(), static_cast<size_t>(n));
  EXPECT_EQ(bus_ids.size(), static_cast<size_t>(n));
  EXPECT_FALSE(device_->can_access_peer(0, n));
}

TEST_P(DeviceContractTest, MemoryInfoFollowsAllocationsAndReportsOutOfMemory) {
  const uint64_t granularity = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo before, device_->memory_info(0));
  EXPECT_GT(before.total_bytes, 0u);
  EXPECT_LE(before.free_bytes, before.total_bytes);

  const uint64_t bytes = 4 * granularity;
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory memory, device_->create_physical(0, bytes));
  EXPECT_EQ(memory.gpu, 0);
  EXPECT_EQ(memory.bytes, bytes);
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo allocated, device_->memory_info(0));
  EXPECT_LE(allocated.free_bytes + bytes, before.free_bytes);
  HIBER_ASSERT_OK(device_->release_physical(memory));
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo released, device_->memory_info(0));
  EXPECT_GE(released.free_bytes, allocated.free_bytes + bytes);

  auto too_big = device_->create_physical(0, round_up(before.total_bytes + 1, granularity));
  HIBER_EXPECT_CODE(too_big, ErrorCode::kOutOfMemory);
  EXPECT_FALSE(device_->memory_info(device_->gpu_count()).ok());
  EXPECT_FALSE(device_->memory_info(-1).ok());
}

// ---- Virtual memory ----

TEST_P(DeviceContractTest, MappedMemoryRoundTripsThroughCopies) {
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr va, device_->reserve_address_range(4 * g, 0));
  EXPECT_EQ(va % g, 0u);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr aligned, device_->reserve_address_range(g, 8 * g));
  EXPECT_EQ(aligned % (8 * g), 0u) << "requested alignment";
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory memory, device_->create_physical(0, 2 * g));
  // Map the second half of the physical memory at the second quarter of the range.
  HIBER_ASSERT_OK(device_->map(va + g, g, memory, g));
  const int gpu0[] = {0};
  HIBER_ASSERT_OK(device_->set_access(va + g, g, gpu0));
  Stream s = make_stream(0);
  const Bytes data = random_bytes(g, 1);
  upload(s, va + g, data);
  EXPECT_TRUE(same_bytes(download(s, va + g, g), data));
  HIBER_ASSERT_OK(device_->unmap(va + g, g));
  // The same physical memory at another place: the bytes are still there.
  HIBER_ASSERT_OK(device_->map(va + 3 * g, g, memory, g));
  HIBER_ASSERT_OK(device_->set_access(va + 3 * g, g, gpu0));
  EXPECT_TRUE(same_bytes(download(s, va + 3 * g, g), data));
  HIBER_EXPECT_OK(device_->unmap(va + 3 * g, g));
  HIBER_EXPECT_OK(device_->release_physical(memory));
  HIBER_EXPECT_OK(device_->free_address_range(va, 4 * g));
  HIBER_EXPECT_OK(device_->free_address_range(aligned, g));
}

TEST_P(DeviceContractTest, MisusedVirtualMemoryCallsFail) {
  const uint64_t g = device_->allocation_granularity(0);
  EXPECT_FALSE(device_->reserve_address_range(0, 0).ok());
  EXPECT_FALSE(device_->create_physical(0, g + 1).ok()) << "not a multiple of the granularity";
  EXPECT_FALSE(device_->create_physical(0, 0).ok());
  EXPECT_FALSE(device_->create_physical(device_->gpu_count(), g).ok());
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr va, device_->reserve_address_range(2 * g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory memory, device_->create_physical(0, g));
  EXPECT_FALSE(device_->map(va + 1, g, memory, 0).ok()) << "unaligned address";
  EXPECT_FALSE(device_->map(va, 2 * g, memory, 0).ok()) << "beyond the physical memory";
  EXPECT_FALSE(device_->map(va, g, memory, g).ok()) << "offset beyond the physical memory";
  EXPECT_FALSE(device_->map(va + 2 * g, g, memory, 0).ok()) << "outside the reserved range";
  EXPECT_FALSE(device_->unmap(va, g).ok()) << "nothing mapped yet";
  const int gpu0[] = {0};
  EXPECT_FALSE(device_->set_access(va, g, gpu0).ok()) << "nothing mapped yet";
  HIBER_ASSERT_OK(device_->map(va, g, memory, 0));
  EXPECT_FALSE(device_->map(va, g, memory, 0).ok()) << "already mapped";
  HIBER_EXPECT_OK(device_->unmap(va, g));
  HIBER_EXPECT_OK(device_->release_physical(memory));
  HIBER_EXPECT_OK(device_->free_address_range(va, 2 * g));
}

TEST_P(DeviceContractTest, AccessIsRefusedToGpusWithoutPeerAccess) {
  const int n = device_->gpu_count();
  int owner = -1, other = -1;
  for (int o = 0; o < n && owner < 0; ++o) {
    for (int g = 0; g < n && owner < 0; ++g) {
      if (g != o && !device_->can_access_peer(g, o)) {
        owner = o;
        other = g;
      }
    }
  }
  if (owner < 0) GTEST_SKIP() << "every pair of GPUs are peers here";
  SCOPED_TRACE(str_cat("memory of GPU ", owner, ", GPU ", other, " not its peer"));
  Allocation a = allocate(owner, 1);
  const int both[] = {owner, other};
  HIBER_EXPECT_CODE(device_->set_access(a.va, a.bytes, both), ErrorCode::kPeerAccessUnsupported);
  const int just_other[] = {other};
  HIBER_EXPECT_CODE(device_->set_access(a.va, a.bytes, just_other),
                    ErrorCode::kPeerAccessUnsupported);
  // The owner kept its access.
  Stream s = make_stream(owner);
  const Bytes data = random_bytes(64, 8);
  upload(s, a.va, data);
  EXPECT_TRUE(same_bytes(download(s, a.va, data.size()), data));
}

TEST_P(DeviceContractTest, SamePhysicalMemoryIsVisibleAtTwoAddresses) {
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr a, device_->reserve_address_range(g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr b, device_->reserve_address_range(g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(PhysicalMemory memory, device_->create_physical(0, g));
  HIBER_ASSERT_OK(device_->map(a, g, memory, 0));
  HIBER_ASSERT_OK(device_->map(b, g, memory, 0));
  const int gpu0[] = {0};
  HIBER_ASSERT_OK(device_->set_access(a, g, gpu0));
  HIBER_ASSERT_OK(device_->set_access(b, g, gpu0));
  Stream s = make_stream(0);
  const Bytes data = random_bytes(g, 2);
  upload(s, a, data);
  EXPECT_TRUE(same_bytes(download(s, b, g), data)) << "written at a, read at b";
  HIBER_ASSERT_OK(device_->memset(s, b + 100, 0x5a, 1, 1000));
  Bytes want = data;
  std::fill(want.begin() + 100, want.begin() + 1100, std::byte{0x5a});
  EXPECT_TRUE(same_bytes(download(s, a, g), want)) << "set at b, read at a";
  // Releasing keeps the memory alive while it is still mapped.
  HIBER_ASSERT_OK(device_->release_physical(memory));
  HIBER_ASSERT_OK(device_->unmap(a, g));
  EXPECT_TRUE(same_bytes(download(s, b, g), want)) << "after release and one unmap";
  HIBER_EXPECT_OK(device_->unmap(b, g));
  HIBER_EXPECT_OK(device_->free_address_range(a, g));
  HIBER_EXPECT_OK(device_->free_address_range(b, g));
}

// ---- Copies and memset ----

TEST_P(DeviceContractTest, CopiesInEveryDirectionMoveTheRightBytes) {
  const uint64_t size = 2 << 20;
  Allocation src = allocate(0, size);
  Allocation dst = allocate(0, size);
  Stream s = make_stream(0);
  const Bytes data = random_bytes(size, 3);
  upload(s, src.va, data);
  // Odd sizes and offsets on both sides.
  for (uint64_t bytes : {uint64_t{1}, uint64_t{7}, uint64_t{4097}, uint64_t{(1 << 20) + 3}}) {
    for (uint64_t src_offset : {uint64_t{0}, uint64_t{3}, uint64_t{65536 + 1}}) {
      SCOPED_TRACE(str_cat(bytes, " bytes from offset ", src_offset));
      const uint64_t dst_offset = 5;
      const uint64_t window = dst_offset + bytes + 64;  // the copy and the bytes around it
      HIBER_ASSERT_OK(device_->memset(s, dst.va, 0, 1, window));
      HIBER_ASSERT_OK(
          device_->copy_device_to_device(s, dst.va + dst_offset, src.va + src_offset, bytes));
      Bytes want(window, std::byte{0});
      std::memcpy(want.data() + dst_offset, data.data() + src_offset, bytes);
      EXPECT_TRUE(same_bytes(download(s, dst.va, window), want));
      Bytes part(bytes);
      HIBER_ASSERT_OK(device_->copy_device_to_host(s, part.data(), src.va + src_offset, bytes));
      HIBER_ASSERT_OK(device_->synchronize_stream(s));
      EXPECT_TRUE(
          same_bytes(part, Bytes(data.begin() + src_offset, data.begin() + src_offset + bytes)));
    }
  }
  // Zero bytes: nothing to do, and nothing fails.
  Bytes none(1);
  HIBER_EXPECT_OK(device_->copy_host_to_device(s, dst.va, data.data(), 0));
  HIBER_EXPECT_OK(device_->copy_device_to_host(s, none.data(), dst.va, 0));
  HIBER_EXPECT_OK(device_->copy_device_to_device(s, dst.va, src.va, 0));
  HIBER_EXPECT_OK(device_->synchronize_stream(s));
}

TEST_P(DeviceContractTest, PeerCopiesMoveTheRightBytes) {
  if (device_->gpu_count() < 2) GTEST_SKIP() << "needs two GPUs";
  const uint64_t size = 2 << 20;
  Allocation on0 = allocate(0, size);
  Allocation on1 = allocate(1, size);
  Stream s0 = make_stream(0);
  Stream s1 = make_stream(1);
  const Bytes data = random_bytes(size, 4);
  upload(s0, on0.va, data);
  HIBER_ASSERT_OK(device_->copy_peer(s0, on1.va, 1, on0.va, 0, size));
  HIBER_ASSERT_OK(device_->synchronize_stream(s0));
  EXPECT_TRUE(same_bytes(download(s1, on1.va, size), data)) << "0 -> 1 on GPU 0's stream";
  // Back the other way, part of it, on the destination's stream.
  HIBER_ASSERT_OK(device_->memset(s0, on0.va, 0, 4, size / 4));
  HIBER_ASSERT_OK(device_->synchronize_stream(s0));
  HIBER_ASSERT_OK(device_->copy_peer(s1, on0.va + 8, 0, on1.va + 16, 1, 1000));
  HIBER_ASSERT_OK(device_->synchronize_stream(s1));
  Bytes want(size, std::byte{0});
  std::copy_n(data.begin() + 16, 1000, want.begin() + 8);
  EXPECT_TRUE(same_bytes(download(s0, on0.va, size), want)) << "1 -> 0 on GPU 1's stream";

  if (device_->can_access_peer(0, 1)) {
    // GPU 1's memory made accessible to GPU 0: a plain device copy on GPU 0 reaches it.
    Allocation shared = allocate(1, size, {0, 1});
    HIBER_ASSERT_OK(device_->copy_device_to_device(s0, shared.va, on0.va, size));
    HIBER_ASSERT_OK(device_->synchronize_stream(s0));
    EXPECT_TRUE(same_bytes(download(s1, shared.va, size), want));
  }
}

TEST_P(DeviceContractTest, MemsetWritesOneTwoAndFourByteElements) {
  const uint64_t size = 1 << 20;
  Allocation a = allocate(0, size);
  Stream s = make_stream(0);
  const Bytes data = random_bytes(size, 5);
  Bytes want = data;
  upload(s, a.va, data);
  auto set = [&](uint64_t offset, uint32_t value, int element, uint64_t count) {
    HIBER_EXPECT_OK(device_->memset(s, a.va + offset, value, element, count));
    for (uint64_t i = 0; i < count; ++i)
      std::memcpy(want.data() + offset + i * element, &value, element);  // little-endian
  };
  set(3, 0x1234567f, 1, 1001);              // the low byte
  set(2048, 0xbeefcafe, 2, (1 << 18) + 1);  // the low two bytes
  set(8192 * 8, 0xdeadbeef, 4, 40000);
  set(size - 4, 0x01020304, 4, 1);
  EXPECT_TRUE(same_bytes(download(s, a.va, size), want));
  HIBER_EXPECT_OK(device_->memset(s, a.va, 7, 4, 0));  // nothing
  EXPECT_FALSE(device_->memset(s, a.va, 0, 3, 10).ok()) << "element size 3";
  EXPECT_FALSE(device_->memset(s, a.va + 1, 0, 4, 10).ok()) << "misaligned for 4-byte elements";
}

// ---- Streams and events ----

TEST_P(DeviceContractTest, StreamRunsDependentOperationsInOrder) {
  const uint64_t size = 1 << 20;
  Allocation a = allocate(0, size);
  Allocation b = allocate(0, size);
  Allocation c = allocate(0, size);
  Stream s = make_stream(0);
  constexpr int kRounds = 12;
  std::vector<Bytes> inputs, outputs(kRounds, Bytes(size)),
      cleared(kRounds, Bytes(size, std::byte{1}));
  for (int r = 0; r < kRounds; ++r) inputs.push_back(random_bytes(size, 100 + r));
  // Each round reuses a, b and c: any reordering within or across rounds shows in the output.
  for (int r = 0; r < kRounds; ++r) {
    HIBER_ASSERT_OK(device_->copy_host_to_device(s, a.va, inputs[r].data(), size));
    HIBER_ASSERT_OK(device_->copy_device_to_device(s, b.va, a.va, size));
    HIBER_ASSERT_OK(device_->memset(s, a.va, 0, 4, size / 4));
    HIBER_ASSERT_OK(device_->copy_device_to_device(s, c.va, b.va, size));
    HIBER_ASSERT_OK(device_->copy_device_to_host(s, outputs[r].data(), c.va, size));
    HIBER_ASSERT_OK(device_->copy_device_to_host(s, cleared[r].data(), a.va, size));
  }
  HIBER_ASSERT_OK(device_->synchronize_stream(s));
  HIBER_EXPECT_OK(device_->query_stream(s));
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_TRUE(same_bytes(outputs[r], inputs[r])) << "round " << r;
    EXPECT_TRUE(same_bytes(cleared[r], Bytes(size, std::byte{0}))) << "round " << r;
  }
}

TEST_P(DeviceContractTest, WaitEventOrdersWorkAcrossStreams) {
  const uint64_t size = 4 << 20;
  Allocation a = allocate(0, size);
  Allocation b = allocate(0, size);
  Stream producer = make_stream(0);
  Stream consumer = make_stream(0);
  Event ready = make_event(0, /*disable_timing=*/true);
  constexpr int kRounds = 6;
  std::vector<Bytes> inputs, outputs(kRounds, Bytes(size));
  for (int r = 0; r < kRounds; ++r) inputs.push_back(random_bytes(size, 200 + r));
  Event consumed = make_event(0, true);
  for (int r = 0; r < kRounds; ++r) {
    // The producer may only overwrite a once the consumer has copied the previous round.
    HIBER_ASSERT_OK(device_->wait_event(producer, consumed));
    HIBER_ASSERT_OK(device_->copy_host_to_device(producer, a.va, inputs[r].data(), size));
    HIBER_ASSERT_OK(device_->record_event(ready, producer));
    HIBER_ASSERT_OK(device_->wait_event(consumer, ready));
    HIBER_ASSERT_OK(device_->copy_device_to_device(consumer, b.va, a.va, size));
    HIBER_ASSERT_OK(device_->record_event(consumed, consumer));
    HIBER_ASSERT_OK(device_->copy_device_to_host(consumer, outputs[r].data(), b.va, size));
  }
  HIBER_ASSERT_OK(device_->synchronize_stream(consumer));
  HIBER_ASSERT_OK(device_->synchronize_stream(producer));
  for (int r = 0; r < kRounds; ++r) EXPECT_TRUE(same_bytes(outputs[r], inputs[r])) << "round " << r;
}

TEST_P(DeviceContractTest, WaitEventOrdersWorkAcrossGpus) {
  if (device_->gpu_count() < 2) GTEST_SKIP() << "needs two GPUs";
  const uint64_t size = 4 << 20;
  Allocation on0 = allocate(0, size);
  Allocation on1 = allocate(1, size);
  Stream s0 = make_stream(0);
  Stream s1 = make_stream(1);
  Event written = make_event(0);
  const Bytes data = random_bytes(size, 6);
  HIBER_ASSERT_OK(device_->copy_host_to_device(s0, on0.va, data.data(), size));
  HIBER_ASSERT_OK(device_->record_event(written, s0));
  HIBER_ASSERT_OK(device_->wait_event(s1, written));
  HIBER_ASSERT_OK(device_->copy_peer(s1, on1.va, 1, on0.va, 0, size));
  Bytes out(size);
  HIBER_ASSERT_OK(device_->copy_device_to_host(s1, out.data(), on1.va, size));
  HIBER_ASSERT_OK(device_->synchronize_stream(s1));
  EXPECT_TRUE(same_bytes(out, data));
  HIBER_EXPECT_OK(device_->synchronize_stream(s0));
}

TEST_P(DeviceContractTest, EventsReportCompletionAndElapsedTime) {
  Stream s = make_stream(0);
  Event never = make_event(0);
  HIBER_EXPECT_OK(device_->query_event(never)) << "an event never recorded is complete";
  HIBER_EXPECT_OK(device_->synchronize_event(never));

  Event start = make_event(0);
  Event end = make_event(0);
  Event untimed = make_event(0, /*disable_timing=*/true);
  HIBER_EXPECT_CODE(device_->elapsed_ms(start, end), ErrorCode::kInvalidHandle) << "never recorded";
  HIBER_ASSERT_OK(device_->record_event(start, s));
  HIBER_ASSERT_OK(device_->record_event(untimed, s));
  {
    StreamGate gate;
    HIBER_ASSERT_OK(device_->add_callback(s, gate.callback()));
    HIBER_ASSERT_OK(device_->record_event(end, s));
    HIBER_EXPECT_CODE(device_->query_event(end), ErrorCode::kNotReady);
    HIBER_EXPECT_CODE(device_->query_stream(s), ErrorCode::kNotReady);
    HIBER_EXPECT_CODE(device_->elapsed_ms(start, end), ErrorCode::kNotReady);
    gate.open();
    HIBER_ASSERT_OK(device_->synchronize_event(end));
  }
  HIBER_EXPECT_OK(device_->query_event(end));
  HIBER_ASSERT_OK_AND_ASSIGN(float ms, device_->elapsed_ms(start, end));
  EXPECT_GE(ms, 0.0f);
  HIBER_EXPECT_CODE(device_->elapsed_ms(untimed, end), ErrorCode::kInvalidHandle);
  HIBER_EXPECT_CODE(device_->elapsed_ms(start, untimed), ErrorCode::kInvalidHandle);

  // A re-record moves the event: it refers to the latest record.
  {
    StreamGate gate;
    HIBER_ASSERT_OK(device_->add_callback(s, gate.callback()));
    HIBER_ASSERT_OK(device_->record_event(start, s));
    HIBER_EXPECT_CODE(device_->query_event(start), ErrorCode::kNotReady);
    gate.open();
  }
  HIBER_ASSERT_OK(device_->synchronize_stream(s));
  HIBER_EXPECT_OK(device_->query_event(start));
  HIBER_ASSERT_OK_AND_ASSIGN(float back, device_->elapsed_ms(end, start));
  EXPECT_GE(back, 0.0f);
}

TEST_P(DeviceContractTest, CallbacksRunInStreamOrderAfterThePrecedingWork) {
  const uint64_t size = 256 << 10;
  Allocation a = allocate(0, size);
  Stream s = make_stream(0);
  constexpr int kCount = 20;
  std::vector<Bytes> inputs, outputs(kCount, Bytes(size));
  for (int i = 0; i < kCount; ++i) inputs.push_back(random_bytes(size, 300 + i));
  std::mutex mu;
  std::vector<int> order;
  std::vector<bool> saw_data(kCount, false);
  std::vector<Status> statuses(kCount, Status(ErrorCode::kUnknown, "not run"));
  for (int i = 0; i < kCount; ++i) {
    HIBER_ASSERT_OK(device_->copy_host_to_device(s, a.va, inputs[i].data(), size));
    HIBER_ASSERT_OK(device_->copy_device_to_host(s, outputs[i].data(), a.va, size));
    HIBER_ASSERT_OK(device_->add_callback(s, [&, i](Status status) {
      // The download before the callback has landed.
      bool same = outputs[i] == inputs[i];
      std::lock_guard lock(mu);
      order.push_back(i);
      saw_data[i] = same;
      statuses[i] = status;
    }));
  }
  HIBER_ASSERT_OK(device_->synchronize_stream(s));
  std::lock_guard lock(mu);
  std::vector<int> want(kCount);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(order, want);
  for (int i = 0; i < kCount; ++i) {
    EXPECT_TRUE(saw_data[i]) << i;
    EXPECT_TRUE(statuses[i].ok()) << i << ": " << statuses[i];
  }
}

// ---- Code ----

TEST_P(DeviceContractTest, TestKernelsLoadWithTheirAbiLayouts) {
  SKIP_WITHOUT_KERNELS();
  Module module = load_test_kernels();
  for (const KernelInfo& want : names::expected_kernels()) {
    SCOPED_TRACE(want.name);
    HIBER_ASSERT_OK_AND_ASSIGN(Function f, device_->get_function(module, want.name));
    HIBER_ASSERT_OK_AND_ASSIGN(KernelInfo got, device_->function_info(f));
    EXPECT_EQ(got, want);
  }
  HIBER_EXPECT_CODE(device_->get_function(module, "_Z12no_such_kernelv"), ErrorCode::kNotFound);
  HIBER_EXPECT_CODE(device_->get_function(module, "vec_add"), ErrorCode::kNotFound)
      << "names are mangled";
}

TEST_P(DeviceContractTest, UnreadableImagesAreRejected) {
  // Bytes that are no image at all. A driver may try text as PTX, so kInvalidPtx is as good.
  const Bytes junk = random_bytes(4096, 7);
  const ErrorCode code = device_->load_module(junk).status().code();
  EXPECT_TRUE(code == ErrorCode::kInvalidImage || code == ErrorCode::kInvalidPtx)
      << error_code_name(code);
}

TEST_P(DeviceContractTest, TestKernelsComputeWhatTheCpuComputes) {
  SKIP_WITHOUT_KERNELS();
  Module module = load_test_kernels();
  Stream s = make_stream(0);
  auto run = [&](const char* name, Dim3 grid, Dim3 block, auto&&... args) {
    Function f = function(module, name);
    auto info = device_->function_info(f);
    ASSERT_TRUE(info.ok()) << info.status();
    KernelParams params(*info);
    (params.add(args), ...);
    HIBER_ASSERT_OK(device_->launch(s, f, LaunchConfig{grid, block, 0}, params.bytes()));
    HIBER_ASSERT_OK(device_->synchronize_stream(s));
  };
  auto blocks = [](uint64_t n, uint32_t per_block) {
    return Dim3{static_cast<uint32_t>((n + per_block - 1) / per_block), 1, 1};
  };
  // Integer-valued floats keep every result exact, with or without fused multiply-add.
  auto integers = [](size_t n, int seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + seed) % 2001) - 1000.0f;
    return v;
  };

  {  // vec_add
    const int n = 10000;
    auto x = integers(n, 1), y = integers(n, 2);
    Allocation a = allocate(0, n * 4), b = allocate(0, n * 4), c = allocate(0, n * 4);
    upload(s, a.va, as_bytes(x));
    upload(s, b.va, as_bytes(y));
    run(names::kVecAdd, blocks(n, 256), {256, 1, 1}, a.va, b.va, c.va, n);
    auto got = from_bytes<float>(download(s, c.va, n * 4));
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i] + y[i]) << "vec_add " << i;
  }
  {  // saxpy, with a grid that covers only part of n: the rest stays as it was
    const int n = 4097;
    auto x = integers(n, 3), y = integers(n, 4);
    Allocation dx = allocate(0, n * 4), dy = allocate(0, n * 4);
    upload(s, dx.va, as_bytes(x));
    upload(s, dy.va, as_bytes(y));
    run(names::kSaxpy, Dim3{16, 1, 1}, Dim3{128, 1, 1}, 3.0f, dx.va, dy.va, n);
    auto got = from_bytes<float>(download(s, dy.va, n * 4));
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(got[i], i < 16 * 128 ? 3.0f * x[i] + y[i] : y[i]) << "saxpy " << i;
  }
  {  // iota_u64 over a 2D grid of 2D blocks
    const uint64_t n = 300, start = uint64_t{1} << 40;
    Allocation out = allocate(0, 512 * 8);
    HIBER_ASSERT_OK(device_->memset(s, out.va, 0xffffffff, 4, 512 * 2));
    run(names::kIotaU64, Dim3{4, 3, 1}, Dim3{16, 2, 1}, out.va, start, n);
    auto got = from_bytes<uint64_t>(download(s, out.va, 512 * 8));
    for (uint64_t i = 0; i < 512; ++i)
      ASSERT_EQ(got[i], i < n ? start + i : ~uint64_t{0}) << "iota_u64 " << i;
  }
  {  // odd_params: every parameter arrives intact
    Allocation out = allocate(0, 5 * 4);
    OddStruct odd{12.75, 'z', {1, 2, 3}};
    run(names::kOddParams, Dim3{1, 1, 1}, Dim3{1, 1, 1}, char{-5}, odd, short{-300}, out.va);
    EXPECT_EQ(from_bytes<int>(download(s, out.va, 5 * 4)),
              (std::vector<int>{-5, 12, 'z', 6, -300}));
  }
  {  // big_param
    BigStruct big;
    for (int i = 0; i < 32; ++i) big.v[i] = static_cast<float>(i) * 1.5f;
    Allocation out = allocate(0, 32 * 4);
    run(names::kBigParam, Dim3{1, 1, 1}, Dim3{32, 1, 1}, big, out.va);
    EXPECT_EQ(from_bytes<float>(download(s, out.va, 32 * 4)),
              std::vector<float>(std::begin(big.v), std::end(big.v)));
  }
  {  // sum_i32
    const uint64_t n = 5000;
    std::vector<int> values(n);
    for (uint64_t i = 0; i < n; ++i) values[i] = static_cast<int>((i * 7919) % 2001) - 1000;
    Allocation in = allocate(0, n * 4), total = allocate(0, 8);
    upload(s, in.va, as_bytes(values));
    HIBER_ASSERT_OK(device_->memset(s, total.va, 0, 4, 2));
    run(names::kSumI32, blocks(n, 128), Dim3{128, 1, 1}, in.va, n, total.va);
    long long want = std::accumulate(values.begin(), values.end(), 0LL);
    EXPECT_EQ(from_bytes<uint64_t>(download(s, total.va, 8))[0], static_cast<uint64_t>(want));
  }
  {  // gather_ptrs: pointers stored in device memory
    const int n = 1000;
    std::vector<int> values(n);
    for (int i = 0; i < n; ++i) values[i] = i * 7 + 1;
    Allocation data = allocate(0, n * 4), ptrs = allocate(0, n * 8), out = allocate(0, n * 4);
    upload(s, data.va, as_bytes(values));
    std::vector<uint64_t> pointers(n);
    for (int i = 0; i < n; ++i) pointers[i] = data.va + 4 * ((i * 5) % n);
    upload(s, ptrs.va, as_bytes(pointers));
    run(names::kGatherPtrs, blocks(n, 256), Dim3{256, 1, 1}, ptrs.va, n, out.va);
    auto got = from_bytes<int>(download(s, out.va, n * 4));
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], values[(i * 5) % n]) << "gather_ptrs " << i;
  }
  {  // write_value
    Allocation out = allocate(0, 64);
    run(names::kWriteValue, Dim3{1, 1, 1}, Dim3{1, 1, 1}, out.va + 12, 42);
    EXPECT_EQ(from_bytes<int>(download(s, out.va + 12, 4))[0], 42);
  }
  {  // scale<float> and scale<double>
    const unsigned n = 1000;
    auto x = integers(n, 5);
    std::vector<double> d(n);
    for (unsigned i = 0; i < n; ++i) d[i] = x[i];
    Allocation fx = allocate(0, n * 4), dx = allocate(0, n * 8);
    upload(s, fx.va, as_bytes(x));
    upload(s, dx.va, as_bytes(d));
    run(names::kScaleFloat, blocks(n, 64), Dim3{64, 1, 1}, fx.va, 2.5f, n);
    run(names::kScaleDouble, blocks(n, 64), Dim3{64, 1, 1}, dx.va, -0.5, n - 1);
    auto gf = from_bytes<float>(download(s, fx.va, n * 4));
    auto gd = from_bytes<double>(download(s, dx.va, n * 8));
    for (unsigned i = 0; i < n; ++i) {
      ASSERT_EQ(gf[i], x[i] * 2.5f) << "scale<float> " << i;
      ASSERT_EQ(gd[i], i < n - 1 ? d[i] * -0.5 : d[i]) << "scale<double> " << i;
    }
  }
  {  // fill_bytes_c (extern "C")
    const uint64_t n = 3000;
    Allocation out = allocate(0, 4096);
    HIBER_ASSERT_OK(device_->memset(s, out.va, 0, 1, 4096));
    run(names::kFillBytesC, blocks(n, 512), Dim3{512, 1, 1}, out.va,
        static_cast<unsigned char>(0xab), n);
    Bytes want(4096, std::byte{0});
    std::fill_n(want.begin(), n, std::byte{0xab});
    EXPECT_TRUE(same_bytes(download(s, out.va, 4096), want));
  }
  run(names::kNoop, Dim3{7, 1, 1}, Dim3{33, 1, 1});
}

TEST_P(DeviceContractTest, LaunchChecksParametersAndDimensions) {
  SKIP_WITHOUT_KERNELS();
  Module module = load_test_kernels();
  Stream s = make_stream(0);
  Allocation out = allocate(0, 64);
  Function f = function(module, names::kWriteValue);
  HIBER_ASSERT_OK_AND_ASSIGN(KernelInfo info, device_->function_info(f));
  KernelParams params(info);
  params.add(out.va).add(7);
  const LaunchConfig one{{1, 1, 1}, {1, 1, 1}, 0};
  std::vector<std::byte> short_params(params.bytes().begin(), params.bytes().end() - 1);
  std::vector<std::byte> long_params(params.bytes().begin(), params.bytes().end());
  long_params.resize(long_params.size() + 8);
  HIBER_EXPECT_CODE(device_->launch(s, f, one, short_params), ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->launch(s, f, one, long_params), ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->launch(s, f, {{0, 1, 1}, {1, 1, 1}, 0}, params.bytes()),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->launch(s, f, {{1, 1, 1}, {0, 1, 1}, 0}, params.bytes()),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->launch(s, f, {{1, 1, 1}, {1025, 1, 1}, 0}, params.bytes()),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_CODE(device_->launch(s, f, {{1, 1, 1}, {64, 32, 1}, 0}, params.bytes()),
                    ErrorCode::kInvalidValue)
      << "2048 threads";
  HIBER_EXPECT_CODE(device_->launch(s, f, {{1, 1, 1}, {1, 1, 65}, 0}, params.bytes()),
                    ErrorCode::kInvalidValue);
  // None of the rejected launches ran; this one does.
  HIBER_ASSERT_OK(device_->memset(s, out.va, 0, 4, 1));
  HIBER_ASSERT_OK(device_->launch(s, f, {{1, 1, 1}, {32, 32, 1}, 0}, params.bytes()));
  EXPECT_EQ(from_bytes<int>(download(s, out.va, 4))[0], 7);
}

TEST_P(DeviceContractTest, LaunchMayUseSharedMemoryUpToTheOptInLimit) {
  SKIP_WITHOUT_KERNELS();
  constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;  // CU_DEVICE_ATTRIBUTE_..._OPTIN
  const DeviceProperties& p = device_->properties(0);
  const auto by_default = static_cast<uint32_t>(p.attribute(kAttrMaxSharedMemoryPerBlock));
  const auto opt_in = static_cast<uint32_t>(p.attribute(kAttrMaxSharedMemoryPerBlockOptin));
  if (opt_in <= by_default) GTEST_SKIP() << "GPU 0 has no shared memory beyond the default";
  Module module = load_test_kernels();
  Stream s = make_stream(0);
  Function noop = function(module, names::kNoop);
  // Beyond the default a kernel must opt in on a real GPU; the device does that for the caller.
  for (uint32_t bytes : {by_default, by_default + 1, opt_in, by_default + 1}) {
    HIBER_EXPECT_OK(device_->launch(s, noop, {{2, 1, 1}, {32, 1, 1}, bytes}, {})) << bytes;
  }
  HIBER_EXPECT_CODE(device_->launch(s, noop, {{1, 1, 1}, {32, 1, 1}, opt_in + 1}, {}),
                    ErrorCode::kInvalidValue);
  HIBER_EXPECT_OK(device_->synchronize_stream(s));
}

// ---- Pools ----

// ---- Contexts ----

// A kernel that faults (here: a write to a reserved range with nothing mapped) ends its own
// context, for good, and no other: another context on the same GPU and the GPU's shared context
// compute on, and a context made after the fault works (device.h, "Contexts"). On a GPU this is
// the isolation check of docs/gpu-runs.md.
TEST_P(DeviceContractTest, AFaultEndsItsOwnContextAndNoOther) {
  SKIP_WITHOUT_KERNELS();
  Module module = load_test_kernels();
  Function write = function(module, names::kWriteValue);
  HIBER_ASSERT_OK_AND_ASSIGN(KernelInfo info, device_->function_info(write));
  const WriteValue launch_write{*device_, write, info};
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr hole, device_->reserve_address_range(g, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(Context faulty, device_->create_context(0));
  HIBER_ASSERT_OK_AND_ASSIGN(Context healthy, device_->create_context(0));
  EXPECT_EQ(faulty.gpu, 0);
  EXPECT_NE(faulty.id, healthy.id);
  EXPECT_NE(faulty, device_->shared_context(0));
  HIBER_ASSERT_OK_AND_ASSIGN(Stream bad, device_->create_stream(faulty, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(Stream good, device_->create_stream(healthy, 0));
  Stream shared = make_stream(0);

  // Refused at once or at the synchronisation, as the backend can tell; sticky either way.
  Status launched = launch_write(bad, hole, 7);
  if (launched.ok()) launched = device_->synchronize_stream(bad);
  HIBER_EXPECT_CODE(launched, ErrorCode::kIllegalAddress);
  HIBER_EXPECT_CODE(device_->synchronize_stream(bad), ErrorCode::kIllegalAddress) << "sticky";
  HIBER_EXPECT_CODE(device_->context_status(faulty), ErrorCode::kIllegalAddress);

  Allocation out = allocate(0, 64);
  int value = 40;
  for (Stream s : {good, shared}) {
    HIBER_ASSERT_OK(launch_write(s, out.va, ++value));
    EXPECT_EQ(from_bytes<int>(download(s, out.va, 4))[0], value);
  }
  HIBER_EXPECT_OK(device_->context_status(healthy));
  HIBER_EXPECT_OK(device_->context_status(device_->shared_context(0)));

  HIBER_EXPECT_CODE(device_->destroy_context(device_->shared_context(0)), ErrorCode::kInvalidValue);
  HIBER_EXPECT_OK(device_->destroy_stream(bad)) << "cleaning up after a fault works";
  HIBER_EXPECT_OK(device_->destroy_context(faulty));
  HIBER_EXPECT_CODE(device_->context_status(faulty), ErrorCode::kInvalidContext);
  HIBER_ASSERT_OK_AND_ASSIGN(Context fresh, device_->create_context(0));
  HIBER_ASSERT_OK_AND_ASSIGN(Stream again, device_->create_stream(fresh, 0));
  HIBER_ASSERT_OK(launch_write(again, out.va, 99));
  EXPECT_EQ(from_bytes<int>(download(again, out.va, 4))[0], 99);

  for (Stream s : {good, again}) HIBER_EXPECT_OK(device_->destroy_stream(s));
  for (Context c : {healthy, fresh}) HIBER_EXPECT_OK(device_->destroy_context(c));
  HIBER_EXPECT_OK(device_->free_address_range(hole, g));
}

// Shared mode's recovery (hiberd --isolation=shared): a fault ends the GPU's shared context for
// every stream in it, and resetting the context starts it afresh, with the device's memory,
// mappings and modules as they were. Streams of the old context are forgotten, never passed
// again (on CUDA their values may name new streams).
TEST_P(DeviceContractTest, ResettingTheSharedContextEndsItsFaultAndKeepsMemory) {
  SKIP_WITHOUT_KERNELS();
  Module module = load_test_kernels();
  Function write = function(module, names::kWriteValue);
  HIBER_ASSERT_OK_AND_ASSIGN(KernelInfo info, device_->function_info(write));
  const WriteValue launch_write{*device_, write, info};
  const uint64_t g = device_->allocation_granularity(0);
  HIBER_ASSERT_OK_AND_ASSIGN(DevicePtr hole, device_->reserve_address_range(g, 0));
  Allocation out = allocate(0, 64);
  HIBER_ASSERT_OK_AND_ASSIGN(Stream before, device_->create_stream(device_->shared_context(0), 0));
  HIBER_ASSERT_OK(launch_write(before, out.va, 5));
  HIBER_ASSERT_OK(device_->synchronize_stream(before));

  Status launched = launch_write(before, hole, 7);
  if (launched.ok()) launched = device_->synchronize_stream(before);
  HIBER_EXPECT_CODE(launched, ErrorCode::kIllegalAddress);
  HIBER_EXPECT_CODE(device_->context_status(device_->shared_context(0)),
                    ErrorCode::kIllegalAddress);
  // Another GPU's shared context is not touched.
  if (device_->gpu_count() > 1) {
    HIBER_EXPECT_OK(device_->context_status(device_->shared_context(1)));
  }

  HIBER_ASSERT_OK(device_->reset_shared_context(0));
  const Context fresh = device_->shared_context(0);
  HIBER_EXPECT_OK(device_->context_status(fresh));
  HIBER_ASSERT_OK_AND_ASSIGN(Stream after, device_->create_stream(fresh, 0));
  EXPECT_EQ(from_bytes<int>(download(after, out.va, 4))[0], 5) << "the memory stayed";
  HIBER_ASSERT_OK(launch_write(after, out.va, 6)) << "the module and the mapping stayed";
  EXPECT_EQ(from_bytes<int>(download(after, out.va, 4))[0], 6);
  HIBER_EXPECT_OK(device_->destroy_stream(after));
  HIBER_EXPECT_OK(device_->free_address_range(hole, g));
  HIBER_EXPECT_CODE(device_->reset_shared_context(device_->gpu_count()), ErrorCode::kInvalidDevice);
}

// Events are recorded in their own context, and waited for from any.
TEST_P(DeviceContractTest, EventsOrderWorkAcrossContexts) {
  HIBER_ASSERT_OK_AND_ASSIGN(Context a, device_->create_context(0));
  HIBER_ASSERT_OK_AND_ASSIGN(Context b, device_->create_context(0));
  HIBER_ASSERT_OK_AND_ASSIGN(Stream sa, device_->create_stream(a, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(Stream sb, device_->create_stream(b, 0));
  HIBER_ASSERT_OK_AND_ASSIGN(Event ea, device_->create_event(a, true));
  HIBER_EXPECT_CODE(device_->record_event(ea, sb), ErrorCode::kInvalidHandle);
  Allocation buf = allocate(0, 1 << 20);
  const Bytes data = random_bytes(1 << 20, 3);
  HIBER_ASSERT_OK(device_->copy_host_to_device(sa, buf.va, data.data(), data.size()));
  HIBER_ASSERT_OK(device_->record_event(ea, sa));
  HIBER_ASSERT_OK(device_->wait_event(sb, ea));
  Bytes back(data.size());
  HIBER_ASSERT_OK(device_->copy_device_to_host(sb, back.data(), buf.va, back.size()));
  HIBER_ASSERT_OK(device_->synchronize_stream(sb));
  EXPECT_TRUE(same_bytes(back, data));
  HIBER_EXPECT_OK(device_->synchronize_stream(sa));
  HIBER_EXPECT_OK(device_->destroy_event(ea));
  for (Stream s : {sa, sb}) HIBER_EXPECT_OK(device_->destroy_stream(s));
  for (Context c : {a, b}) HIBER_EXPECT_OK(device_->destroy_context(c));
}

TEST_P(DeviceContractTest, ReservePoolCarvesChunksAndKeepsTheReserve) {
  const uint64_t g = device_->allocation_granularity(0);
  const uint64_t chunk = 4 * g;
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo info, device_->memory_info(0));
  // Leave room for three and a half chunks; the chunk size is rounded up to the granularity.
  const uint64_t reserve = info.free_bytes - 3 * chunk - chunk / 2;
  HIBER_ASSERT_OK_AND_ASSIGN(auto chunks, reserve_pool(*device_, 0, reserve, chunk - 1));
  EXPECT_GE(chunks.size(), 2u);
  EXPECT_LE(chunks.size(), 3u);
  for (const PhysicalMemory& m : chunks) {
    EXPECT_EQ(m.gpu, 0);
    EXPECT_EQ(m.bytes, chunk);
  }
  HIBER_ASSERT_OK_AND_ASSIGN(MemoryInfo after, device_->memory_info(0));
  EXPECT_GE(after.free_bytes + chunk, reserve) << "the pool stops before eating the reserve";
  for (const PhysicalMemory& m : chunks) HIBER_EXPECT_OK(device_->release_physical(m));

  HIBER_ASSERT_OK_AND_ASSIGN(auto none, reserve_pool(*device_, 0, info.total_bytes, chunk));
  EXPECT_TRUE(none.empty());
  HIBER_EXPECT_CODE(reserve_pool(*device_, 0, 0, 0), ErrorCode::kInvalidValue);
}

}  // namespace hiber::device::testing
