#include "scheduler/placement.h"

#include <bit>

namespace hiber::scheduler {

const char* placement_rule_name(PlacementRule rule) {
  switch (rule) {
    case PlacementRule::kWait: return "wait";
    case PlacementRule::kResident: return "resident";
    case PlacementRule::kPeer: return "peer";
    case PlacementRule::kHostQuietNeighbours: return "host-quiet-neighbours";
    case PlacementRule::kHostLightNeighbours: return "host-light-neighbours";
    case PlacementRule::kHostAny: return "host-any";
    case PlacementRule::kRandom: return "random";
    case PlacementRule::kShared: return "shared";
  }
  return "unknown";
}

namespace {

int lowest(GpuMask mask) { return std::countr_zero(mask); }

// Available GPUs the placement may choose.
GpuMask allowed(const PlacementContext& ctx) { return ctx.node.available() & ~ctx.excluded; }

// Allowed GPUs that could ever hold f's model.
GpuMask candidates(FunctionIndex f, const PlacementContext& ctx) {
  const uint64_t bytes = ctx.functions.spec(f).model_bytes;
  GpuMask out = 0;
  for (GpuMask m = allowed(ctx); m != 0; m &= m - 1) {
    const int g = lowest(m);
    if (ctx.node.usable_bytes(g) >= bytes) out |= gpu_bit(g);
  }
  return out;
}

// The GPU of `set` with the most free bytes, ties to the lowest number; -1 if set is empty.
int most_free(GpuMask set, const NodeState& node) {
  int best = -1;
  uint64_t best_free = 0;
  for (GpuMask m = set; m != 0; m &= m - 1) {
    const int g = lowest(m);
    const uint64_t free = node.free_bytes(g);
    if (best < 0 || free > best_free) {
      best = g;
      best_free = free;
    }
  }
  return best;
}

class Algorithm1Placement final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "algorithm1"; }

  Placement place(FunctionIndex f, const PlacementContext& ctx) override {
    const NodeState& node = ctx.node;
    const Topology& topo = node.topology();
    const GpuMask holders = node.holders(f);  // M

    // Line 5-8: resident on an available GPU.
    if (const GpuMask g = holders & allowed(ctx); g != 0)
      return Placement{lowest(g), Source::kResident, -1, PlacementRule::kResident};

    const GpuMask available = candidates(f, ctx);  // A
    if (available == 0) return Placement{};        // line 2: queue

    // Line 10-11: fastest link between an available GPU and a holder.
    if (holders != 0) {
      int best_g = -1, best_m = -1;
      double best_gbps = 0;
      uint64_t best_free = 0;
      for (GpuMask a = available; a != 0; a &= a - 1) {
        const int g = lowest(a);
        const uint64_t free = node.free_bytes(g);
        for (GpuMask h = holders; h != 0; h &= h - 1) {
          const int m = lowest(h);
          const double gbps = topo.peer_gbps(g, m);
          if (gbps <= 0) continue;
          // Strictly better link, or as fast with more room; iteration order settles the rest
          // (lowest g, then lowest m).
          if (gbps > best_gbps || (gbps == best_gbps && free > best_free)) {
            best_g = g;
            best_m = m;
            best_gbps = gbps;
            best_free = free;
          }
        }
      }
      if (best_g >= 0) return Placement{best_g, Source::kPeer, best_m, PlacementRule::kPeer};
    }

    // Line 13-17: from the host, away from PCIe contention.
    const GpuMask loading = node.host_loading();
    GpuMask quiet = 0, light = 0;
    for (GpuMask a = available; a != 0; a &= a - 1) {
      const int g = lowest(a);
      const GpuMask busy_neighbours = topo.pcie_neighbours(g) & loading;
      if (busy_neighbours == 0) {
        quiet |= gpu_bit(g);
        continue;
      }
      bool all_light = true;
      for (GpuMask n = busy_neighbours; n != 0; n &= n - 1) {
        if (ctx.functions.heavy(*node.gpu(lowest(n)).host_loading)) {
          all_light = false;
          break;
        }
      }
      if (all_light) light |= gpu_bit(g);
    }
    if (quiet != 0)
      return Placement{most_free(quiet, node), Source::kHost, -1,
                       PlacementRule::kHostQuietNeighbours};
    if (light != 0)
      return Placement{most_free(light, node), Source::kHost, -1,
                       PlacementRule::kHostLightNeighbours};
    return Placement{most_free(available, node), Source::kHost, -1, PlacementRule::kHostAny};
  }
};

// The k-th (0-based) set bit of mask.
int nth_bit(GpuMask mask, uint64_t k) {
  for (; k > 0; --k) mask &= mask - 1;
  return lowest(mask);
}

class RandomPlacement final : public PlacementPolicy {
 public:
  std::string_view name() const override { return "random"; }

  Placement place(FunctionIndex f, const PlacementContext& ctx) override {
    const NodeState& node = ctx.node;
    if (const GpuMask g = node.holders(f) & allowed(ctx); g != 0) {
      const int gpu = nth_bit(g, ctx.rng.uniform(static_cast<uint64_t>(std::popcount(g))));
      return Placement{gpu, Source::kResident, -1, PlacementRule::kResident};
    }
    const GpuMask available = candidates(f, ctx);
    if (available == 0) return Placement{};
    const int gpu =
        nth_bit(available, ctx.rng.uniform(static_cast<uint64_t>(std::popcount(available))));
    return Placement{gpu, Source::kHost, -1, PlacementRule::kRandom};
  }
};

}  // namespace

std::unique_ptr<PlacementPolicy> make_algorithm1_placement() {
  return std::make_unique<Algorithm1Placement>();
}

std::unique_ptr<PlacementPolicy> make_random_placement() {
  return std::make_unique<RandomPlacement>();
}

}  // namespace hiber::scheduler
