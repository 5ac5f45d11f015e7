// The node's data paths and the transfers on them: how long a swap's bytes take to arrive.
//
// Links (from the same NodeConfig the simulated GPU uses, through scheduler::Topology):
//   - one host link per PCIe switch, host-to-device bandwidth from the config, shared by every
//     GPU behind the switch (Torpor Fig. 5: GPU pairs share a switch);
//   - one peer link per pair of GPUs with a direct path (an NVLink, or an NVSwitch both are on),
//     at Topology::peer_gbps. A copy between GPUs without a direct path crosses PCIe as a host
//     load does; the scheduler never asks for one (placement.h).
//
// Sharing. Transfers on one link split its bandwidth equally (processor sharing), and no
// transfer goes faster than `transfer_efficiency` of the link alone: a swap moves 2 MB groups,
// each ended by a synchronisation (Torpor §4.3), so one transfer leaves the link idle between
// groups, and a second transfer fills those gaps. With the fitted efficiency of 0.88 a lone
// swap gets 88% of the switch, two concurrent ones 50% each. This reproduces the paper's
// Table 3 (docs/sim.md): ResNet-152 swapped next to a continuous Bert-qa swap slows from 29 to
// 43 ms in the paper and from 28 to 47 ms here; Bert-qa next to ResNet-152 from 149 to 240 ms
// in the paper and from 130 to 222 ms here.
//
// The NVSwitch case is simplified: each pair of GPUs is its own link, so two copies into one GPU
// do not contend. Torpor's node has point-to-point NVLink, where that is exact.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/topology.h"
#include "sim/event_queue.h"

namespace hiber::sim {

struct LinkOptions {
  // The share of a link one transfer achieves alone; fitted with PipelineOptions::setup.
  double transfer_efficiency = 0.88;
};

// Told about a transfer's progress. `tag` is what the starter passed.
class TransferListener {
 public:
  virtual ~TransferListener() = default;
  // The transfer's rate is about to change: `bytes_done` have arrived by t.
  virtual void transfer_progress(uint64_t tag, Time t, double bytes_done) = 0;
  virtual void transfer_done(uint64_t tag, Time t) = 0;
};

class LinkModel final : public EventHandler {
 public:
  LinkModel(const scheduler::Topology& topology, EventQueue* queue, const LinkOptions& options);

  // The PCIe switch of GPU g.
  int host_link(int gpu) const { return host_link_of_gpu_[gpu]; }
  // The direct link between two GPUs, or -1.
  int peer_link(int a, int b) const;
  int active_transfers(int link) const { return static_cast<int>(links_[link].active.size()); }

  // Starts moving `bytes` on `link` now. The listener hears of it until transfer_done.
  void start(int link, uint64_t bytes, TransferListener* listener, uint64_t tag);

  // The rate one of n concurrent transfers gets on `link`, bytes per ns (= GB/s).
  double share(int link, int n) const;

  void on_event(int kind, uint64_t arg, Time now) override;

 private:
  struct Transfer {
    int link = -1;
    double bytes = 0;
    double done = 0;
    double rate = 0;  // bytes per ns
    Time since = 0;   // `done` is as of this time
    uint32_t version = 0;
    TransferListener* listener = nullptr;
    uint64_t tag = 0;
  };
  struct Link {
    double gbps = 0;
    std::vector<uint32_t> active;  // transfer slots
  };

  // Brings every transfer on `link` up to `now`, gives them the new equal share, and
  // reschedules their completions.
  void reshare(int link, Time now);

  EventQueue* queue_;
  LinkOptions options_;
  std::vector<Link> links_;
  std::vector<int> host_link_of_gpu_;
  std::vector<int> peer_link_;  // gpu_count x gpu_count
  int gpu_count_ = 0;
  std::vector<Transfer> transfers_;
  std::vector<uint32_t> free_slots_;
};

}  // namespace hiber::sim
