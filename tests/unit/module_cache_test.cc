// The module cache (server/module_cache.h) on the simulated GPU: one load per image however
// many users and however concurrent, lookups by hash, and an unload when the last user goes.
//
// Images are small hand-written PTX modules, so these tests need no CUDA toolkit; where the
// toolkit built the test fatbin, it is used too.
#include "server/module_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "server/device/sim_device.h"
#include "tests/unit/device_contract.h"

namespace hiber::server {
namespace {

using Bytes = std::vector<std::byte>;
using device::Device;
using device::Module;

Bytes bytes_of(std::string_view text) {
  Bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// A PTX module with one kernel, `name`(u64, u32): distinct names make distinct images.
Bytes ptx_image(const std::string& name) {
  return bytes_of(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry " + name +
                  "(.param .u64 " + name + "_p, .param .u32 " + name + "_n) { ret; }\n");
}

Sha256 digest_of(std::string_view hex) {
  Sha256 d{};
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = static_cast<std::byte>(std::stoi(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  }
  return d;
}

// The simulated GPU, with every module load and unload counted, and loads slowed down on
// request so that concurrent callers really overlap.
class CountingDevice final : public Device {
 public:
  explicit CountingDevice(std::unique_ptr<device::SimDevice> sim) : sim_(std::move(sim)) {}

  std::atomic<int> loads{0};
  std::atomic<int> unloads{0};
  std::atomic<int> live{0};  // modules loaded and not unloaded
  std::chrono::milliseconds load_delay{0};

  Result<Module> load_module(std::span<const std::byte> image) override {
    if (load_delay.count() > 0) std::this_thread::sleep_for(load_delay);
    auto m = sim_->load_module(image);
    if (m.ok()) {
      ++loads;
      ++live;
    }
    return m;
  }
  Status unload_module(Module module) override {
    Status s = sim_->unload_module(module);
    if (s.ok()) {
      ++unloads;
      --live;
    }
    return s;
  }

  // Everything else goes straight to the simulator.
  std::string backend_name() const override { return sim_->backend_name(); }
  int gpu_count() const override { return sim_->gpu_count(); }
  const device::DeviceProperties& properties(int gpu) const override {
    return sim_->properties(gpu);
  }
  const NodeConfig& topology() const override { return sim_->topology(); }
  Result<device::MemoryInfo> memory_info(int gpu) override { return sim_->memory_info(gpu); }
  uint64_t allocation_granularity(int gpu) const override {
    return sim_->allocation_granularity(gpu);
  }
  bool can_access_peer(int gpu, int peer) const override {
    return sim_->can_access_peer(gpu, peer);
  }
  Result<device::DevicePtr> reserve_address_range(uint64_t bytes, uint64_t alignment) override {
    return sim_->reserve_address_range(bytes, alignment);
  }
  Status free_address_range(device::DevicePtr va, uint64_t bytes) override {
    return sim_->free_address_range(va, bytes);
  }
  Result<device::PhysicalMemory> create_physical(int gpu, uint64_t bytes) override {
    return sim_->create_physical(gpu, bytes);
  }
  Status release_physical(device::PhysicalMemory memory) override {
    return sim_->release_physical(memory);
  }
  Status map(device::DevicePtr va, uint64_t bytes, device::PhysicalMemory memory,
             uint64_t offset) override {
    return sim_->map(va, bytes, memory, offset);
  }
  Status unmap(device::DevicePtr va, uint64_t bytes) override { return sim_->unmap(va, bytes); }
  Status set_access(device::DevicePtr va, uint64_t bytes, std::span<const int> gpus) override {
    return sim_->set_access(va, bytes, gpus);
  }
  Status register_host_memory(void* ptr, uint64_t bytes) override {
    return sim_->register_host_memory(ptr, bytes);
  }
  Status unregister_host_memory(void* ptr) override { return sim_->unregister_host_memory(ptr); }
  device::Context shared_context(int gpu) const override { return sim_->shared_context(gpu); }
  Result<device::Context> create_context(int gpu) override { return sim_->create_context(gpu); }
  Status destroy_context(device::Context context) override {
    return sim_->destroy_context(context);
  }
  Status context_status(device::Context context) override { return sim_->context_status(context); }
  Status reset_shared_context(int gpu) override { return sim_->reset_shared_context(gpu); }
  using Device::create_event;
  using Device::create_stream;
  Result<device::Stream> create_stream(device::Context context, int priority) override {
    return sim_->create_stream(context, priority);
  }
  Status destroy_stream(device::Stream stream) override { return sim_->destroy_stream(stream); }
  Status synchronize_stream(device::Stream stream) override {
    return sim_->synchronize_stream(stream);
  }
  Status query_stream(device::Stream stream) override { return sim_->query_stream(stream); }
  Status add_callback(device::Stream stream, device::StreamCallback callback) override {
    return sim_->add_callback(stream, std::move(callback));
  }
  Status cancel_stream(device::Stream stream, const Status& why) override {
    return sim_->cancel_stream(stream, why);
  }
  Result<device::Event> create_event(device::Context context, bool disable_timing) override {
    return sim_->create_event(context, disable_timing);
  }
  Status destroy_event(device::Event event) override { return sim_->destroy_event(event); }
  Status record_event(device::Event event, device::Stream stream) override {
    return sim_->record_event(event, stream);
  }
  Status wait_event(device::Stream stream, device::Event event) override {
    return sim_->wait_event(stream, event);
  }
  Status synchronize_event(device::Event event) override { return sim_->synchronize_event(event); }
  Status query_event(device::Event event) override { return sim_->query_event(event); }
  Result<float> elapsed_ms(device::Event start, device::Event end) override {
    return sim_->elapsed_ms(start, end);
  }
  Status copy_host_to_device(device::Stream stream, device::DevicePtr dst, const void* src,
                             uint64_t bytes) override {
    return sim_->copy_host_to_device(stream, dst, src, bytes);
  }
  Status copy_device_to_host(device::Stream stream, void* dst, device::DevicePtr src,
                             uint64_t bytes) override {
    return sim_->copy_device_to_host(stream, dst, src, bytes);
  }
  Status copy_device_to_device(device::Stream stream, device::DevicePtr dst, device::DevicePtr src,
                               uint64_t bytes) override {
    return sim_->copy_device_to_device(stream, dst, src, bytes);
  }
  Status copy_peer(device::Stream stream, device::DevicePtr dst, int dst_gpu, device::DevicePtr src,
                   int src_gpu, uint64_t bytes) override {
    return sim_->copy_peer(stream, dst, dst_gpu, src, src_gpu, bytes);
  }
  Status memset(device::Stream stream, device::DevicePtr dst, uint32_t value, int element_bytes,
                uint64_t count) override {
    return sim_->memset(stream, dst, value, element_bytes, count);
  }
  Result<device::Function> get_function(Module module, const std::string& name) override {
    return sim_->get_function(module, name);
  }
  Result<KernelInfo> function_info(device::Function function) override {
    return sim_->function_info(function);
  }
  Status launch(device::Stream stream, device::Function function,
                const device::LaunchConfig& config, std::span<const std::byte> params) override {
    return sim_->launch(stream, function, config, params);
  }
  device::LibraryBackend* library(library_ops::Library library) override {
    return sim_->library(library);
  }

 private:
  std::unique_ptr<device::SimDevice> sim_;
};

class ModuleCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = device::SimDevice::create(device::SimDeviceOptions{});
    ASSERT_TRUE(sim.ok()) << sim.status();
    device_ = std::make_unique<CountingDevice>(std::move(sim).value());
    cache_ = std::make_unique<ModuleCache>(*device_, /*max_bytes=*/0);
  }
  void TearDown() override {
    if (cache_) {
      EXPECT_EQ(cache_->stats().references, 0u) << "a test leaked a reference";
    }
    cache_.reset();
    if (device_) {
      EXPECT_EQ(device_->live.load(), 0) << "a module outlived the cache";
    }
  }

  ModuleCache::Ref acquire(const Bytes& image) {
    auto ref = cache_->acquire_by_image(image);
    EXPECT_TRUE(ref.ok()) << ref.status();
    return ref.ok() ? *ref : ModuleCache::Ref{};
  }

  std::unique_ptr<CountingDevice> device_;
  std::unique_ptr<ModuleCache> cache_;
};

TEST(Sha256, MatchesTheStandardTestVectors) {
  // FIPS 180-2, appendix B.1, and the empty message.
  EXPECT_EQ(sha256(bytes_of("abc")),
            digest_of("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  EXPECT_EQ(to_hex(sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_F(ModuleCacheTest, TheSameImageTwiceIsLoadedOnce) {
  const Bytes image = ptx_image("k_once");
  ModuleCache::Ref a = acquire(image);
  ModuleCache::Ref b = acquire(Bytes(image));  // equal bytes elsewhere in memory
  EXPECT_EQ(a.module.id, b.module.id);
  EXPECT_EQ(a.sha256, sha256(image));
  EXPECT_EQ(device_->loads.load(), 1);
  ModuleCacheStats s = cache_->stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.image_bytes, image.size());
  EXPECT_EQ(s.references, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 1u);
  // Another image is another module.
  ModuleCache::Ref c = acquire(ptx_image("k_other"));
  EXPECT_NE(c.module.id, a.module.id);
  EXPECT_EQ(cache_->stats().entries, 2u);
  for (const auto& r : {a, b, c}) {
    HIBER_EXPECT_OK(cache_->release(r));
  }
}

TEST_F(ModuleCacheTest, ALoadedImageIsFoundByItsHash) {
  const Bytes image = ptx_image("k_hash");
  ModuleCache::Ref loaded = acquire(image);
  const Sha256 digest = sha256(image);
  auto found = cache_->acquire_by_hash(digest);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->module.id, loaded.module.id);
  EXPECT_EQ(device_->loads.load(), 1);
  EXPECT_EQ(cache_->stats().hits, 1u);
  // Both users share its functions.
  auto f1 = device_->get_function(loaded.module, "k_hash");
  auto f2 = device_->get_function(found->module, "k_hash");
  ASSERT_TRUE(f1.ok() && f2.ok()) << f1.status() << f2.status();
  EXPECT_EQ(f1->id, f2->id);
  HIBER_EXPECT_OK(cache_->release(loaded));
  HIBER_EXPECT_OK(cache_->release(*found));
}

TEST_F(ModuleCacheTest, AnUnknownHashIsNotFound) {
  ModuleCache::Ref held = acquire(ptx_image("k_held"));
  const Sha256 unknown = sha256(ptx_image("k_never_loaded"));
  auto missing = cache_->acquire_by_hash(unknown);
  HIBER_EXPECT_CODE(missing, ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find(to_hex(unknown)), std::string::npos)
      << missing.status();
  ModuleCacheStats s = cache_->stats();
  EXPECT_EQ(s.unknown_hashes, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.references, 1u);
  HIBER_EXPECT_OK(cache_->release(held));
}

TEST_F(ModuleCacheTest, TheLastReleaseUnloads) {
  const Bytes image = ptx_image("k_release");
  ModuleCache::Ref a = acquire(image);
  ModuleCache::Ref b = acquire(image);
  auto function = device_->get_function(a.module, "k_release");
  ASSERT_TRUE(function.ok()) << function.status();

  HIBER_EXPECT_OK(cache_->release(a));
  EXPECT_EQ(device_->unloads.load(), 0);
  // The other user's module and function still work.
  HIBER_EXPECT_OK(device_->get_function(b.module, "k_release"));
  HIBER_EXPECT_OK(device_->function_info(*function));

  HIBER_EXPECT_OK(cache_->release(b));
  EXPECT_EQ(device_->unloads.load(), 1);
  EXPECT_EQ(device_->live.load(), 0);
  HIBER_EXPECT_CODE(device_->get_function(b.module, "k_release"), ErrorCode::kInvalidHandle);
  HIBER_EXPECT_CODE(device_->function_info(*function), ErrorCode::kInvalidHandle);
  ModuleCacheStats s = cache_->stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.image_bytes, 0u);
  EXPECT_EQ(s.references, 0u);
  HIBER_EXPECT_CODE(cache_->acquire_by_hash(sha256(image)), ErrorCode::kNotFound);

  // Loading it again loads it again.
  ModuleCache::Ref again = acquire(image);
  EXPECT_EQ(device_->loads.load(), 2);
  EXPECT_EQ(cache_->stats().misses, 2u);
  HIBER_EXPECT_OK(cache_->release(again));
}

// The node's budget counts distinct images: a load past it fails and loads nothing, a second
// reference to a loaded image costs nothing, and the last release gives the bytes back.
TEST_F(ModuleCacheTest, LoadsPastTheBudgetFailUntilAnImageIsUnloaded) {
  const Bytes a = ptx_image("k_budget_a");
  const Bytes b = ptx_image("k_budget_b");
  const Bytes c = ptx_image("k_budget_c");
  cache_ = std::make_unique<ModuleCache>(*device_, a.size() + b.size());
  ModuleCache::Ref ra = acquire(a);
  EXPECT_EQ(ra.image_bytes, a.size());
  ModuleCache::Ref rb = acquire(b);
  auto over = cache_->acquire_by_image(c);
  EXPECT_EQ(over.status().code(), ErrorCode::kOutOfMemory) << over.status();
  EXPECT_NE(over.status().message().find("--max_module_mib"), std::string::npos) << over.status();
  EXPECT_EQ(device_->loads.load(), 2) << "a refused image must not be loaded";
  ModuleCache::Ref ra2 = acquire(a);  // already loaded: within the budget
  EXPECT_EQ(cache_->stats().image_bytes, a.size() + b.size());
  EXPECT_TRUE(cache_->release(rb).ok());
  ModuleCache::Ref rc = acquire(c);
  EXPECT_EQ(rc.image_bytes, c.size());
  for (const ModuleCache::Ref& r : {ra, ra2, rc}) EXPECT_TRUE(cache_->release(r).ok());
  EXPECT_EQ(cache_->stats().image_bytes, 0u);
}

TEST_F(ModuleCacheTest, AReferenceNotHeldIsRefused) {
  ModuleCache::Ref a = acquire(ptx_image("k_twice"));
  HIBER_EXPECT_OK(cache_->release(a));
  HIBER_EXPECT_CODE(cache_->release(a), ErrorCode::kInvalidHandle);
  HIBER_EXPECT_CODE(cache_->release(ModuleCache::Ref{}), ErrorCode::kInvalidHandle);
  EXPECT_EQ(device_->unloads.load(), 1);
}

TEST_F(ModuleCacheTest, AnImageThatDoesNotLoadIsNotKept) {
  const Bytes garbage = bytes_of("hello, world");
  HIBER_EXPECT_CODE(cache_->acquire_by_image(garbage), ErrorCode::kInvalidImage);
  HIBER_EXPECT_CODE(cache_->acquire_by_hash(sha256(garbage)), ErrorCode::kNotFound);
  ModuleCacheStats s = cache_->stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.misses, 0u);
  // A second try tries again rather than remembering the failure.
  HIBER_EXPECT_CODE(cache_->acquire_by_image(garbage), ErrorCode::kInvalidImage);
}

TEST_F(ModuleCacheTest, ConcurrentLoadsOfOneImageLoadItOnce) {
  constexpr int kThreads = 8;
  device_->load_delay = std::chrono::milliseconds(50);  // the first load is still running
  const Bytes image = ptx_image("k_concurrent");
  std::vector<ModuleCache::Ref> refs(kThreads);
  std::vector<Status> errors(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      // Half of them ask by hash: they wait for the load in progress, or find nothing yet.
      if (t % 2 == 1) {
        auto by_hash = cache_->acquire_by_hash(sha256(image));
        if (by_hash.ok()) {
          refs[t] = *by_hash;
          return;
        }
        errors[t] = by_hash.status();
      }
      auto ref = cache_->acquire_by_image(image);
      if (ref.ok()) {
        refs[t] = *ref;
      } else {
        errors[t] = ref.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(errors[t].ok() || errors[t].code() == ErrorCode::kNotFound) << errors[t];
    EXPECT_EQ(refs[t].module.id, refs[0].module.id) << "thread " << t;
  }
  EXPECT_EQ(device_->loads.load(), 1);
  ModuleCacheStats s = cache_->stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.references, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, static_cast<uint64_t>(kThreads - 1));

  // All of them give it back at once: one unload.
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { HIBER_EXPECT_OK(cache_->release(refs[t])); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(device_->unloads.load(), 1);
  EXPECT_EQ(cache_->stats().entries, 0u);
}

// Many threads acquiring and releasing a few images every way at once: every load is matched by
// one unload, and nothing is left.
TEST_F(ModuleCacheTest, ConcurrentAcquireAndReleaseBalance) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 300;
  const std::vector<Bytes> images = {ptx_image("k_s0"), ptx_image("k_s1"), ptx_image("k_s2")};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<ModuleCache::Ref> held;
      for (int i = 0; i < kRounds; ++i) {
        const Bytes& image = images[rng() % images.size()];
        switch (rng() % 3) {
          case 0: {
            auto r = cache_->acquire_by_image(image);
            ASSERT_TRUE(r.ok()) << r.status();
            held.push_back(*r);
            break;
          }
          case 1: {
            auto r = cache_->acquire_by_hash(sha256(image));
            if (r.ok()) {
              held.push_back(*r);
            } else {
              ASSERT_EQ(r.status().code(), ErrorCode::kNotFound) << r.status();
            }
            break;
          }
          default:
            if (!held.empty()) {
              const size_t k = rng() % held.size();
              HIBER_EXPECT_OK(cache_->release(held[k]));
              held.erase(held.begin() + static_cast<long>(k));
            }
        }
      }
      for (const auto& r : held) {
        HIBER_EXPECT_OK(cache_->release(r));
      }
    });
  }
  for (auto& t : threads) t.join();
  ModuleCacheStats s = cache_->stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.references, 0u);
  EXPECT_EQ(device_->live.load(), 0);
  EXPECT_EQ(device_->loads.load(), device_->unloads.load());
  EXPECT_EQ(s.misses, static_cast<uint64_t>(device_->loads.load()));
}

#ifdef HIBER_TEST_KERNELS_FATBIN
TEST_F(ModuleCacheTest, ARealFatbinIsSharedWithItsKernels) {
  std::ifstream in(HIBER_TEST_KERNELS_FATBIN, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty()) << HIBER_TEST_KERNELS_FATBIN;
  const Bytes fatbin = bytes_of(text);
  ModuleCache::Ref a = acquire(fatbin);
  auto b = cache_->acquire_by_hash(sha256(fatbin));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(device_->loads.load(), 1);
  EXPECT_EQ(cache_->stats().image_bytes, fatbin.size());
  auto fa = device_->get_function(a.module, "_Z7vec_addPKfS0_Pfi");
  auto fb = device_->get_function(b->module, "_Z7vec_addPKfS0_Pfi");
  ASSERT_TRUE(fa.ok() && fb.ok()) << fa.status() << fb.status();
  EXPECT_EQ(fa->id, fb->id);
  HIBER_EXPECT_OK(cache_->release(a));
  HIBER_EXPECT_OK(device_->function_info(*fb));
  HIBER_EXPECT_OK(cache_->release(*b));
  EXPECT_EQ(device_->unloads.load(), 1);
}
#endif

}  // namespace
}  // namespace hiber::server
