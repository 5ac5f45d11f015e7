// Torpor's RRC queue (§5.2): two priority groups split by an adaptive RRC threshold, earliest
// deadline first within a group, late requests demoted. The rule and its rationale are in
// queue.h.
#include <bit>
#include <cstdint>

#include "scheduler/queue.h"

namespace hiber::scheduler {
namespace {

constexpr uint32_t kNil = FunctionQueues::kNil;

class RrcQueue final : public QueuePolicy {
 public:
  explicit RrcQueue(const QueueOptions& options) : options_(options) {}

  std::string_view name() const override { return "rrc"; }

  void add_function(FunctionIndex f) override {
    queues_.add_function(f);
    if (f.value() >= low_.size()) {
      low_.resize(size_t{f.value()} + 1, 0);
      cursor_.resize(size_t{f.value()} + 1, kNil);
    }
  }

  void invalidate() override { refresh_due_ = true; }

  void push(const QueuedRequest& request, const QueueContext& ctx) override {
    const FunctionIndex f = request.function;
    if (queues_.lane_size(f) == 0) {
      low_[f.value()] = group_is_low(f, ctx);
      cursor_[f.value()] = kNil;
    }
    queues_.push_back(request);
    // Until a request of f is feasible, none before it was: the new one may be the first.
    const uint32_t e = queues_.find(request.id);
    if (cursor_[f.value()] == kNil && !late(f, e, ctx)) cursor_[f.value()] = e;
    relist(f, ctx);
  }

  bool erase(RequestId request, const QueueContext& ctx) override {
    const uint32_t e = queues_.find(request);
    if (e == kNil) return false;
    remove(e, ctx);
    return true;
  }

  void erase_function(FunctionIndex f, std::vector<RequestId>* out) override {
    queues_.erase_lane(f, out);
    cursor_[f.value()] = kNil;
    queues_.relist(f, QueueKey{});
  }

  bool contains(RequestId request) const override { return queues_.find(request) != kNil; }
  size_t size() const override { return queues_.size(); }

  void set_eligible(FunctionIndex f, bool eligible, const QueueContext& ctx) override {
    queues_.set_eligible(f, eligible);
    relist(f, ctx);
  }

  void on_completion(FunctionIndex f, const QueueContext& ctx) override {
    if (queues_.lane_size(f) == 0) return;  // its group is decided when a request comes
    low_[f.value()] = group_is_low(f, ctx);
    relist(f, ctx);
  }

  void begin_round(const QueueContext& ctx) override {
    if (refresh_due_ || ctx.now - last_refresh_ >= options_.threshold_refresh) refresh(ctx);
  }

  bool next(const QueueContext& ctx, QueueCandidate* out) override {
    while (!queues_.empty()) {
      const FunctionIndex f = queues_.top();
      // Lazy re-keying: time only ever raises a key (requests turn late), so the top is right
      // once its stored key is still its key now.
      const QueueKey key = key_of(f, ctx);
      if (key != queues_.key(f)) {
        queues_.relist(f, key);
        continue;
      }
      const uint32_t e = offered(f);
      out->request = queues_.request(e).id;
      out->function = f;
      out->allowed = ~GpuMask{0};
      out->entry = e;
      out->lane = 0;
      return true;
    }
    return false;
  }

  void take(const QueueCandidate& candidate, const QueueContext& ctx) override {
    remove(candidate.entry, ctx);
  }

  void pass(const QueueCandidate& candidate, const QueueContext&) override {
    queues_.pass(candidate.function);
  }

  void end_round(const QueueContext& ctx) override {
    for (FunctionIndex f : queues_.end_round()) relist(f, ctx);
  }

  Time next_wakeup() const override { return INT64_MAX; }

  Status check_invariants() const override {
    HIBER_RETURN_IF_ERROR(queues_.check_invariants());
    for (FunctionIndex f{0}; f.value() < cursor_.size(); f = FunctionIndex{f.value() + 1}) {
      if (cursor_[f.value()] == kNil) continue;
      bool found = false;
      for (uint32_t e = queues_.front(f); e != kNil && !found; e = queues_.next(e))
        found = e == cursor_[f.value()];
      if (!found)
        return error(ErrorCode::kIllegalState, "rrc: the first feasible request of function index ",
                     f, " is not in its lane");
    }
    return Status();
  }

 private:
  bool group_is_low(FunctionIndex f, const QueueContext& ctx) const {
    return !threshold_.high(function_rrc(ctx.functions, f, ctx.now), ctx.functions.id(f));
  }

  // The request cannot meet its deadline even if it started now on a GPU holding its model.
  bool late(FunctionIndex f, uint32_t e, const QueueContext& ctx) const {
    return options_.demote_late &&
           ctx.now + ctx.functions.exec_estimate(f) > queues_.request(e).deadline;
  }

  // The request f offers: its first feasible one, else its oldest.
  uint32_t offered(FunctionIndex f) const {
    return cursor_[f.value()] != kNil ? cursor_[f.value()] : queues_.front(f);
  }

  // (group, late, deadline (or arrival) of the offered request, id); moves f's first-feasible
  // cursor past requests that have turned late.
  QueueKey key_of(FunctionIndex f, const QueueContext& ctx) {
    uint32_t& cursor = cursor_[f.value()];
    while (cursor != kNil && late(f, cursor, ctx)) cursor = queues_.next(cursor);
    const uint32_t e = offered(f);
    const QueuedRequest& r = queues_.request(e);
    return QueueKey{low_[f.value()], cursor == kNil ? 1 : 0,
                    options_.earliest_deadline_first ? r.deadline : r.arrival,
                    ctx.functions.id(f).value()};
  }

  void relist(FunctionIndex f, const QueueContext& ctx) {
    queues_.relist(f, queues_.should_list(f) ? key_of(f, ctx) : QueueKey{});
  }

  void remove(uint32_t e, const QueueContext& ctx) {
    const FunctionIndex f = queues_.request(e).function;
    if (cursor_[f.value()] == e) cursor_[f.value()] = queues_.next(e);
    queues_.erase(e);
    relist(f, ctx);
  }

  // The threshold rule of queue.h, then every queued function's group against it.
  void refresh(const QueueContext& ctx) {
    const FunctionTable& functions = ctx.functions;
    const Duration window = functions.window_options().length;
    demands_.clear();
    for (FunctionIndex i{0}; i.value() < functions.slots(); i = FunctionIndex{i.value() + 1}) {
      // A function whose last arrival is a window ago has none in it: skip it unread.
      if (!functions.live(i) || ctx.now - functions.stats(i).last_arrival >= window) continue;
      const WindowTotals t = functions.stats(i).window.totals(ctx.now);
      if (t.arrivals == 0) continue;
      demands_.push_back(RrcDemand{
          required_request_count(functions.spec(i).tail_percentile, t.completions, t.on_time),
          functions.id(i), functions.demand(i, ctx.now, t)});
    }
    const double capacity = std::popcount(ctx.node.healthy()) * options_.target_utilisation;
    threshold_ = rrc_threshold(demands_, capacity);
    last_refresh_ = ctx.now;
    refresh_due_ = false;
    for (FunctionIndex f{0}; f.value() < low_.size(); f = FunctionIndex{f.value() + 1}) {
      if (queues_.lane_size(f) == 0) continue;
      low_[f.value()] = group_is_low(f, ctx);
      relist(f, ctx);
    }
  }

  QueueOptions options_;
  FunctionQueues queues_;
  std::vector<uint8_t> low_;      // per function: in the low-priority group
  std::vector<uint32_t> cursor_;  // per function: its first feasible queued request, or kNil
  RrcThreshold threshold_;
  Time last_refresh_ = 0;
  bool refresh_due_ = true;
  std::vector<RrcDemand> demands_;  // refresh scratch
};

}  // namespace

std::unique_ptr<QueuePolicy> make_rrc_queue(const QueueOptions& options) {
  return std::make_unique<RrcQueue>(options);
}

}  // namespace hiber::scheduler
