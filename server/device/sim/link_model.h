// Bandwidth of the node's links, for throttled copies.
//
// Every link carries one direction: the host-to-device and the device-to-host side of each PCIe
// switch (shared by the GPUs behind it), each direction of each NVLink, the send and receive side
// of each GPU's NVSwitch port, and each GPU's own memory (copies and memsets within a GPU).
// 1 GB/s is 1e9 bytes per second.
//
// Transfers share links as a fluid: while n transfers cross a link, each gets 1/n of it, and a
// transfer moves at the rate of its most contended link (min over its path of bandwidth / users).
// Progress is computed in model time from arrivals and departures alone, so a worker thread that
// wakes up late does not lose its share to the others (the per-chunk reservations we started
// with did, on a busy machine). Two transfers that start together through one link therefore
// each take twice as long as one alone: the PCIe contention the scheduler reasons about (Torpor,
// Table 3). The copier moves data chunk by chunk as the model says it has arrived.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <vector>

#include "common/mutex.h"
#include "common/node_config.h"

namespace hiber::device::sim {

// Thread-safe.
class LinkModel {
 public:
  using Clock = std::chrono::steady_clock;

  // The links a transfer crosses. Empty: not throttled.
  struct Path {
    std::vector<int> links;
    double gbps = 0;  // the slowest link's bandwidth
    // The transfer moves at this fraction of its share of the links (a pageable host buffer
    // goes through a bounce buffer at a fraction of the link's speed).
    double rate_factor = 1.0;
    bool throttled() const { return !links.empty(); }
  };

  explicit LinkModel(const NodeConfig& node);

  Path host_to_device(int gpu) const;
  Path device_to_host(int gpu) const;
  // A copy whose source and destination memory are on the same GPU.
  Path within(int gpu) const;
  // From src's memory to dst's: over the fastest direct link (NVLink or NVSwitch) if there is
  // one, otherwise up through src's PCIe switch and down through dst's.
  Path peer(int src, int dst) const;

  // Bytes to copy per step of a throttled transfer: about 100 us of transfer (so that waking up
  // for each step costs little) but at least 256 KiB.
  static uint64_t chunk_bytes(const Path& path);

  // A transfer of `bytes` over `path` starts now. REQUIRES: path.throttled().
  uint64_t begin(const Path& path, uint64_t bytes) EXCLUDES(mu_);
  // Blocks until the transfer has moved `bytes` (of its total) in model time.
  void wait_until_moved(uint64_t transfer, uint64_t bytes) EXCLUDES(mu_);
  // The transfer leaves (finished, or abandoned early, which frees its share at once).
  void end(uint64_t transfer) EXCLUDES(mu_);

 private:
  struct Transfer {
    std::vector<int> links;
    double rate_factor = 1.0;
    double remaining = 0;  // bytes
    double rate = 0;       // bytes per nanosecond
    bool finished = false;
    uint64_t total = 0;
  };

  int add_link(double gbps);
  Path make_path(std::vector<int> links) const;
  // Moves the model to `now`, finishing transfers (and re-sharing their links) in time order.
  void advance(Clock::time_point now) REQUIRES(mu_);
  void progress(double ns) REQUIRES(mu_);
  void share() REQUIRES(mu_);
  void leave(Transfer& t) REQUIRES(mu_);

  const NodeConfig& node_;
  std::vector<double> gbps_;                                // per link
  std::vector<int> switch_h2d_, switch_d2h_;                // per PCIe switch
  std::vector<int> memory_;                                 // per GPU; -1 = unthrottled
  std::vector<std::pair<int, int>> nvlink_;                 // per NVLink: a->b, b->a
  std::vector<std::vector<std::pair<int, int>>> nvswitch_;  // per fabric, per GPU: send, receive

  Mutex mu_;
  std::condition_variable changed_;         // a transfer arrived or left
  std::vector<int> users_ GUARDED_BY(mu_);  // per link: unfinished transfers crossing it
  std::map<uint64_t, Transfer> transfers_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  Clock::time_point now_ GUARDED_BY(mu_);  // how far the model has advanced
};

}  // namespace hiber::device::sim
