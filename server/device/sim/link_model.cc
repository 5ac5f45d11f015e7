#include "server/device/sim/link_model.h"

#include <algorithm>
#include <limits>

namespace hiber::device::sim {
namespace {

constexpr uint64_t kMinChunkBytes = 256 << 10;
constexpr uint64_t kMaxChunkBytes = 64 << 20;
// Waking up per chunk costs a few microseconds; chunks of this duration keep that cost small.
constexpr double kChunkSeconds = 100e-6;

}  // namespace

LinkModel::LinkModel(const NodeConfig& node) : node_(node) {
  for (const PcieSwitchSpec& s : node.pcie_switches) {
    switch_h2d_.push_back(add_link(s.host_to_device_gbps));
    switch_d2h_.push_back(add_link(s.device_to_host_gbps));
  }
  for (const GpuSpec& g : node.gpus)
    memory_.push_back(g.memory_bandwidth_gbps > 0 ? add_link(g.memory_bandwidth_gbps) : -1);
  for (const NvLinkSpec& l : node.nvlinks)
    nvlink_.emplace_back(add_link(l.bandwidth_gbps), add_link(l.bandwidth_gbps));
  for (const NvSwitchSpec& s : node.nvswitches) {
    std::vector<std::pair<int, int>> ports(node.gpus.size(), {-1, -1});
    for (int g : s.gpus)
      ports[g] = {add_link(s.port_bandwidth_gbps), add_link(s.port_bandwidth_gbps)};
    nvswitch_.push_back(std::move(ports));
  }
  users_.assign(gbps_.size(), 0);
  now_ = Clock::now();
}

int LinkModel::add_link(double gbps) {
  gbps_.push_back(gbps);
  return static_cast<int>(gbps_.size()) - 1;
}

LinkModel::Path LinkModel::make_path(std::vector<int> links) const {
  Path path;
  path.links = std::move(links);
  path.gbps = 0;
  for (int l : path.links) path.gbps = path.gbps == 0 ? gbps_[l] : std::min(path.gbps, gbps_[l]);
  return path;
}

LinkModel::Path LinkModel::host_to_device(int gpu) const {
  return make_path({switch_h2d_[node_.gpus[gpu].pcie_switch]});
}

LinkModel::Path LinkModel::device_to_host(int gpu) const {
  return make_path({switch_d2h_[node_.gpus[gpu].pcie_switch]});
}

LinkModel::Path LinkModel::within(int gpu) const {
  return memory_[gpu] < 0 ? Path() : make_path({memory_[gpu]});
}

LinkModel::Path LinkModel::peer(int src, int dst) const {
  if (src == dst) return within(src);
  // The fastest direct path, as NodeConfig::peer_bandwidth_gbps picks it.
  Path best;
  for (size_t i = 0; i < node_.nvlinks.size(); ++i) {
    const NvLinkSpec& l = node_.nvlinks[i];
    if (l.gpu_a == src && l.gpu_b == dst) best = make_path({nvlink_[i].first});
    if (l.gpu_b == src && l.gpu_a == dst) best = make_path({nvlink_[i].second});
  }
  for (size_t i = 0; i < node_.nvswitches.size(); ++i) {
    const auto& ports = nvswitch_[i];
    if (ports[src].first < 0 || ports[dst].second < 0) continue;
    Path through = make_path({ports[src].first, ports[dst].second});
    if (through.gbps > best.gbps) best = std::move(through);
  }
  if (best.throttled()) return best;
  return make_path(
      {switch_d2h_[node_.gpus[src].pcie_switch], switch_h2d_[node_.gpus[dst].pcie_switch]});
}

uint64_t LinkModel::chunk_bytes(const Path& path) {
  const double bytes = path.gbps * path.rate_factor * 1e9 * kChunkSeconds;
  return std::clamp(static_cast<uint64_t>(bytes), kMinChunkBytes, kMaxChunkBytes);
}

// GB/s are bytes per nanosecond, so rates below are in bytes/ns and times in ns.

void LinkModel::progress(double ns) {
  for (auto& [id, t] : transfers_)
    if (!t.finished) t.remaining = std::max(0.0, t.remaining - t.rate * ns);
}

void LinkModel::share() {
  for (auto& [id, t] : transfers_) {
    if (t.finished) continue;
    t.rate = std::numeric_limits<double>::infinity();
    for (int l : t.links) t.rate = std::min(t.rate, gbps_[l] / users_[l]);
    t.rate *= t.rate_factor;
  }
}

void LinkModel::leave(Transfer& t) {
  t.finished = true;
  for (int l : t.links) --users_[l];
}

void LinkModel::advance(Clock::time_point now) {
  using Ns = std::chrono::duration<double, std::nano>;
  while (true) {
    Transfer* first = nullptr;
    double soonest = std::numeric_limits<double>::infinity();
    for (auto& [id, t] : transfers_) {
      if (t.finished || t.remaining / t.rate >= soonest) continue;
      soonest = t.remaining / t.rate;
      first = &t;
    }
    if (first == nullptr || soonest > Ns(now - now_).count()) break;
    // The first transfer to finish leaves at that moment; the rest share its links from then on.
    progress(soonest);
    now_ += std::chrono::duration_cast<Clock::duration>(Ns(soonest));
    first->remaining = 0;
    leave(*first);
    share();
    changed_.notify_all();
  }
  if (now > now_) {
    progress(Ns(now - now_).count());
    now_ = now;
  }
}

uint64_t LinkModel::begin(const Path& path, uint64_t bytes) {
  MutexLock lock(mu_);
  advance(Clock::now());
  const uint64_t id = next_id_++;
  Transfer& t = transfers_[id];
  t.links = path.links;
  t.rate_factor = path.rate_factor;
  t.remaining = static_cast<double>(bytes);
  t.total = bytes;
  for (int l : t.links) ++users_[l];
  share();
  changed_.notify_all();
  return id;
}

void LinkModel::wait_until_moved(uint64_t transfer, uint64_t bytes) {
  using Ns = std::chrono::duration<double, std::nano>;
  MutexLock lock(mu_);
  while (true) {
    const Clock::time_point now = Clock::now();
    advance(now);
    const Transfer& t = transfers_.at(transfer);
    const double moved = static_cast<double>(t.total) - t.remaining;
    if (t.finished || moved + 0.5 >= static_cast<double>(bytes)) return;
    // Sleep until the bytes are there at the current rate, or until the next transfer finishes
    // and the rates change; an arrival wakes us too.
    double ns = (static_cast<double>(bytes) - moved) / t.rate;
    for (const auto& [id, other] : transfers_)
      if (!other.finished) ns = std::min(ns, other.remaining / other.rate);
    lock.wait_until(changed_, now + std::chrono::ceil<Clock::duration>(Ns(ns)));
  }
}

void LinkModel::end(uint64_t transfer) {
  MutexLock lock(mu_);
  advance(Clock::now());
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return;
  if (!it->second.finished) {
    leave(it->second);
    share();
  }
  transfers_.erase(it);
  changed_.notify_all();
}

}  // namespace hiber::device::sim
