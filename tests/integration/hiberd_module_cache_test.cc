// hiberd's module cache end to end: two clients of one hiberd, the second loading the first's
// fatbin by its SHA-256 (moduleLoadCached) without shipping it, and running vec_add from it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "server/module_cache.h"
#include "tests/integration/hiberd_harness.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;
using Bytes = std::vector<std::byte>;

constexpr const char* kVecAdd = "_Z7vec_addPKfS0_Pfi";

// The failed calls hiberd counts for the session of `function_id`.
uint64_t failed_calls(const StatusView& view, const std::string& function_id) {
  for (const SessionView& s : view.sessions)
    if (s.function_id == function_id) return s.failed_calls;
  ADD_FAILURE() << "no session of " << function_id;
  return 0;
}

// Checks of a Status that print it.
#define EXPECT_OK(expr)                          \
  do {                                           \
    const ::hiber::Status s_ = (expr);           \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)
#define ASSERT_OK(expr)                          \
  do {                                           \
    const ::hiber::Status s_ = (expr);           \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)
#define EXPECT_CODE(expr, expected)                          \
  do {                                                       \
    const ::hiber::Status s_ = (expr);                       \
    EXPECT_EQ(s_.code(), (expected)) << #expr << ": " << s_; \
  } while (0)

// One client of the test hiberd, with just what these tests need.
class Client {
 public:
  Client(const Hiberd& hiberd, const std::string& function_id) {
    auto c = hiberd.connect(function_id);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) c_ = std::move(c).value();
  }
  bool connected() const { return c_ != nullptr; }
  void disconnect() { c_.reset(); }
  wire::CallClient& calls() { return *c_; }
  const wire::Grant& grant() const { return c_->session().grant; }

  template <typename Fill>
  Status call(Fill&& fill) {
    return c_->call(std::forward<Fill>(fill)).status();
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
  // moduleLoad: ships the image through the arena.
  Status load(uint64_t module, const Bytes& image) {
    auto staged = c_->stage(image.size());
    if (!staged.ok()) return staged.status();
    std::memcpy(staged->bytes.data(), image.data(), image.size());
    return call([&](proto::Call::Builder c) {
      auto m = c.initModuleLoad();
      m.setModule(module);
      m.setImageOffset(staged->offset);
      m.setImageBytes(image.size());
      m.setStagingEnd(staged->staging_end);
    });
  }
  // moduleLoadCached: names the image by its hash only.
  Status load_cached(uint64_t module, std::span<const std::byte> sha256) {
    return call([&](proto::Call::Builder c) {
      auto m = c.initModuleLoadCached();
      m.setModule(module);
      m.setSha256(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(sha256.data()), sha256.size()));
    });
  }
  Status unload(uint64_t module) {
    return call([&](proto::Call::Builder c) { c.initModuleUnload().setModule(module); });
  }

  // Allocates three vectors of n floats, then gets vec_add from `module` as `function`.
  void prepare_vec_add(uint64_t module, uint64_t function, uint32_t n) {
    n_ = n;
    const uint64_t g = grant().allocation_granularity;
    const uint64_t span = (n * sizeof(float) + g - 1) / g * g;
    a_ = grant().va_base;
    b_ = a_ + span;
    out_ = b_ + span;
    for (uint64_t va : {a_, b_, out_}) EXPECT_OK(allocate(va, n * sizeof(float)));
    auto info = c_->call([&](proto::Call::Builder c) {
      auto f = c.initFunctionGet();
      f.setFunction(function);
      f.setModule(module);
      f.setName(kVecAdd);
    });
    ASSERT_TRUE(info.ok()) << info.status();
    const KernelInfo* kernel = std::get_if<KernelInfo>(&*info);
    ASSERT_NE(kernel, nullptr);
    ASSERT_EQ(kernel->params.size(), 4u);
    kernel_ = *kernel;
    function_ = function;
  }

  // Runs vec_add on fresh random inputs and checks the result against the host's sums.
  void check_vec_add(uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> ha(n_), hb(n_), result(n_);
    for (uint32_t i = 0; i < n_; ++i) {
      ha[i] = static_cast<float>(rng() % 1000) / 8;
      hb[i] = static_cast<float>(rng() % 1000) / 4;
    }
    ASSERT_OK(upload(a_, ha.data(), n_ * sizeof(float)));
    ASSERT_OK(upload(b_, hb.data(), n_ * sizeof(float)));
    std::vector<std::byte> params(kernel_.param_bytes());
    std::memcpy(params.data() + kernel_.params[0].offset, &a_, 8);
    std::memcpy(params.data() + kernel_.params[1].offset, &b_, 8);
    std::memcpy(params.data() + kernel_.params[2].offset, &out_, 8);
    std::memcpy(params.data() + kernel_.params[3].offset, &n_, 4);
    ASSERT_OK(call([&](proto::Call::Builder c) {
      auto l = c.initLaunchKernel();
      l.setFunction(function_);
      l.setGridX((n_ + 255) / 256);
      l.setGridY(1);
      l.setGridZ(1);
      l.setBlockX(256);
      l.setBlockY(1);
      l.setBlockZ(1);
      l.setParams(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(params.data()), params.size()));
    }));
    ASSERT_OK(download(result.data(), out_, n_ * sizeof(float)));
    for (uint32_t i = 0; i < n_; ++i) {
      ASSERT_EQ(result[i], ha[i] + hb[i]) << "vec_add[" << i << "]";
    }
  }

 private:
  std::unique_ptr<wire::CallClient> c_;
  uint64_t a_ = 0, b_ = 0, out_ = 0, function_ = 0;
  uint32_t n_ = 0;
  KernelInfo kernel_;
};

TEST(ModuleCache, ASecondClientLoadsAFatbinByItsHash) {
  if (kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no fatbin";
  const Bytes fatbin = read_bytes(kernels_fatbin_path());
  ASSERT_FALSE(fatbin.empty());
  const server::Sha256 digest = server::sha256(fatbin);

  Hiberd hiberd;
  Client a(hiberd, "cache-a");
  Client b(hiberd, "cache-b");
  ASSERT_TRUE(a.connected() && b.connected());

  // Before anyone shipped it, hiberd does not know the hash; B's session keeps working.
  EXPECT_CODE(b.load_cached(5, digest), ErrorCode::kNotFound);

  ASSERT_OK(a.load(1, fatbin));
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 1u);
  EXPECT_EQ(view->cached_module_bytes, fatbin.size());
  EXPECT_EQ(view->module_cache_misses, 1u);
  EXPECT_EQ(view->module_cache_hits, 0u);
  EXPECT_EQ(view->module_cache_unknown_hashes, 1u);
  // A miss asks for the image; it is no failed call of B's session (issue 18, item 12).
  EXPECT_EQ(failed_calls(*view, "cache-b"), 0u);

  // B names it by hash: no bytes travel, nothing new is loaded.
  ASSERT_OK(b.load_cached(5, digest));
  view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 1u);
  EXPECT_EQ(view->module_cache_hits, 1u);
  EXPECT_EQ(view->module_cache_misses, 1u);

  // The handle checks of moduleLoad, and a hash of the wrong length.
  EXPECT_CODE(b.load_cached(5, digest), ErrorCode::kInvalidValue);  // in use
  EXPECT_CODE(b.load_cached(0, digest), ErrorCode::kInvalidValue);  // reserved
  EXPECT_CODE(b.load_cached(6, std::span(digest).first(31)), ErrorCode::kInvalidValue);
  EXPECT_CODE(b.load_cached(6, {}), ErrorCode::kInvalidValue);
  view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(failed_calls(*view, "cache-b"), 4u);  // refused calls are failures
  // A hash hiberd holds no image of.
  server::Sha256 unknown = digest;
  unknown[0] ^= std::byte{1};
  Status missing = b.load_cached(6, unknown);
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("moduleLoad"), std::string::npos) << missing;

  // B runs vec_add from the module it never shipped; so does A from its own.
  constexpr uint32_t kN = 4096;
  ASSERT_NO_FATAL_FAILURE(b.prepare_vec_add(5, 50, kN));
  ASSERT_NO_FATAL_FAILURE(b.check_vec_add(1));
  ASSERT_NO_FATAL_FAILURE(a.prepare_vec_add(1, 10, kN));
  ASSERT_NO_FATAL_FAILURE(a.check_vec_add(2));

  // A goes away: its session releases its reference, and B's module stays loaded and usable.
  a.disconnect();
  view = hiberd.wait_for([](const StatusView& v) { return v.sessions_closed == 1; }, 10s);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->sessions_closed, 1u);
  EXPECT_EQ(view->cached_modules, 1u);
  ASSERT_NO_FATAL_FAILURE(b.check_vec_add(3));

  // B unloads the last reference: the image goes, and must be shipped again.
  ASSERT_OK(b.unload(5));
  view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 0u);
  EXPECT_EQ(view->cached_module_bytes, 0u);
  EXPECT_CODE(b.load_cached(7, digest), ErrorCode::kNotFound);
  ASSERT_OK(b.load(7, fatbin));
  ASSERT_OK(b.load_cached(8, digest));  // a second handle in one session shares it too
  view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 1u);
  EXPECT_EQ(view->module_cache_misses, 2u);
  EXPECT_EQ(view->module_cache_hits, 2u);
  EXPECT_EQ(view->module_cache_unknown_hashes, 3u);
  // The session took every refused call in its stride.
  (void)b.calls().take_error();
  EXPECT_OK(b.calls().ping());

  // B exits holding two references: the image is unloaded with its session.
  b.disconnect();
  view = hiberd.wait_for([](const StatusView& v) { return v.sessions_closed == 2; }, 10s);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 0u);
  // A clean exit: nothing leaked or raced (the sanitizers fail the exit status otherwise).
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// Without the toolkit: a tiny PTX image shows the same sharing (no launch: the simulator has no
// host implementation for it).
TEST(ModuleCache, PtxImagesAreSharedAcrossSessions) {
  const std::string ptx =
      ".version 8.0\n.target sm_80\n.address_size 64\n"
      ".visible .entry cache_probe(.param .u64 p) { ret; }\n";
  Bytes image(ptx.size());
  std::memcpy(image.data(), ptx.data(), ptx.size());
  Hiberd hiberd;
  Client a(hiberd, "ptx-a");
  Client b(hiberd, "ptx-b");
  ASSERT_TRUE(a.connected() && b.connected());
  ASSERT_OK(a.load(1, image));
  ASSERT_OK(b.load(1, image));  // the same bytes shipped again: a hit, not a second load
  ASSERT_OK(b.load_cached(2, server::sha256(image)));
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 1u);
  EXPECT_EQ(view->module_cache_misses, 1u);
  EXPECT_EQ(view->module_cache_hits, 2u);
  // functionGet through each handle.
  for (uint64_t module : {1, 2}) {
    EXPECT_OK(b.call([&](proto::Call::Builder c) {
      auto f = c.initFunctionGet();
      f.setFunction(module);
      f.setModule(module);
      f.setName("cache_probe");
    }));
  }
  // Unloading one handle leaves the other's functions working.
  ASSERT_OK(b.unload(1));
  EXPECT_CODE(b.call([](proto::Call::Builder c) {
    auto f = c.initFunctionGet();
    f.setFunction(3);
    f.setModule(1);
    f.setName("cache_probe");
  }),
              ErrorCode::kInvalidHandle);
  EXPECT_OK(b.call([](proto::Call::Builder c) {
    auto f = c.initFunctionGet();
    f.setFunction(3);
    f.setModule(2);
    f.setName("cache_probe");
  }));
  ASSERT_OK(a.unload(1));
  ASSERT_OK(b.unload(2));
  view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_modules, 0u);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// A PTX image of about `bytes` with one kernel, `name`: distinct names make distinct images.
Bytes padded_ptx(const std::string& name, size_t bytes) {
  std::string text = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry " + name +
                     "(.param .u64 " + name + "_p) { ret; }\n";
  text.resize(bytes, ' ');
  Bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// Code images are bounded per session and per node: a load past either bound fails with the
// flag's name, and unloading gives the budget back.
TEST(ModuleBudget, LoadsPastTheSessionOrNodeBoundFailUntilModulesAreUnloaded) {
  Hiberd hiberd({"--session_max_module_mib=2", "--max_module_mib=3"});
  constexpr size_t kImage = 900 << 10;  // three fit a node, two a session
  std::vector<Bytes> images;
  for (int i = 0; i < 5; ++i) images.push_back(padded_ptx("k_budget_" + std::to_string(i), kImage));
  Client a(hiberd, "budget-a");
  Client b(hiberd, "budget-b");
  ASSERT_TRUE(a.connected() && b.connected());
  ASSERT_OK(a.load(1, images[0]));
  ASSERT_OK(a.load(2, images[1]));
  const Status session_full = a.load(3, images[2]);
  EXPECT_EQ(session_full.code(), ErrorCode::kOutOfMemory) << session_full;
  EXPECT_NE(session_full.message().find("--session_max_module_mib"), std::string::npos)
      << session_full;
  (void)a.calls().take_error();
  ASSERT_OK(b.load(1, images[2]));
  const Status node_full = b.load(2, images[3]);
  EXPECT_EQ(node_full.code(), ErrorCode::kOutOfMemory) << node_full;
  EXPECT_NE(node_full.message().find("--max_module_mib"), std::string::npos) << node_full;
  (void)b.calls().take_error();
  // Unloading frees both budgets: the node's (the image had no other user) and the session's.
  ASSERT_OK(a.unload(2));
  EXPECT_OK(b.load(2, images[3]));
  const server::Sha256 digest = server::sha256(images[2]);
  EXPECT_OK(a.load_cached(3, digest));  // loaded already: only the session's budget counts
  EXPECT_CODE(a.load(4, images[4]), ErrorCode::kOutOfMemory);
  (void)a.calls().take_error();
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->cached_module_bytes, 3 * kImage);
}

}  // namespace
}  // namespace hiber::testing
