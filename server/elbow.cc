#include "server/elbow.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <glog/logging.h>

namespace hiber::server {
namespace {

constexpr uint64_t kSmallest = 64 << 10;
constexpr uint64_t kLargest = 64 << 20;
// Bytes moved per size and trial, at most: enough for the time to dwarf the clock.
constexpr uint64_t kBytesPerTrial = 16 << 20;
// ... and time per size and trial, at most, so that hiberd starts in well under a second on a
// slow link too. Sizes whose single copy takes longer than kSlowCopy are not tried: the link is
// saturated long before.
constexpr auto kTimePerTrial = std::chrono::milliseconds(10);
constexpr auto kSlowCopy = std::chrono::milliseconds(20);
constexpr int kTrials = 2;

// "<node name>|<GPU 0 product>": a cached elbow is only good for the node it was measured on.
std::string node_key(const device::Device& device) {
  return device.topology().name + "|" + device.properties(0).name;
}

}  // namespace

uint64_t elbow_of(const std::vector<ElbowSample>& samples, double fraction) {
  double best = 0;
  for (const ElbowSample& s : samples) best = std::max(best, s.gbps);
  for (const ElbowSample& s : samples) {
    if (s.gbps >= fraction * best) return s.bytes;
  }
  return samples.empty() ? kLargest : samples.back().bytes;
}

Result<std::vector<ElbowSample>> measure_transfers(device::Device& device,
                                                   ModelRepository& repository) {
  const int gpu = 0;
  const uint64_t granularity = device.allocation_granularity(gpu);
  // Up to 64 MiB, or half of a small GPU.
  HIBER_ASSIGN_OR_RETURN(device::MemoryInfo info, device.memory_info(gpu));
  uint64_t largest = kLargest;
  while (largest > kSmallest && largest > info.free_bytes / 2) largest /= 2;
  const uint64_t bytes = (largest + granularity - 1) / granularity * granularity;
  HIBER_ASSIGN_OR_RETURN(HostCopy staging, repository.allocate_staging(gpu, largest));
  std::memset(staging.data, 0x5a, largest);

  std::vector<ElbowSample> samples;
  Status status;
  device::DevicePtr va = 0;
  std::optional<device::PhysicalMemory> memory;
  std::optional<device::Stream> stream;
  std::optional<device::Event> event;
  bool mapped = false;
  [&] {
    auto reserved = device.reserve_address_range(bytes, granularity);
    if (!(status = reserved.status()).ok()) return;
    va = *reserved;
    auto created = device.create_physical(gpu, bytes);
    if (!(status = created.status()).ok()) return;
    memory = *created;
    if (!(status = device.map(va, bytes, *memory, 0)).ok()) return;
    mapped = true;
    const int gpus[] = {gpu};
    if (!(status = device.set_access(va, bytes, gpus)).ok()) return;
    auto s = device.create_stream(gpu, 0);
    if (!(status = s.status()).ok()) return;
    stream = *s;
    auto e = device.create_event(gpu, /*disable_timing=*/true);
    if (!(status = e.status()).ok()) return;
    event = *e;
    double rate = 0;  // bytes per second, from the last size
    for (uint64_t size = kSmallest; size <= largest; size *= 2) {
      if (rate > 0 &&
          static_cast<double>(size) / rate > std::chrono::duration<double>(kSlowCopy).count()) {
        break;
      }
      uint64_t count = std::max<uint64_t>(1, kBytesPerTrial / size);
      if (rate > 0) {
        const double fits = rate * std::chrono::duration<double>(kTimePerTrial).count() / size;
        count = std::clamp<uint64_t>(static_cast<uint64_t>(fits), 1, count);
      }
      double best = 0;
      for (int trial = 0; trial < kTrials; ++trial) {
        const auto start = std::chrono::steady_clock::now();
        for (uint64_t i = 0; i < count; ++i) {
          if (!(status = device.copy_host_to_device(*stream, va, staging.data, size)).ok()) return;
          if (!(status = device.record_event(*event, *stream)).ok()) return;
        }
        if (!(status = device.synchronize_stream(*stream)).ok()) return;
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best = std::max(best, static_cast<double>(count * size) / seconds);
      }
      rate = best;
      samples.push_back({size, best / 1e9});
    }
  }();
  if (event) (void)device.destroy_event(*event);
  if (stream) (void)device.destroy_stream(*stream);
  if (mapped) (void)device.unmap(va, bytes);
  if (memory) (void)device.release_physical(*memory);
  if (va != 0) (void)device.free_address_range(va, bytes);
  repository.release(staging);
  if (!status.ok()) return status.with_context("measuring the transfer elbow");
  return samples;
}

Result<uint64_t> find_elbow(device::Device& device, ModelRepository& repository,
                            const std::string& cache_path) {
  const std::string key = node_key(device);
  if (!cache_path.empty()) {
    std::ifstream in(cache_path);
    std::string line;
    while (std::getline(in, line)) {
      // "<key>\t<bytes>"
      const size_t tab = line.rfind('\t');
      if (tab == std::string::npos || line.substr(0, tab) != key) continue;
      const uint64_t cached = std::strtoull(line.c_str() + tab + 1, nullptr, 10);
      if (cached >= kSmallest && cached <= kLargest) {
        LOG(INFO) << "swap groups of " << cached << " bytes (the elbow cached in " << cache_path
                  << ")";
        return cached;
      }
    }
  }
  HIBER_ASSIGN_OR_RETURN(std::vector<ElbowSample> samples, measure_transfers(device, repository));
  const uint64_t elbow = elbow_of(samples);
  std::ostringstream curve;
  for (const ElbowSample& s : samples) curve << " " << (s.bytes >> 10) << "K:" << s.gbps;
  LOG(INFO) << "measured host-to-GPU transfers (GB/s):" << curve.str() << "; swap groups of "
            << elbow << " bytes";
  if (!cache_path.empty()) {
    std::ofstream out(cache_path, std::ios::app);
    out << key << '\t' << elbow << '\n';
    LOG_IF(WARNING, !out) << "cannot remember the elbow in " << cache_path;
  }
  return elbow;
}

}  // namespace hiber::server
