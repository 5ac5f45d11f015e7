// gShare's Dual-Queue Lazy Scheduling, mapped onto a Hiber node (queue.h explains the mapping
// and the ambiguities it resolves).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "scheduler/queue.h"

namespace hiber::scheduler {
namespace {

constexpr uint32_t kNil = FunctionQueues::kNil;
constexpr uint32_t kCacheLane = 0;
constexpr uint32_t kSlackLane = 1;

// The GPU choice for one slack-queue request.
struct GpuChoice {
  int best = -1;            // largest non-negative margin over healthy GPUs, or -1
  int best_available = -1;  // largest margin over available GPUs (any sign), or -1
};

class GshareQueue final : public QueuePolicy {
 public:
  explicit GshareQueue(const QueueOptions& options) : scale_(1 + options.gshare_redundancy) {}

  std::string_view name() const override { return "gshare"; }

  void add_function(FunctionIndex f) override {
    cache_.add_function(f);
    slack_.add_function(f);
  }

  void invalidate() override {}

  void push(const QueuedRequest& request, const QueueContext& ctx) override {
    const FunctionIndex f = request.function;
    const Time latest_start = request.deadline - predict(ctx.functions.swap_estimate(f)) -
                              predict(ctx.functions.exec_estimate(f));
    if (latest_start < request.arrival) {
      cache_.push_back(request);
      relist_cache(f);
    } else {
      slack_.push_back(request, latest_start);
      relist_slack(f);
    }
  }

  bool erase(RequestId request, const QueueContext&) override {
    if (const uint32_t e = cache_.find(request); e != kNil) {
      const FunctionIndex f = cache_.request(e).function;
      cache_.erase(e);
      relist_cache(f);
      return true;
    }
    if (const uint32_t e = slack_.find(request); e != kNil) {
      const FunctionIndex f = slack_.request(e).function;
      slack_.erase(e);
      relist_slack(f);
      return true;
    }
    return false;
  }

  void erase_function(FunctionIndex f, std::vector<RequestId>* out) override {
    // A function's requests may sit in both queues (its estimates changed between arrivals);
    // RequestIds do not say the arrival order, so merge the two lanes by arrival index.
    uint32_t a = cache_.front(f);
    uint32_t b = slack_.front(f);
    while (a != kNil || b != kNil) {
      const bool from_cache = b == kNil || (a != kNil && cache_.request(a).arrival_index <
                                                             slack_.request(b).arrival_index);
      if (from_cache) {
        out->push_back(cache_.request(a).id);
        a = cache_.next(a);
      } else {
        out->push_back(slack_.request(b).id);
        b = slack_.next(b);
      }
    }
    cache_.erase_lane(f, nullptr);
    slack_.erase_lane(f, nullptr);
    relist_cache(f);
    relist_slack(f);
  }

  bool contains(RequestId request) const override {
    return cache_.find(request) != kNil || slack_.find(request) != kNil;
  }
  size_t size() const override { return cache_.size() + slack_.size(); }

  void set_eligible(FunctionIndex f, bool eligible, const QueueContext&) override {
    cache_.set_eligible(f, eligible);
    slack_.set_eligible(f, eligible);
    relist_cache(f);
    relist_slack(f);
  }

  void on_completion(FunctionIndex, const QueueContext&) override {}

  void begin_round(const QueueContext&) override { wakeup_ = INT64_MAX; }

  bool next(const QueueContext& ctx, QueueCandidate* out) override {
    // The cache queue first, in arrival order, wherever the placement policy finds locality.
    if (!cache_.empty()) {
      const FunctionIndex f = cache_.top();
      offer(cache_.front(f), f, kCacheLane, ~GpuMask{0}, cache_, out);
      return true;
    }
    // Then the slack queue, smallest slack first, lazily.
    while (!slack_.empty()) {
      const FunctionIndex f = slack_.top();
      const uint32_t e = slack_.front(f);
      const Time latest_start = slack_.tag(e);
      const GpuChoice choice = choose(f, slack_.request(e), ctx);
      const GpuMask available = ctx.node.available();
      if (choice.best >= 0 && (available & gpu_bit(choice.best)) != 0) {
        offer(e, f, kSlackLane, gpu_bit(choice.best), slack_, out);
        return true;
      }
      if (choice.best >= 0 && ctx.now < latest_start) {
        // Its best GPU is busy and it can afford to wait for it: come back when the slack
        // runs out, or earlier if an event (that GPU finishing) brings a round.
        slack_.pass(f);
        wakeup_ = std::min(wakeup_, latest_start);
        continue;
      }
      if (choice.best_available >= 0) {
        offer(e, f, kSlackLane, gpu_bit(choice.best_available), slack_, out);
        return true;
      }
      slack_.pass(f);
    }
    return false;
  }

  void take(const QueueCandidate& candidate, const QueueContext&) override {
    if (candidate.lane == kCacheLane) {
      cache_.erase(candidate.entry);
      relist_cache(candidate.function);
    } else {
      slack_.erase(candidate.entry);
      relist_slack(candidate.function);
    }
  }

  void pass(const QueueCandidate& candidate, const QueueContext&) override {
    (candidate.lane == kCacheLane ? cache_ : slack_).pass(candidate.function);
  }

  void end_round(const QueueContext&) override {
    for (FunctionIndex f : cache_.end_round()) relist_cache(f);
    for (FunctionIndex f : slack_.end_round()) relist_slack(f);
  }

  Time next_wakeup() const override { return wakeup_; }

  Status check_invariants() const override {
    HIBER_RETURN_IF_ERROR(cache_.check_invariants());
    return slack_.check_invariants();
  }

 private:
  // The historical mean with gShare's redundancy.
  Duration predict(Duration mean) const {
    return static_cast<Duration>(std::llround(static_cast<double>(mean) * scale_));
  }

  static void offer(uint32_t e, FunctionIndex f, uint32_t lane, GpuMask allowed,
                    const FunctionQueues& queues, QueueCandidate* out) {
    out->request = queues.request(e).id;
    out->function = f;
    out->allowed = allowed;
    out->entry = e;
    out->lane = lane;
  }

  // Predicted time until GPU g is free: the rest of the request running there.
  Duration remaining(int g, const QueueContext& ctx) const {
    const GpuState& gpu = ctx.node.gpu(g);
    if (!gpu.running) return 0;
    const FunctionIndex f = *gpu.running_function;
    Duration service = predict(ctx.functions.exec_estimate(f));
    const Replica* replica = ctx.node.find(g, f);
    if (replica != nullptr && replica->loading) service += predict(ctx.functions.swap_estimate(f));
    return std::max<Duration>(0, ctx.started[static_cast<size_t>(g)] + service - ctx.now);
  }

  // Predicted time to bring f's model onto g: 0 if resident, a peer copy over the fastest link
  // from a holder, else the host swap.
  Duration swap_to(FunctionIndex f, int g, const QueueContext& ctx) const {
    const GpuMask holders = ctx.node.holders(f);
    if ((holders & gpu_bit(g)) != 0) return 0;
    const Topology& topology = ctx.node.topology();
    double gbps = 0;
    for (GpuMask h = holders; h != 0; h &= h - 1)
      gbps = std::max(gbps, topology.peer_gbps(g, std::countr_zero(h)));
    if (gbps > 0) {
      // bytes / (GB/s) = ns.
      const double ns = static_cast<double>(ctx.functions.spec(f).model_bytes) / gbps;
      return static_cast<Duration>(std::llround(ns * scale_));
    }
    return predict(ctx.functions.swap_estimate(f));
  }

  // findAvailSharedSlice over our GPUs, plus the best idle one.
  GpuChoice choose(FunctionIndex f, const QueuedRequest& request, const QueueContext& ctx) const {
    const NodeState& node = ctx.node;
    const uint64_t bytes = ctx.functions.spec(f).model_bytes;
    const Duration exec = predict(ctx.functions.exec_estimate(f));
    GpuChoice choice;
    Duration best_margin = 0;
    Duration best_available_margin = 0;
    for (GpuMask m = node.healthy(); m != 0; m &= m - 1) {
      const int g = std::countr_zero(m);
      if (node.usable_bytes(g) < bytes) continue;
      const bool idle = (node.available() & gpu_bit(g)) != 0;
      const Duration margin =
          request.deadline - ctx.now - (idle ? 0 : remaining(g, ctx)) - swap_to(f, g, ctx) - exec;
      // Ascending g: a strictly larger margin wins, an equal one only moves to an idle GPU.
      const bool best_idle = choice.best >= 0 && (node.available() & gpu_bit(choice.best)) != 0;
      if (margin >= 0 && (choice.best < 0 || margin > best_margin ||
                          (margin == best_margin && idle && !best_idle))) {
        choice.best = g;
        best_margin = margin;
      }
      if (idle && (choice.best_available < 0 || margin > best_available_margin)) {
        choice.best_available = g;
        best_available_margin = margin;
      }
    }
    return choice;
  }

  void relist_cache(FunctionIndex f) {
    const bool any = cache_.lane_size(f) > 0;
    cache_.relist(
        f,
        any ? QueueKey{static_cast<int64_t>(cache_.request(cache_.front(f)).arrival_index), 0, 0, 0}
            : QueueKey{});
  }

  // Smallest slack first: slack = latest_start - now, so by latest_start; then arrival order.
  void relist_slack(FunctionIndex f) {
    if (slack_.lane_size(f) == 0) {
      slack_.relist(f, QueueKey{});
      return;
    }
    const uint32_t e = slack_.front(f);
    slack_.relist(
        f, QueueKey{slack_.tag(e), static_cast<int64_t>(slack_.request(e).arrival_index), 0, 0});
  }

  double scale_;
  FunctionQueues cache_;
  FunctionQueues slack_;  // entries tagged with their latest start (deadline - I - D)
  Time wakeup_ = INT64_MAX;
};

}  // namespace

std::unique_ptr<QueuePolicy> make_gshare_queue(const QueueOptions& options) {
  return std::make_unique<GshareQueue>(options);
}

}  // namespace hiber::scheduler
