// Model churn on one 32 GiB GPU pool (docs/perf.md, "memory: pools and block translation"):
// how often a request fails although the pool has enough free bytes, and how fragmented the
// pool gets over time, for the buddy allocator against the Block and Naive baselines.
//
// The workload: 320 functions, 40 of each of the paper's Table 4 models, each model loaded the
// way PyTorch's caching allocator does it (bench/memory_models.h: 2 MiB, 20 MiB and rounded
// segments; 82 GiB of segments in all, so the pool is always short). A load picks a function not
// on the GPU at random, and first makes room as a controller would: it evicts random functions
// on the GPU (all their segments) until the pool's free bytes, caches included, cover the
// model. Then it allocates the model's segments in order. From there on every failure is one
// although enough bytes are free: the load evicts one more function and tries that segment
// again. Victims are random for every pool, except "buddy_guided", which evicts the function
// the shortfall names first. Everything is seeded: every run makes the same choices.
//
// The pools, each 32 GiB:
//   buddy        hiberd's: eight 4 GiB chunks, consolidation, sharing of 2 and 20 MiB blocks;
//   buddy_guided the same, evicting as the shortfall says;
//   buddy_plain  the same chunks, buddy with tail trimming only (no consolidation or sharing);
//   block        Torpor-Block: a cache of freed device allocations;
//   naive        one device allocation per segment.
// Block and Naive allocate from a device region in which each allocation must be one
// contiguous range, placed first fit by address: what carving blocks out of memory reserved at
// start looks like, and what rewriting needs (a block translates as one base). (A real
// cudaMalloc hides fragmentation behind 2 MiB pages, and Block pays in device calls instead:
// see device_allocations.)
//
// Reported per pool:
//   frag_load_rate       loads that met a failure although room had been made, per load;
//   frag_failure_rate    such failed segment requests, per segment request;
//   frag_evicted_GiB_per_1k  bytes evicted because of those failures, per 1000 loads;
//   room_evictions_per_1k    evictions to make room by bytes, per 1000 loads;
//   occupancy            bytes the live segments asked for / capacity, mean over the samples;
//   frag_mean, frag_max  fragmentation sampled every 100 loads: 1 - largest free piece / free
//                        bytes (buddy: its longest run of free blocks; Block and Naive: the
//                        device region's largest hole, Block's cached blocks counting as used);
//   device_allocations   device allocations made after start;
//   waste_MiB            rounding waste inside live allocations at the end.
// The time series goes to stdout (every 10%) and, with --churn_csv, to a CSV file.
#include <benchmark/benchmark.h>
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/memory_models.h"
#include "common/cli.h"
#include "memory/block_allocator.h"
#include "memory/buddy_allocator.h"
#include "memory/naive_allocator.h"

DEFINE_string(churn_csv, "", "Write every pool's fragmentation time series to this CSV file");
DEFINE_int32(churn_loads, 10000, "Model loads per pool");

namespace hiber::memory {
namespace {

constexpr uint64_t kPoolBytes = 32 * kGiB;
constexpr uint64_t kChunkBytes = 4 * kGiB;
constexpr int kFunctionsPerModel = 40;
constexpr int kSampleEvery = 100;

// A device region where every allocation is one contiguous range, placed first fit by address.
class FirstFitDevice final : public ChunkSource {
 public:
  explicit FirstFitDevice(uint64_t bytes) : free_bytes_(bytes) { holes_[0] = bytes; }

  Result<uint32_t> create_chunk(uint64_t bytes) override {
    for (auto hole = holes_.begin(); hole != holes_.end(); ++hole) {
      if (hole->second < bytes) continue;
      const uint64_t offset = hole->first;
      if (hole->second > bytes) holes_[offset + bytes] = hole->second - bytes;
      holes_.erase(hole);
      uint32_t id;
      if (free_ids_.empty()) {
        id = static_cast<uint32_t>(chunks_.size());
        chunks_.emplace_back();
      } else {
        id = free_ids_.back();
        free_ids_.pop_back();
      }
      chunks_[id] = {offset, bytes};
      free_bytes_ -= bytes;
      return id;
    }
    return error(ErrorCode::kOutOfMemory, "no hole of ", bytes, " bytes");
  }

  void release_chunk(uint32_t id) noexcept override {
    auto [offset, bytes] = chunks_[id];
    free_ids_.push_back(id);
    free_bytes_ += bytes;
    auto next = holes_.lower_bound(offset);
    if (next != holes_.end() && next->first == offset + bytes) {
      bytes += next->second;
      next = holes_.erase(next);
    }
    if (next != holes_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == offset) {
        previous->second += bytes;
        return;
      }
    }
    holes_[offset] = bytes;
  }

  double fragmentation() const {
    uint64_t largest = 0;
    for (const auto& [offset, bytes] : holes_) largest = std::max(largest, bytes);
    return free_bytes_ == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / free_bytes_;
  }

 private:
  std::map<uint64_t, uint64_t> holes_;                 // offset -> bytes
  std::vector<std::pair<uint64_t, uint64_t>> chunks_;  // by id: offset, bytes
  std::vector<uint32_t> free_ids_;
  uint64_t free_bytes_;
};

enum class Kind { kBuddy, kBuddyGuided, kBuddyPlain, kBlock, kNaive };

struct Sample {
  int loads;
  double fragmentation;
  double used;  // bytes the live segments asked for / capacity
};
std::map<std::string, std::vector<Sample>>& series() {
  static std::map<std::string, std::vector<Sample>> all;
  return all;
}

void BM_ModelChurn(benchmark::State& state, Kind kind, const std::string& name) {
  // The functions and their segments.
  struct Function {
    const std::vector<uint64_t>* segments;
    std::vector<Allocation> placed;
  };
  std::vector<std::vector<uint64_t>> model_segments;
  for (const bench::ModelSpec& model : bench::table4_models()) {
    model_segments.push_back(bench::pytorch_segments(model, 42));
  }
  for (auto _ : state) {
    std::unique_ptr<FirstFitDevice> device;
    std::unique_ptr<PoolAllocator> pool;
    BuddyAllocator* buddy = nullptr;
    if (kind == Kind::kBlock || kind == Kind::kNaive) {
      device = std::make_unique<FirstFitDevice>(kPoolBytes);
      if (kind == Kind::kBlock) {
        pool = std::make_unique<BlockAllocator>(*device, kPoolBytes);
      } else {
        pool = std::make_unique<NaiveAllocator>(*device, kPoolBytes);
      }
    } else {
      BuddyOptions options;
      if (kind == Kind::kBuddyPlain) {
        options.consolidate = false;
        options.shared_sizes = {};
      }
      auto created = BuddyAllocator::create(
          std::vector<uint64_t>(kPoolBytes / kChunkBytes, kChunkBytes), options);
      buddy = created->get();
      pool = std::move(created).value();
    }
    std::vector<Function> functions;
    for (int i = 0; i < kFunctionsPerModel; ++i) {
      for (const std::vector<uint64_t>& segments : model_segments) {
        functions.push_back({&segments, {}});
      }
    }
    std::vector<int> on_gpu, off_gpu(functions.size());
    for (size_t i = 0; i < functions.size(); ++i) off_gpu[i] = static_cast<int>(i);
    std::mt19937_64 rng(7);
    const auto id = [](int f) { return FunctionId{static_cast<uint32_t>(f + 1)}; };
    const auto evict = [&](size_t slot) {
      const int f = on_gpu[slot];
      for (const Allocation& a : functions[f].placed) (void)pool->deallocate(a);
      functions[f].placed.clear();
      on_gpu[slot] = on_gpu.back();
      on_gpu.pop_back();
      off_gpu.push_back(f);
    };

    uint64_t requests = 0, frag_failures = 0, frag_loads = 0, frag_evicted = 0;
    uint64_t room_evictions = 0;
    std::vector<Sample>& samples = series()[name];
    samples.clear();
    for (int load = 1; load <= FLAGS_churn_loads; ++load) {
      const size_t pick = rng() % off_gpu.size();
      const int f = off_gpu[pick];
      off_gpu[pick] = off_gpu.back();
      off_gpu.pop_back();
      // The controller makes room first: random victims until the free bytes cover the model.
      uint64_t model_bytes = 0;
      for (uint64_t bytes : *functions[f].segments) model_bytes += bytes;
      for (PoolStats now = pool->stats(); now.capacity_bytes - now.allocated_bytes < model_bytes;
           now = pool->stats()) {
        evict(rng() % on_gpu.size());
        ++room_evictions;
      }
      // Every failure from here on is one although enough bytes are free.
      bool hit = false;
      for (uint64_t bytes : *functions[f].segments) {
        for (;;) {
          ++requests;
          AllocationResult r = pool->allocate(bytes, id(f));
          if (r.ok()) {
            functions[f].placed.push_back(*r);
            break;
          }
          ++frag_failures;
          hit = true;
          if (on_gpu.empty()) {
            state.SkipWithError("a model does not fit in the empty pool");
            return;
          }
          size_t slot = rng() % on_gpu.size();
          if (kind == Kind::kBuddyGuided && !r.shortfall().evict.empty()) {
            const int victim = static_cast<int>(r.shortfall().evict.front().function.value()) - 1;
            auto named = std::find(on_gpu.begin(), on_gpu.end(), victim);
            if (named != on_gpu.end()) slot = named - on_gpu.begin();
          }
          for (const Allocation& a : functions[on_gpu[slot]].placed) frag_evicted += a.bytes;
          evict(slot);
        }
      }
      frag_loads += hit;
      on_gpu.push_back(f);
      if (load % kSampleEvery == 0) {
        const PoolStats now = pool->stats();
        const double free = static_cast<double>(now.free_bytes + now.cached_bytes);
        const double fragmentation = device      ? device->fragmentation()
                                     : free == 0 ? 0.0
                                                 : 1.0 - buddy->largest_free_run_bytes() / free;
        samples.push_back(
            {load, fragmentation, static_cast<double>(now.requested_bytes) / now.capacity_bytes});
      }
    }
    double frag_sum = 0, frag_max = 0, used_sum = 0;
    for (const Sample& s : samples) {
      frag_sum += s.fragmentation;
      frag_max = std::max(frag_max, s.fragmentation);
      used_sum += s.used;
    }
    const double points = static_cast<double>(std::max<size_t>(1, samples.size()));
    const double loads = FLAGS_churn_loads;
    const PoolStats end = pool->stats();
    state.counters["frag_load_rate"] = frag_loads / loads;
    state.counters["frag_failure_rate"] = static_cast<double>(frag_failures) / requests;
    state.counters["frag_evicted_GiB_per_1k"] = 1000.0 * frag_evicted / kGiB / loads;
    state.counters["room_evictions_per_1k"] = 1000.0 * room_evictions / loads;
    state.counters["occupancy"] = used_sum / points;
    state.counters["frag_mean"] = frag_sum / points;
    state.counters["frag_max"] = frag_max;
    state.counters["device_allocations"] = static_cast<double>(end.upstream_allocations);
    state.counters["waste_MiB"] = static_cast<double>(end.internal_waste_bytes()) / kMiB;
  }
}

BENCHMARK_CAPTURE(BM_ModelChurn, buddy, Kind::kBuddy, "buddy")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ModelChurn, buddy_guided, Kind::kBuddyGuided, "buddy_guided")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ModelChurn, buddy_plain, Kind::kBuddyPlain, "buddy_plain")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ModelChurn, block, Kind::kBlock, "block")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ModelChurn, naive, Kind::kNaive, "naive")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void report_series() {
  if (series().empty()) return;
  std::printf(
      "\nFragmentation over time (1 - largest free piece / free bytes; used = bytes the live "
      "segments asked for / capacity)\n");
  std::printf("%8s", "loads");
  for (const auto& [name, samples] : series()) std::printf(" %20s", name.c_str());
  std::printf("\n");
  const size_t points = series().begin()->second.size();
  const size_t every = std::max<size_t>(1, points / 10);
  for (size_t i = every - 1; i < points; i += every) {
    std::printf("%8d", series().begin()->second[i].loads);
    for (const auto& [name, samples] : series()) {
      std::printf("     %5.3f (used %3.0f%%)", samples[i].fragmentation, 100 * samples[i].used);
    }
    std::printf("\n");
  }
  if (FLAGS_churn_csv.empty()) return;
  std::ofstream csv(FLAGS_churn_csv);
  csv << "pool,loads,fragmentation,used\n";
  for (const auto& [name, samples] : series()) {
    for (const Sample& s : samples)
      csv << name << ',' << s.loads << ',' << s.fragmentation << ',' << s.used << '\n';
  }
  std::printf("wrote %s\n", FLAGS_churn_csv.c_str());
}

}  // namespace
}  // namespace hiber::memory

int main(int argc, char** argv) {
  // Leave --benchmark_* flags for Google Benchmark.
  gflags::AllowCommandLineReparsing();
  hiber::init_program(&argc, &argv,
                      "memory_churn_bench: Table 4 models loaded and evicted at random on a 32 GiB "
                      "GPU pool, for each pool allocator. Also takes Google Benchmark's "
                      "--benchmark_* flags.",
                      __FILE__);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  hiber::memory::report_series();
  benchmark::Shutdown();
  return 0;
}
