// Block address translation (docs/perf.md, "memory: pools and block translation"):
//   resolve      one pointer to (block, offset) with 10,000 live blocks (target <= 30 ns), against
//                a std::map lookup (upper_bound) over the same blocks and pointers;
//   kernel args  translating a launch's packed parameters, 8 B to 4 KB: mapping (a size check)
//                and rewriting (the 8-byte word scan), against the memcpy a launch makes of its
//                parameters anyway;
//   stored data  scanning host data copied to the device for pointers to the function's blocks
//                (pointer tables, for pipelining), against copying the same bytes;
//   map plan     building the plan of a swap for a ResNet-152 (230 MB in PyTorch's segments)
//                placed by the buddy allocator with and without consolidation: time, and map
//                calls against blocks;
//   swap         applying that plan on the simulated GPU (map, set_access, unmap), against one
//                map call per block.
// Addresses are where the simulated device reserves ranges (0x7f...); 2 MiB granules.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "bench/memory_models.h"
#include "memory/block_table.h"
#include "memory/buddy_allocator.h"
#include "memory/translation.h"
#include "server/device/sim_device.h"

namespace hiber::memory {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kGranule = 2 * kMiB;
constexpr uint64_t kBase = 0x7f0000000000;
constexpr uint64_t kRange = 512 * kGiB;

// PyTorch's segment sizes: 2 MiB, 20 MiB, large tensors rounded to 2 MiB.
uint64_t draw_segment(std::mt19937_64& rng) {
  const uint64_t r = rng() % 10;
  if (r < 5) return 2 * kMiB;
  if (r < 8) return 20 * kMiB;
  return (1 + rng() % 64) * 2 * kMiB;
}

// A table with `count` blocks at increasing addresses, some with gaps between them (freed
// blocks), each placed on GPU 0 somewhere in its pool.
BlockTable table_with_blocks(size_t count, std::map<uint64_t, uint64_t>* reference) {
  BlockTable table = BlockTable::create(kBase, kRange, kGranule, 1).value();
  std::mt19937_64 rng(20261125);
  uint64_t va = kBase;
  uint64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bytes = draw_segment(rng);
    va += (rng() % 4 == 0 ? 1 + rng() % 3 : 0) * kGranule;
    if (!table.add(va, bytes, BlockKind::kModel).ok() ||
        !table.place(va, 0, {{static_cast<uint32_t>(i % 8), offset % (4 * kGiB)}, bytes}).ok()) {
      std::abort();
    }
    if (reference != nullptr) reference->emplace(va, bytes);
    va += bytes;
    offset += bytes;
  }
  return table;
}

// Pointers into the table's range: 90% inside a block at a random offset, the rest anywhere.
std::vector<uint64_t> pointers_into(const BlockTable& table, size_t count) {
  std::vector<const VirtualBlock*> blocks;
  for (const VirtualBlock& block : table.blocks()) blocks.push_back(&block);
  std::mt19937_64 rng(99);
  std::vector<uint64_t> pointers(count);
  const uint64_t end = blocks.back()->end();
  for (uint64_t& ptr : pointers) {
    if (rng() % 10 != 0) {
      const VirtualBlock* block = blocks[rng() % blocks.size()];
      ptr = block->va + rng() % block->bytes;
    } else {
      ptr = kBase + rng() % (end - kBase);
    }
  }
  return pointers;
}

constexpr size_t kLiveBlocks = 10000;
constexpr int kLookupBatch = 256;

template <typename Lookup>
void time_lookups(benchmark::State& state, const std::vector<uint64_t>& pointers, Lookup&& lookup) {
  std::vector<double> ns_per_lookup;
  ns_per_lookup.reserve(1 << 20);
  size_t next = 0;
  uint64_t sink = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    for (int i = 0; i < kLookupBatch; ++i) {
      sink += lookup(pointers[next]);
      next = next + 1 == pointers.size() ? 0 : next + 1;
    }
    ns_per_lookup.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                            kLookupBatch);
  }
  benchmark::DoNotOptimize(sink);
  std::sort(ns_per_lookup.begin(), ns_per_lookup.end());
  state.counters["p50_ns"] = ns_per_lookup[ns_per_lookup.size() / 2];
  state.counters["p99_ns"] = ns_per_lookup[ns_per_lookup.size() * 99 / 100];
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kLookupBatch);
}

void BM_Resolve_BlockTable(benchmark::State& state) {
  const BlockTable table = table_with_blocks(kLiveBlocks, nullptr);
  const std::vector<uint64_t> pointers = pointers_into(table, 1 << 16);
  time_lookups(state, pointers, [&](uint64_t ptr) {
    const PointerTarget target = table.resolve(ptr);
    return target.found() ? target.offset + 1 : 0;
  });
  state.counters["blocks"] = static_cast<double>(table.size());
}
BENCHMARK(BM_Resolve_BlockTable);

// The baseline: the same blocks in a std::map by address, a pointer found with upper_bound.
void BM_Resolve_StdMap(benchmark::State& state) {
  std::map<uint64_t, uint64_t> blocks;
  const BlockTable table = table_with_blocks(kLiveBlocks, &blocks);
  const std::vector<uint64_t> pointers = pointers_into(table, 1 << 16);
  time_lookups(state, pointers, [&](uint64_t ptr) -> uint64_t {
    auto it = blocks.upper_bound(ptr);
    if (it == blocks.begin()) return 0;
    --it;
    return ptr - it->first <= it->second ? ptr - it->first + 1 : 0;
  });
  state.counters["blocks"] = static_cast<double>(blocks.size());
}
BENCHMARK(BM_Resolve_StdMap);

// ---- Kernel arguments ----

// A parameter buffer of about `bytes`, in units of 32 bytes as kernels take them: two pointers
// into live blocks, an int, a float and an int64 size. Returns the layout; fills `buffer`.
KernelInfo kernel_params(const BlockTable& table, uint32_t bytes, std::vector<std::byte>& buffer) {
  KernelInfo kernel{"kernel", {}};
  std::vector<uint64_t> starts;
  for (const VirtualBlock& block : table.blocks()) starts.push_back(block.va);
  std::mt19937_64 rng(5);
  buffer.assign(bytes, std::byte{0});
  const auto put = [&](uint32_t offset, const void* value, uint32_t size) {
    std::memcpy(buffer.data() + offset, value, size);
    kernel.params.push_back({offset, size});
  };
  for (uint32_t offset = 0; offset + 8 <= bytes; offset += 32) {
    const uint64_t pointer = starts[rng() % starts.size()] + 256;
    put(offset, &pointer, 8);
    if (offset + 16 > bytes) break;
    const uint64_t second = starts[rng() % starts.size()];
    put(offset + 8, &second, 8);
    const int32_t n = 1024;
    const float alpha = 0.5f;
    const int64_t size = 4096;
    put(offset + 16, &n, 4);
    put(offset + 20, &alpha, 4);
    put(offset + 24, &size, 8);
  }
  buffer.resize(kernel.param_bytes());
  return kernel;
}

enum class Mechanism { kCopyOnly, kMapping, kRewriting };

void BM_KernelArgs(benchmark::State& state, Mechanism mechanism) {
  const BlockTable table = table_with_blocks(1000, nullptr);
  std::vector<std::byte> original;
  const KernelInfo kernel = kernel_params(table, static_cast<uint32_t>(state.range(0)), original);
  std::vector<std::byte> params(original.size());
  MappingTranslator mapping(table);
  // Eight 4 GiB pool chunks, mapped one after another in hiberd's address space.
  std::vector<uint64_t> chunk_base;
  for (uint64_t chunk = 0; chunk < 8; ++chunk)
    chunk_base.push_back(0x100000000000 + chunk * 4 * kGiB);
  auto rewriting = RewritingTranslator::create(table, {chunk_base}).value();
  for (auto _ : state) {
    std::memcpy(params.data(), original.data(), original.size());
    if (mechanism == Mechanism::kMapping) {
      benchmark::DoNotOptimize(mapping.translate_kernel_params(params, kernel, 0));
    } else if (mechanism == Mechanism::kRewriting) {
      benchmark::DoNotOptimize(rewriting->translate_kernel_params(params, kernel, 0));
    }
    benchmark::DoNotOptimize(params.data());
    benchmark::ClobberMemory();
  }
  state.counters["param_bytes"] = static_cast<double>(original.size());
  if (mechanism == Mechanism::kRewriting) {
    const TranslationCounters& counters = rewriting->counters();
    state.counters["words_scanned"] =
        static_cast<double>(counters.words_scanned) / counters.launches;
    state.counters["words_rewritten"] =
        static_cast<double>(counters.words_rewritten) / counters.launches;
    if (counters.refused != 0) state.SkipWithError("a launch was refused");
  }
}
BENCHMARK_CAPTURE(BM_KernelArgs, copy_only, Mechanism::kCopyOnly)
    ->RangeMultiplier(8)
    ->Range(8, 4096);
BENCHMARK_CAPTURE(BM_KernelArgs, mapping, Mechanism::kMapping)->RangeMultiplier(8)->Range(8, 4096);
BENCHMARK_CAPTURE(BM_KernelArgs, rewriting, Mechanism::kRewriting)
    ->RangeMultiplier(8)
    ->Range(8, 4096);

// ---- Stored data: pointer tables ----

// hiberd scans every host-to-device copy of a pipelined function for pointers to its blocks.
// The data here is model weights (floats, no pointers: the whole buffer is read); the baseline
// copies the same bytes, as the copy itself must.
void BM_StoredData(benchmark::State& state, bool scan) {
  const BlockTable table = table_with_blocks(1000, nullptr);
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<float> weights(bytes / sizeof(float));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (float& w : weights) w = normal(rng);
  const auto data = std::as_bytes(std::span(weights));
  std::vector<std::byte> copy(data.size());
  for (auto _ : state) {
    if (scan) {
      if (holds_block_pointers(table, kBase, data)) state.SkipWithError("weights read as pointers");
    } else {
      std::memcpy(copy.data(), data.data(), data.size());
      benchmark::ClobberMemory();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK_CAPTURE(BM_StoredData, copy_baseline, false)
    ->RangeMultiplier(64)
    ->Range(4 << 10, 256 << 20)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_StoredData, pointer_scan, true)
    ->RangeMultiplier(64)
    ->Range(4 << 10, 256 << 20)
    ->Unit(benchmark::kMicrosecond);

// ---- Map plan ----

constexpr uint64_t kModelRange = 1 * kGiB;
constexpr uint64_t kPoolChunk = 4 * kGiB;

// ResNet-152's segments placed for function 1 by a buddy pool (one 4 GiB chunk) in which
// function 2 loads a ResNet-101 at the same time, at consecutive addresses from `base`.
BlockTable resnet152_placed(bool consolidate, uint64_t base) {
  BuddyOptions options;
  if (!consolidate) {
    options.consolidate = false;
    options.shared_sizes = {};
  }
  auto pool = BuddyAllocator::create({kPoolChunk}, options).value();
  const std::vector<uint64_t> mine = bench::pytorch_segments(bench::model_named("ResNet-152"), 42);
  const std::vector<uint64_t> other = bench::pytorch_segments(bench::model_named("ResNet-101"), 43);
  BlockTable table = BlockTable::create(base, kModelRange, kGranule, 1).value();
  uint64_t va = base;
  for (size_t i = 0; i < mine.size(); ++i) {
    AllocationResult placed = pool->allocate(mine[i], FunctionId{1});
    if (i < other.size()) (void)pool->allocate(other[i], FunctionId{2});
    if (!placed.ok() || !table.add(va, mine[i], BlockKind::kModel).ok() ||
        !table.place(va, 0, *placed).ok()) {
      std::abort();
    }
    va += mine[i];
  }
  return table;
}

void BM_MapPlan(benchmark::State& state, bool consolidate) {
  const BlockTable table = resnet152_placed(consolidate, kBase);
  size_t calls = 0, runs = 0;
  for (auto _ : state) {
    Result<MapPlan> plan = plan_mapping(table, 0);
    calls = plan->calls.size();
    runs = plan->va_runs().size();
    benchmark::DoNotOptimize(plan);
  }
  state.counters["blocks"] = static_cast<double>(table.size());
  state.counters["map_calls"] = static_cast<double>(calls);
  state.counters["access_calls"] = static_cast<double>(runs);
  state.counters["model_MiB"] = static_cast<double>(table.model_bytes()) / kMiB;
}
BENCHMARK_CAPTURE(BM_MapPlan, consolidated, true);
BENCHMARK_CAPTURE(BM_MapPlan, plain_buddy, false);

// ---- The mapping mechanism's cost per swap, on the simulated device ----

// Applying a ResNet-152 swap on the simulated GPU: the map calls, one set_access per address
// run, then the unmap per run when the function leaves. "merged" applies plan_mapping's plan;
// the baseline maps every block with a call of its own. The simulated device maps with mmap
// (memfd aliasing); CUDA's cuMemMap and cuMemSetAccess cost more per call, so the number of
// calls is what carries over, not these microseconds.
void BM_SwapOnSimulatedGpu(benchmark::State& state, bool merged) {
  auto device = device::SimDevice::create(device::SimDeviceOptions{}).value();
  const device::PhysicalMemory chunk = device->create_physical(0, kPoolChunk).value();
  const uint64_t base = device->reserve_address_range(kModelRange, 0).value();
  const BlockTable table = resnet152_placed(true, base);
  MapPlan plan = plan_mapping(table, 0).value();
  if (!merged) {
    plan.calls.clear();
    for (const VirtualBlock& block : table.blocks()) {
      const PoolLocation& where = block.on(0).pieces.front().where;
      plan.calls.push_back({block.va, block.bytes, where.chunk, where.offset});
    }
  }
  const std::vector<VaRange> runs = plan.va_runs();
  const int gpus[] = {0};
  for (auto _ : state) {
    for (const MapCall& call : plan.calls) {
      if (!device->map(call.va, call.bytes, chunk, call.chunk_offset).ok())
        state.SkipWithError("map");
    }
    for (const VaRange& run : runs) {
      if (!device->set_access(run.va, run.bytes, gpus).ok()) state.SkipWithError("set_access");
    }
    for (const VaRange& run : runs) {
      if (!device->unmap(run.va, run.bytes).ok()) state.SkipWithError("unmap");
    }
  }
  state.counters["blocks"] = static_cast<double>(table.size());
  state.counters["map_calls"] = static_cast<double>(plan.calls.size());
  (void)device->free_address_range(base, kModelRange);
  (void)device->release_physical(chunk);
}
BENCHMARK_CAPTURE(BM_SwapOnSimulatedGpu, merged, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SwapOnSimulatedGpu, one_call_per_block, false)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace hiber::memory

BENCHMARK_MAIN();
