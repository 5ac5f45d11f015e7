// Allocate-and-free latency of the GPU pools (docs/perf.md, "memory: pools and block
// translation"): the buddy allocator (target: p50 <= 100 ns) against the Block and Naive
// baselines, in the same run.
//
// Each pool holds 32 GiB (the buddy allocator: eight 4 GiB chunks, hiberd's default) and is first
// filled to half with PyTorch-like segments of 64 functions. Then, per benchmark:
//   - Arg = N MiB: one function allocates N MiB and frees it again (2 and 20 MiB are PyTorch's
//     segment sizes and the sharing cache's; 64 MiB goes through split and coalesce);
//   - Arg = 0: the mixed stream: a random function allocates a segment drawn from the mix, and
//     a random live allocation is freed, so the pool stays half full.
// One sample is a batch of 16 allocate+free pairs timed with steady_clock; p50_ns and p99_ns
// are per pair over those batches (batching keeps the clock's own cost out; a slow pair inside a
// batch is averaged with its neighbours).
//
// Block and Naive allocate "device" memory from a CountingChunkSource, which only counts. A
// real device allocation (cuMemCreate, cudaMalloc) costs microseconds to milliseconds and
// serialises the driver, which is why hiberd pools: their figures here are their bookkeeping
// alone, a lower bound.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "memory/block_allocator.h"
#include "memory/buddy_allocator.h"
#include "memory/naive_allocator.h"

namespace hiber::memory {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kPoolBytes = 32 * kGiB;
constexpr uint64_t kChunkBytes = 4 * kGiB;
constexpr int kFunctions = 64;
constexpr int kBatch = 16;

enum class Kind { kBuddy, kBlock, kNaive };

struct Pool {
  std::unique_ptr<CountingChunkSource> device;
  std::unique_ptr<PoolAllocator> allocator;
};

Pool make_pool(Kind kind) {
  Pool pool;
  if (kind == Kind::kBuddy) {
    pool.allocator =
        BuddyAllocator::create(std::vector<uint64_t>(kPoolBytes / kChunkBytes, kChunkBytes))
            .value();
  } else {
    pool.device = std::make_unique<CountingChunkSource>(kPoolBytes);
    if (kind == Kind::kBlock) {
      pool.allocator = std::make_unique<BlockAllocator>(*pool.device, kPoolBytes);
    } else {
      pool.allocator = std::make_unique<NaiveAllocator>(*pool.device, kPoolBytes);
    }
  }
  return pool;
}

// PyTorch's segments: 2 MiB (small tensors), 20 MiB (medium), large tensors rounded to 2 MiB.
uint64_t draw_segment(std::mt19937_64& rng) {
  const uint64_t r = rng() % 10;
  if (r < 5) return 2 * kMiB;
  if (r < 8) return 20 * kMiB;
  return (1 + rng() % 64) * 2 * kMiB;
}

struct Sampler {
  std::vector<double> pair_ns;
  void finish(benchmark::State& state, uint64_t failures) {
    if (pair_ns.empty()) return;
    std::sort(pair_ns.begin(), pair_ns.end());
    state.counters["p50_ns"] = pair_ns[pair_ns.size() / 2];
    state.counters["p99_ns"] = pair_ns[pair_ns.size() * 99 / 100];
    state.counters["failures"] = static_cast<double>(failures);
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kBatch);
  }
};

void BM_AllocateFree(benchmark::State& state, Kind kind) {
  Pool pool = make_pool(kind);
  std::mt19937_64 rng(20261124);
  std::vector<Allocation> live;
  while (pool.allocator->stats().allocated_bytes < kPoolBytes / 2) {
    AllocationResult r = pool.allocator->allocate(
        draw_segment(rng), FunctionId{static_cast<uint32_t>(1 + rng() % kFunctions)});
    if (!r.ok()) break;
    live.push_back(*r);
  }
  const uint64_t fixed_bytes = static_cast<uint64_t>(state.range(0)) * kMiB;
  // The mixed stream's draws, made before timing.
  constexpr size_t kDraws = 1 << 16;
  std::vector<uint64_t> sizes(kDraws);
  std::vector<uint32_t> owners(kDraws), victims(kDraws);
  for (size_t i = 0; i < kDraws; ++i) {
    sizes[i] = fixed_bytes != 0 ? fixed_bytes : draw_segment(rng);
    owners[i] = static_cast<uint32_t>(1 + rng() % kFunctions);
    victims[i] = static_cast<uint32_t>(rng());
  }
  Sampler sampler;
  sampler.pair_ns.reserve(1 << 20);
  uint64_t failures = 0;
  size_t draw = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    for (int i = 0; i < kBatch; ++i, draw = (draw + 1) % kDraws) {
      AllocationResult r = pool.allocator->allocate(sizes[draw], FunctionId{owners[draw]});
      if (!r.ok()) {
        ++failures;
        continue;
      }
      if (fixed_bytes != 0) {
        benchmark::DoNotOptimize(pool.allocator->deallocate(*r));
      } else {
        live.push_back(*r);
        const size_t victim = (uint64_t{victims[draw]} * live.size()) >> 32;
        benchmark::DoNotOptimize(pool.allocator->deallocate(live[victim]));
        live[victim] = live.back();
        live.pop_back();
      }
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    sampler.pair_ns.push_back(ns / kBatch);
  }
  sampler.finish(state, failures);
  state.counters["live_allocations"] = static_cast<double>(live.size());
}

BENCHMARK_CAPTURE(BM_AllocateFree, buddy, Kind::kBuddy)
    ->Arg(2)
    ->Arg(20)
    ->Arg(64)
    ->Arg(0)
    ->ArgName("MiB");
BENCHMARK_CAPTURE(BM_AllocateFree, block, Kind::kBlock)
    ->Arg(2)
    ->Arg(20)
    ->Arg(64)
    ->Arg(0)
    ->ArgName("MiB");
BENCHMARK_CAPTURE(BM_AllocateFree, naive, Kind::kNaive)
    ->Arg(2)
    ->Arg(20)
    ->Arg(64)
    ->Arg(0)
    ->ArgName("MiB");

}  // namespace
}  // namespace hiber::memory

BENCHMARK_MAIN();
