// The Torpor-FIFO ablation (§7.3): queued requests in arrival order across all functions.
#include <cstdint>

#include "scheduler/queue.h"

namespace hiber::scheduler {
namespace {

constexpr uint32_t kNil = FunctionQueues::kNil;

class FifoQueue final : public QueuePolicy {
 public:
  std::string_view name() const override { return "fifo"; }

  void add_function(FunctionIndex f) override { queues_.add_function(f); }
  void invalidate() override {}

  void push(const QueuedRequest& request, const QueueContext&) override {
    queues_.push_back(request);
    relist(request.function);
  }

  bool erase(RequestId request, const QueueContext&) override {
    const uint32_t e = queues_.find(request);
    if (e == kNil) return false;
    remove(e);
    return true;
  }

  void erase_function(FunctionIndex f, std::vector<RequestId>* out) override {
    queues_.erase_lane(f, out);
    relist(f);
  }

  bool contains(RequestId request) const override { return queues_.find(request) != kNil; }
  size_t size() const override { return queues_.size(); }

  void set_eligible(FunctionIndex f, bool eligible, const QueueContext&) override {
    queues_.set_eligible(f, eligible);
    relist(f);
  }

  void on_completion(FunctionIndex, const QueueContext&) override {}
  void begin_round(const QueueContext&) override {}

  bool next(const QueueContext&, QueueCandidate* out) override {
    if (queues_.empty()) return false;
    const FunctionIndex f = queues_.top();
    const uint32_t e = queues_.front(f);
    out->request = queues_.request(e).id;
    out->function = f;
    out->allowed = ~GpuMask{0};
    out->entry = e;
    out->lane = 0;
    return true;
  }

  void take(const QueueCandidate& candidate, const QueueContext&) override {
    remove(candidate.entry);
  }

  void pass(const QueueCandidate& candidate, const QueueContext&) override {
    queues_.pass(candidate.function);
  }

  void end_round(const QueueContext&) override {
    for (FunctionIndex f : queues_.end_round()) relist(f);
  }

  Time next_wakeup() const override { return INT64_MAX; }
  Status check_invariants() const override { return queues_.check_invariants(); }

 private:
  // A function competes by the arrival index of its oldest request: unique, so no ties.
  void relist(FunctionIndex f) {
    const bool any = queues_.lane_size(f) > 0;
    queues_.relist(
        f, any ? QueueKey{static_cast<int64_t>(queues_.request(queues_.front(f)).arrival_index), 0,
                          0, 0}
               : QueueKey{});
  }

  void remove(uint32_t e) {
    const FunctionIndex f = queues_.request(e).function;
    queues_.erase(e);
    relist(f);
  }

  FunctionQueues queues_;
};

}  // namespace

std::unique_ptr<QueuePolicy> make_fifo_queue() { return std::make_unique<FifoQueue>(); }

}  // namespace hiber::scheduler
