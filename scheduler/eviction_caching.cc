// The model-caching papers' utility rankings: mCache's importance-aware IAM and CremeBrulee
// (online and oracle). See eviction.h for the formulas, notes-caching-papers.md for the papers.
#include <algorithm>
#include <cmath>
#include <limits>

#include "scheduler/eviction.h"

namespace hiber::scheduler {
namespace {

// penalty x rate / size, the utility both papers share (mCache Eq. 1 with T_i = 1 / rate;
// CremeBrulee Eq. 1 with B' = 1 / rate). Units do not matter, only the order.
double online_utility(FunctionIndex f, const EvictionContext& ctx) {
  const double penalty = static_cast<double>(ctx.functions.swap_estimate(f));
  const double rate = ctx.functions.arrival_rate(f, ctx.now);
  return penalty * rate / static_cast<double>(ctx.functions.spec(f).model_bytes);
}

class McacheEviction final : public EvictionPolicy {
 public:
  explicit McacheEviction(const EvictionOptions& options)
      : b0_(options.mcache_b0 > 0 ? options.mcache_b0 : 1.0),
        refresh_(std::max<Duration>(0, options.mcache_refresh)) {}

  std::string_view name() const override { return "mcache"; }

  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    if (!built_ || ctx.now - last_rebuild_ >= refresh_) rebuild(ctx);
    for (EvictionCandidate& c : candidates) {
      // A model cached since the last rebuild without passing on_loaded (reported loaded by
      // the caller) is ranked now, against the last snapshot, as IQ.set would have.
      c.key = c.function.value() < has_rank_.size() && has_rank_[c.function.value()]
                  ? rank_[c.function.value()]
                  : rank_now(c.function, ctx);
      c.key2 = static_cast<double>(c.last_used);
    }
  }

  void on_loaded(FunctionIndex f, const EvictionContext& ctx) override {
    if (!built_) rebuild(ctx);
    grow(f);
    rank_[f.value()] = rank_now(f, ctx);
    has_rank_[f.value()] = 1;
  }

 private:
  void grow(FunctionIndex f) {
    if (f.value() >= rank_.size()) {
      rank_.resize(f.value() + 1, 0);
      has_rank_.resize(f.value() + 1, 0);
    }
  }

  // Eq. 2 against the last snapshot of the cache: log(#models with lower utility + b0).
  double rank_now(FunctionIndex f, const EvictionContext& ctx) const {
    const double u = online_utility(f, ctx);
    const auto lower = std::lower_bound(snapshot_.begin(), snapshot_.end(), u) - snapshot_.begin();
    return std::log(static_cast<double>(lower) + b0_);
  }

  // The shadow heap of the paper, rebuilt whole: every model cached anywhere on the node (the
  // node's GPUs are one pool) gets its rank among the others.
  void rebuild(const EvictionContext& ctx) {
    built_ = true;
    last_rebuild_ = ctx.now;
    const size_t slots = ctx.functions.slots();
    seen_.assign(slots, 0);
    cached_.clear();
    for (int g = 0; g < ctx.node.gpu_count(); ++g) {
      for (const Replica& r : ctx.node.gpu(g).replicas) {
        if (r.function.value() < slots && !seen_[r.function.value()]) {
          seen_[r.function.value()] = 1;
          cached_.push_back(r.function);
        }
      }
    }
    std::fill(has_rank_.begin(), has_rank_.end(), 0);
    snapshot_.clear();
    for (FunctionIndex f : cached_) snapshot_.push_back(online_utility(f, ctx));
    utilities_ = snapshot_;
    std::sort(snapshot_.begin(), snapshot_.end());
    for (size_t i = 0; i < cached_.size(); ++i) {
      const FunctionIndex f = cached_[i];
      grow(f);
      const auto lower =
          std::lower_bound(snapshot_.begin(), snapshot_.end(), utilities_[i]) - snapshot_.begin();
      rank_[f.value()] = std::log(static_cast<double>(lower) + b0_);
      has_rank_[f.value()] = 1;
    }
  }

  double b0_;
  Duration refresh_;
  bool built_ = false;
  Time last_rebuild_ = 0;
  std::vector<double> rank_;      // per function index
  std::vector<char> has_rank_;    // per function index
  std::vector<double> snapshot_;  // sorted utilities of the cached models at the last rebuild
  // Scratch for rebuild.
  std::vector<char> seen_;
  std::vector<FunctionIndex> cached_;
  std::vector<double> utilities_;
};

class CremeBruleeEviction final : public EvictionPolicy {
 public:
  explicit CremeBruleeEviction(bool oracle) : oracle_(oracle) {}

  std::string_view name() const override { return oracle_ ? "cremebrulee-oracle" : "cremebrulee"; }

  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    for (EvictionCandidate& c : candidates) {
      if (!oracle_) {
        c.key = online_utility(c.function, ctx);
        c.key2 = static_cast<double>(c.last_used);
        continue;
      }
      // penalty / (size x B); B = +inf (never again) gives 0, the first to leave. Ties go to
      // the lower id, the convention of the paper's Table I.
      const double b = ctx.oracle ? ctx.oracle->requests_until_next(c.id, ctx.arrival_index)
                                  : std::numeric_limits<double>::infinity();
      const double penalty = static_cast<double>(ctx.functions.swap_estimate(c.function));
      c.key = std::isinf(b) ? 0.0 : penalty / (static_cast<double>(c.bytes) * b);
    }
  }

  // Largest first among the greedy picks, until enough is free.
  void refine(std::vector<EvictionCandidate>& victims, uint64_t bytes_needed) const override {
    std::stable_sort(
        victims.begin(), victims.end(),
        [](const EvictionCandidate& a, const EvictionCandidate& b) { return a.bytes > b.bytes; });
    uint64_t freed = 0;
    size_t keep = 0;
    while (keep < victims.size() && freed < bytes_needed) freed += victims[keep++].bytes;
    victims.erase(victims.begin() + static_cast<std::ptrdiff_t>(keep), victims.end());
  }

 private:
  bool oracle_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_mcache_eviction(const EvictionOptions& options) {
  return std::make_unique<McacheEviction>(options);
}

std::unique_ptr<EvictionPolicy> make_cremebrulee_eviction(bool oracle) {
  return std::make_unique<CremeBruleeEviction>(oracle);
}

}  // namespace hiber::scheduler
