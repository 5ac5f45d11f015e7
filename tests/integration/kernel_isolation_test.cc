// Issue 18, item 9, end to end: a kernel that hiberd runs for one session reaches no other
// session's memory on the simulated device. Two clients hold leases at once (on two GPUs, so
// both functions' blocks are mapped); X names V's live block in a kernel argument and in a
// pointer stored in its own memory, and each launch fails with an illegal address while V's
// bytes stay as V wrote them.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/hiberd_harness.h"
#include "tests/kernels/test_kernels.h"

namespace hiber::testing {
namespace {

namespace proto = wire::proto;
using Bytes = std::vector<std::byte>;

// One session, with the calls these tests make, each waited for.
class Client {
 public:
  Client(const Hiberd& hiberd, const std::string& function_id) {
    auto c = hiberd.connect(function_id);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) c_ = std::move(c).value();
  }
  bool connected() const { return c_ != nullptr; }
  const wire::Grant& grant() const { return c_->session().grant; }

  template <typename Fill>
  Status call(Fill&& fill) {
    return c_->call(std::forward<Fill>(fill), /*sticky=*/false).status();
  }
  Status allocate(uint64_t va, uint64_t bytes) {
    return call([&](proto::Call::Builder c) {
      auto a = c.initMemAllocate();
      a.setVa(va);
      a.setBytes(bytes);
    });
  }
  Status upload(uint64_t dst, const void* src, uint64_t bytes) {
    auto staged = c_->stage(bytes);
    if (!staged.ok()) return staged.status();
    std::memcpy(staged->bytes.data(), src, bytes);
    return call([&](proto::Call::Builder c) {
      auto m = c.initMemcpyHtoD();
      m.setDst(dst);
      m.setSrcOffset(staged->offset);
      m.setBytes(bytes);
      m.setStagingEnd(staged->staging_end);
    });
  }
  Status download(void* dst, uint64_t src, uint64_t bytes) {
    auto staged = c_->stage(bytes);
    if (!staged.ok()) return staged.status();
    HIBER_RETURN_IF_ERROR(call([&](proto::Call::Builder c) {
      auto m = c.initMemcpyDtoH();
      m.setDstOffset(staged->offset);
      m.setSrc(src);
      m.setBytes(bytes);
      m.setStagingEnd(staged->staging_end);
    }));
    std::memcpy(dst, staged->bytes.data(), bytes);
    return Status();
  }
  // Loads the test kernels' fatbin as module 1 and gets `kernel` as function `function`.
  Status get(uint64_t function, const std::string& kernel, const Bytes& image) {
    if (!loaded_) {
      auto staged = c_->stage(image.size());
      if (!staged.ok()) return staged.status();
      std::memcpy(staged->bytes.data(), image.data(), image.size());
      HIBER_RETURN_IF_ERROR(call([&](proto::Call::Builder c) {
        auto m = c.initModuleLoad();
        m.setModule(1);
        m.setImageOffset(staged->offset);
        m.setImageBytes(image.size());
        m.setStagingEnd(staged->staging_end);
      }));
      loaded_ = true;
    }
    return call([&](proto::Call::Builder c) {
      auto f = c.initFunctionGet();
      f.setFunction(function);
      f.setModule(1);
      f.setName(kernel);
    });
  }
  // Runs one thread of `function` with packed `params`; the status is the kernel's.
  Status launch(uint64_t function, const Bytes& params, uint32_t threads = 1) {
    return call([&](proto::Call::Builder c) {
      auto l = c.initLaunchKernel();
      l.setFunction(function);
      l.setGridX(1);
      l.setGridY(1);
      l.setGridZ(1);
      l.setBlockX(threads);
      l.setBlockY(1);
      l.setBlockZ(1);
      l.setParams(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(params.data()), params.size()));
    });
  }

 private:
  std::unique_ptr<wire::CallClient> c_;
  bool loaded_ = false;
};

// write_value(int* p, int v), gather_ptrs(int* const* ptrs, int n, int* out) and
// scatter_value(int* const* ptrs, int n, int v), packed as test_kernels.h lays them out.
Bytes write_value_params(uint64_t p, int v) {
  Bytes out(12);
  std::memcpy(out.data(), &p, 8);
  std::memcpy(out.data() + 8, &v, 4);
  return out;
}
Bytes gather_params(uint64_t ptrs, int n, uint64_t dst) {
  Bytes out(24);
  std::memcpy(out.data(), &ptrs, 8);
  std::memcpy(out.data() + 8, &n, 4);
  std::memcpy(out.data() + 16, &dst, 8);
  return out;
}
Bytes scatter_params(uint64_t ptrs, int n, int v) {
  Bytes out(16);
  std::memcpy(out.data(), &ptrs, 8);
  std::memcpy(out.data() + 8, &n, 4);
  std::memcpy(out.data() + 12, &v, 4);
  return out;
}

void expect_illegal_address(const Status& status, uint64_t named) {
  EXPECT_EQ(status.code(), ErrorCode::kIllegalAddress) << status;
  EXPECT_NE(status.message().find(str_cat("0x", std::hex, named)), std::string::npos) << status;
  EXPECT_NE(status.message().find("not memory of the caller's own blocks"), std::string::npos)
      << status;
}

constexpr uint64_t kWriteValue = 1, kGather = 2, kScatter = 3;

// One attacker: a function with two blocks of its own (a table and an output) on another GPU.
struct Attacker {
  Attacker(const Hiberd& hiberd, const std::string& name, const Bytes& image) : c(hiberd, name) {
    if (!c.connected()) return;
    const uint64_t g = c.grant().allocation_granularity;
    table = c.grant().va_base;
    out = table + g;
    for (uint64_t va : {table, out}) EXPECT_TRUE(c.allocate(va, 4096).ok());
    EXPECT_TRUE(c.get(kWriteValue, test_kernels::kWriteValue, image).ok());
    EXPECT_TRUE(c.get(kScatter, test_kernels::kScatterValue, image).ok());
  }
  Client c;
  uint64_t table = 0, out = 0;
};

TEST(KernelIsolation, AKernelReachesNoOtherSessionsBlock) {
  if (kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no fatbin";
  const Bytes image = read_bytes(kernels_fatbin_path());
  ASSERT_FALSE(image.empty());
  // Leases stay while the test runs, so V's blocks stay mapped (for V's GPU) throughout.
  Hiberd hiberd({"--implicit_lease_idle_us=600000000"});
  Client victim(hiberd, "victim");
  ASSERT_TRUE(victim.connected());

  // V: a block of known data, and a pointer table in another block naming it.
  const uint64_t g = victim.grant().allocation_granularity;
  const uint64_t data = victim.grant().va_base, v_table = data + g, v_out = v_table + g;
  std::vector<int> written(1024);
  for (size_t i = 0; i < written.size(); ++i) written[i] = static_cast<int>(i * 31 + 7);
  const uint64_t bytes = written.size() * sizeof(int);
  for (uint64_t va : {data, v_table, v_out}) ASSERT_TRUE(victim.allocate(va, bytes).ok());
  ASSERT_TRUE(victim.upload(data, written.data(), bytes).ok());
  const uint64_t target = data + 40;  // written[10]
  ASSERT_TRUE(victim.upload(v_table, &target, sizeof(target)).ok());
  ASSERT_TRUE(victim.get(kGather, test_kernels::kGatherPtrs, image).ok());
  // V reaches its own block through its table: the block is mapped, V holds a lease.
  ASSERT_TRUE(victim.launch(kGather, gather_params(v_table, 1, v_out)).ok());
  int got = 0;
  ASSERT_TRUE(victim.download(&got, v_out, sizeof(got)).ok());
  ASSERT_EQ(got, written[10]);

  // X names V's address as an argument; Y stores it in its own memory, where the kernel loads
  // it from. Each first shows that its own pointers work, the same ways.
  Attacker x(hiberd, "thief-argument", image), y(hiberd, "thief-stored", image);
  ASSERT_TRUE(x.c.connected() && y.c.connected());
  ASSERT_TRUE(x.c.launch(kWriteValue, write_value_params(x.out, 42)).ok());
  ASSERT_TRUE(x.c.download(&got, x.out, sizeof(got)).ok());
  EXPECT_EQ(got, 42);
  ASSERT_TRUE(y.c.upload(y.table, &y.out, sizeof(y.out)).ok());
  ASSERT_TRUE(y.c.launch(kScatter, scatter_params(y.table, 1, 43)).ok());
  ASSERT_TRUE(y.c.download(&got, y.out, sizeof(got)).ok());
  EXPECT_EQ(got, 43);

  expect_illegal_address(x.c.launch(kWriteValue, write_value_params(target, 666)), target);
  ASSERT_TRUE(y.c.upload(y.table, &target, sizeof(target)).ok());
  expect_illegal_address(y.c.launch(kScatter, scatter_params(y.table, 1, 666)), target);
  // Sticky, as a fault in a CUDA context is: the attackers' later calls fail the same way.
  for (Attacker* a : {&x, &y})
    expect_illegal_address(a->c.download(&got, a->out, sizeof(got)), target);

  // V's bytes are as V wrote them, and V goes on working.
  std::vector<int> after(written.size());
  ASSERT_TRUE(victim.download(after.data(), data, bytes).ok());
  EXPECT_EQ(after, written);
  ASSERT_TRUE(victim.launch(kGather, gather_params(v_table, 1, v_out)).ok());
  ASSERT_TRUE(victim.download(&got, v_out, sizeof(got)).ok());
  EXPECT_EQ(got, written[10]);
}

// Issue 29: a fault ends the faulting instance's context, on its GPU, and nothing else there.
// On a one-GPU node V computes, X's kernel then writes to a hole in X's own range (reserved,
// nothing allocated there) and faults, and V computes again on the same GPU. X alone is failed,
// for good; V's memory is as it was and its next result is right. In context mode (the
// default) the fault ended X's own context only; in shared mode (--isolation=shared: every
// instance in the GPU's one context) it ended the GPU's shared context, which hiberd resets
// (`recovery` is the log line that says so) before the GPU takes V's request. `options` start
// hiberd on one GPU; on the simulated device the refusal's message is checked too.
void fault_next_to_a_neighbour(const HiberdOptions& options, const std::string& recovery) {
  if (kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no fatbin";
  const Bytes image = read_bytes(kernels_fatbin_path());
  const bool sim = options.device == "sim";
  auto expect_fault = [&](const Status& status, uint64_t named) {
    if (sim) return expect_illegal_address(status, named);
    EXPECT_EQ(status.code(), ErrorCode::kIllegalAddress) << status;
  };
  Hiberd hiberd(options);
  Client v(hiberd, "neighbour");
  Attacker x(hiberd, "faulter", image);
  ASSERT_TRUE(v.connected() && x.c.connected());
  const uint64_t v_out = v.grant().va_base;
  ASSERT_TRUE(v.allocate(v_out, 4096).ok());
  ASSERT_TRUE(v.get(kWriteValue, test_kernels::kWriteValue, image).ok());
  int got = 0;
  ASSERT_TRUE(v.launch(kWriteValue, write_value_params(v_out, 5)).ok());
  ASSERT_TRUE(v.download(&got, v_out, sizeof(got)).ok());
  ASSERT_EQ(got, 5);

  const uint64_t hole = x.c.grant().va_base + 8 * x.c.grant().allocation_granularity;
  const Status faulted = x.c.launch(kWriteValue, write_value_params(hole, 666));
  expect_fault(faulted, hole);
  expect_fault(x.c.download(&got, x.out, sizeof(got)), hole);  // sticky for X

  got = 0;
  ASSERT_TRUE(v.download(&got, v_out, sizeof(got)).ok());
  EXPECT_EQ(got, 5) << "V's memory is as V left it";
  const Status launched = v.launch(kWriteValue, write_value_params(v_out, 6));
  ASSERT_TRUE(launched.ok()) << launched;
  ASSERT_TRUE(v.download(&got, v_out, sizeof(got)).ok());
  EXPECT_EQ(got, 6);
  // And a function that connects now gets the GPU and runs there.
  Client late(hiberd, "late");
  ASSERT_TRUE(late.connected());
  const uint64_t out = late.grant().va_base;
  ASSERT_TRUE(late.allocate(out, 4096).ok());
  ASSERT_TRUE(late.get(kWriteValue, test_kernels::kWriteValue, image).ok());
  ASSERT_TRUE(late.launch(kWriteValue, write_value_params(out, 7)).ok());
  ASSERT_TRUE(late.download(&got, out, sizeof(got)).ok());
  EXPECT_EQ(got, 7);
  expect_fault(x.c.download(&got, x.out, sizeof(got)), hole);  // still sticky for X
  EXPECT_NE(hiberd.log().find("context is lost"), std::string::npos) << hiberd.log();
  if (!recovery.empty()) {
    EXPECT_NE(hiberd.log().find(recovery), std::string::npos) << hiberd.log();
  }
}

HiberdOptions one_simulated_gpu(const std::string& isolation) {
  HiberdOptions options;
  options.extra_flags = {"--node_config=" + one_gpu_node_config(16), "--isolation=" + isolation};
  return options;
}

TEST(KernelIsolation, AFaultEndsOnlyItsOwnInstanceOnAGpuInContextMode) {
  fault_next_to_a_neighbour(one_simulated_gpu("context"), /*recovery=*/"");
}

// In shared mode the fault ends the GPU's one context; hiberd resets it, and V, idle when X
// faulted, goes on with its memory intact.
TEST(KernelIsolation, AFaultInSharedModeResetsTheGpusContextAndTheNeighbourGoesOn) {
  fault_next_to_a_neighbour(one_simulated_gpu("shared"), "its shared context was reset");
}

// The context-mode check on a real GPU (ctest: kernel_isolation_cuda_test, label gpu; run by
// scripts/gpu-acceptance.sh): hiberd --device=cuda, X's write is a fault of the GPU's MMU in X's
// own CUDA context, and V's next request on the same GPU (GPU 0 on a one-GPU machine; on more,
// wherever the leases go) must be right. Skips where there is no NVIDIA device.
TEST(KernelIsolationOnCuda, AFaultEndsOnlyItsOwnInstance) {
  if (::access("/dev/nvidiactl", F_OK) != 0) GTEST_SKIP() << "no NVIDIA GPU here (/dev/nvidiactl)";
  HiberdOptions options;
  options.device = "cuda";
  options.extra_flags = {"--isolation=context"};
  fault_next_to_a_neighbour(options, /*recovery=*/"");
}

// The shared-mode check on a real GPU: X's fault ends the primary context, hiberd resets it
// (cuDevicePrimaryCtxReset), and V's memory (VMM allocations belong to no context) and next
// request are right.
TEST(KernelIsolationOnCuda, AFaultInSharedModeResetsTheGpusContext) {
  if (::access("/dev/nvidiactl", F_OK) != 0) GTEST_SKIP() << "no NVIDIA GPU here (/dev/nvidiactl)";
  HiberdOptions options;
  options.device = "cuda";
  options.extra_flags = {"--isolation=shared"};
  fault_next_to_a_neighbour(options, "its shared context was reset");
}

}  // namespace
}  // namespace hiber::testing
