// The eviction rankings that need no model of the future or of utility: Torpor's heaviness
// order and the classic LRU, LFU and Random, plus BeladyMIN (which only needs the oracle).
#include <limits>

#include "scheduler/eviction.h"

namespace hiber::scheduler {
namespace {

class HeavinessEviction final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "heaviness"; }
  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    for (EvictionCandidate& c : candidates) {
      c.key = ctx.functions.heavy(c.function) ? 1 : 0;
      c.key2 = static_cast<double>(c.last_used);
    }
  }
};

class LruEviction final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void score(std::span<EvictionCandidate> candidates, const EvictionContext&) override {
    for (EvictionCandidate& c : candidates) c.key = static_cast<double>(c.last_used);
  }
};

class LfuEviction final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lfu"; }
  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    for (EvictionCandidate& c : candidates) {
      c.key = static_cast<double>(ctx.functions.stats(c.function).requests);
      c.key2 = static_cast<double>(c.last_used);
    }
  }
};

class RandomEviction final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "random"; }
  // Random keys in candidate order give a uniformly random leaving order: the same as drawing
  // victims one by one until the model fits.
  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    for (EvictionCandidate& c : candidates) c.key = ctx.rng.uniform_double();
  }
};

class BeladyEviction final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "belady"; }
  // Farthest next request first; models never requested again (B = +inf) before all others,
  // ties to the lower id (the convention of CremeBrulee's Table I).
  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    for (EvictionCandidate& c : candidates) {
      const double b = ctx.oracle ? ctx.oracle->requests_until_next(c.id, ctx.arrival_index)
                                  : std::numeric_limits<double>::infinity();
      c.key = -b;
    }
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_heaviness_eviction() {
  return std::make_unique<HeavinessEviction>();
}
std::unique_ptr<EvictionPolicy> make_lru_eviction() { return std::make_unique<LruEviction>(); }
std::unique_ptr<EvictionPolicy> make_lfu_eviction() { return std::make_unique<LfuEviction>(); }
std::unique_ptr<EvictionPolicy> make_random_eviction() {
  return std::make_unique<RandomEviction>();
}
std::unique_ptr<EvictionPolicy> make_belady_eviction() {
  return std::make_unique<BeladyEviction>();
}

}  // namespace hiber::scheduler
