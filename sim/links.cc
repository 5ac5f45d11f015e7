#include "sim/links.h"

#include <algorithm>
#include <cmath>

#include <glog/logging.h>

namespace hiber::sim {
namespace {

// Event argument: transfer slot in the low half, its version in the high half.
uint64_t pack(uint32_t slot, uint32_t version) { return uint64_t{version} << 32 | slot; }

}  // namespace

LinkModel::LinkModel(const scheduler::Topology& topology, EventQueue* queue,
                     const LinkOptions& options)
    : queue_(queue), options_(options), gpu_count_(topology.gpu_count()) {
  const NodeConfig& config = topology.config();
  for (const PcieSwitchSpec& s : config.pcie_switches)
    links_.push_back({s.host_to_device_gbps, {}});
  for (int g = 0; g < gpu_count_; ++g) host_link_of_gpu_.push_back(config.gpus[g].pcie_switch);
  peer_link_.assign(static_cast<size_t>(gpu_count_) * gpu_count_, -1);
  for (int a = 0; a < gpu_count_; ++a) {
    for (int b = a + 1; b < gpu_count_; ++b) {
      const double gbps = topology.peer_gbps(a, b);
      if (gbps <= 0) continue;
      const int id = static_cast<int>(links_.size());
      links_.push_back({gbps, {}});
      peer_link_[a * gpu_count_ + b] = id;
      peer_link_[b * gpu_count_ + a] = id;
    }
  }
}

int LinkModel::peer_link(int a, int b) const { return peer_link_[a * gpu_count_ + b]; }

double LinkModel::share(int link, int n) const {
  const double alone = options_.transfer_efficiency;
  return links_[link].gbps * std::min(alone, 1.0 / std::max(n, 1));
}

void LinkModel::start(int link, uint64_t bytes, TransferListener* listener, uint64_t tag) {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(transfers_.size());
    transfers_.emplace_back();
  }
  Transfer& t = transfers_[slot];
  const uint32_t version = t.version + 1;
  t = Transfer{};
  t.version = version;
  t.link = link;
  t.bytes = static_cast<double>(bytes);
  t.since = queue_->now();
  t.listener = listener;
  t.tag = tag;
  links_[link].active.push_back(slot);
  reshare(link, queue_->now());
}

void LinkModel::reshare(int link, Time now) {
  Link& l = links_[link];
  const double rate = share(link, static_cast<int>(l.active.size()));
  for (uint32_t slot : l.active) {
    Transfer& t = transfers_[slot];
    t.done = std::min(t.bytes, t.done + t.rate * static_cast<double>(now - t.since));
    t.since = now;
    if (t.rate == rate) continue;  // unchanged: its completion event stands
    if (t.rate > 0) t.listener->transfer_progress(t.tag, now, t.done);
    t.rate = rate;
    ++t.version;
    const double remaining = std::max(0.0, t.bytes - t.done);
    // Rounded to the nearest ns: the event completes the transfer whatever bytes remain.
    queue_->schedule(now + static_cast<Time>(std::llround(remaining / rate)), this, 0,
                     pack(slot, t.version));
  }
}

void LinkModel::on_event(int, uint64_t arg, Time now) {
  const uint32_t slot = static_cast<uint32_t>(arg);
  const uint32_t version = static_cast<uint32_t>(arg >> 32);
  Transfer& t = transfers_[slot];
  if (t.version != version || t.link < 0) return;  // superseded by a reshare
  const int link = t.link;
  std::vector<uint32_t>& active = links_[link].active;
  active.erase(std::find(active.begin(), active.end(), slot));
  TransferListener* listener = t.listener;
  const uint64_t tag = t.tag;
  t.link = -1;
  t.rate = 0;
  ++t.version;
  free_slots_.push_back(slot);
  reshare(link, now);
  listener->transfer_done(tag, now);
}

}  // namespace hiber::sim
