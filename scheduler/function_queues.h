// The machinery every queue policy shares (queue.h): each function's queued requests in arrival
// order, and an indexed min-heap of the functions that may be offered to the dispatcher, keyed
// by whatever the policy orders by.
//
// Why per-function lanes and a heap of functions rather than one heap of requests: a function's
// requests share one model and one SLO, so the order across functions is all a policy decides,
// and a dispatcher that cannot start a function's head request (no GPU can take its model, the
// function is at its concurrency limit) skips the whole function in O(log functions) instead of
// walking past each of its requests. Every operation here is O(1) or O(log functions); nothing
// walks the functions.
//
// A function is in the heap ("listed") exactly when it has queued requests, is eligible (below
// its concurrency limit) and has not been passed over in the current dispatch round. relist()
// restores that rule after any change; the policy supplies the key.
//
// Entries are addressed by the request's slot (the low 32 bits of its RequestId, types.h), so
// storage is one vector indexed like the Scheduler's request table and never allocates per
// request once it has grown.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

// A request as the queue sees it.
struct QueuedRequest {
  RequestId id;
  FunctionIndex function{0};
  Time arrival = 0;
  Time deadline = 0;           // arrival + the function's SLO
  uint64_t arrival_index = 0;  // 0-based order of acceptance across the node
};

// Lexicographic: the function with the smallest key is offered first. Policies end their keys
// with the FunctionId, so that ties replay.
using QueueKey = std::array<int64_t, 4>;

class FunctionQueues {
 public:
  static constexpr uint32_t kNil = UINT32_MAX;

  // Makes room for function indices up to f.
  void add_function(FunctionIndex f);

  // ---- Requests ----
  // Appends r to its function's lane; `tag` is the policy's own number for it (gShare keeps its
  // slack deadline there). REQUIRES: r.id's slot is not queued.
  void push_back(const QueuedRequest& r, int64_t tag = 0);
  // Removes the entry (any position in its lane). Does not relist its function.
  void erase(uint32_t entry);
  // Removes every entry of f's lane, appending their ids to `out` (if not null) in arrival
  // order. Does not relist f.
  void erase_lane(FunctionIndex f, std::vector<RequestId>* out);
  // The entry of a queued request, or kNil.
  uint32_t find(RequestId id) const;

  const QueuedRequest& request(uint32_t entry) const { return entries_[entry].request; }
  int64_t tag(uint32_t entry) const { return entries_[entry].tag; }
  uint32_t front(FunctionIndex f) const { return lanes_[f.value()].head; }
  uint32_t next(uint32_t entry) const { return entries_[entry].next; }
  uint32_t lane_size(FunctionIndex f) const {
    return f.value() < lanes_.size() ? lanes_[f.value()].size : 0;
  }
  // Queued requests in all lanes.
  size_t size() const { return size_; }

  // ---- Which functions may be offered ----
  // false while f is at its concurrency limit (the Scheduler says when).
  void set_eligible(FunctionIndex f, bool eligible) { lanes_[f.value()].ineligible = !eligible; }
  // Passed over in this dispatch round: unlisted until end_round().
  void pass(FunctionIndex f);
  // Clears the passed flags and returns the functions that had one, each once, for the policy
  // to relist. The list stays valid until the next end_round().
  const std::vector<FunctionIndex>& end_round();

  // Puts f in the heap with `key` if it should be listed (see above), or takes it out.
  void relist(FunctionIndex f, const QueueKey& key);
  bool should_list(FunctionIndex f) const {
    const Lane& l = lanes_[f.value()];
    return l.size > 0 && !l.ineligible && !l.passed;
  }
  bool empty() const { return heap_.empty(); }
  FunctionIndex top() const { return heap_.front(); }
  const QueueKey& key(FunctionIndex f) const { return lanes_[f.value()].key; }

  // Lanes are well-linked, sizes add up, the heap is ordered and lists exactly the functions
  // should_list() names (outside a dispatch round). kIllegalState naming the first break.
  Status check_invariants() const;

 private:
  struct Entry {
    QueuedRequest request{.id = RequestId{0}};  // meaningful while used
    int64_t tag = 0;
    uint32_t prev = kNil;
    uint32_t next = kNil;
    bool used = false;
  };
  struct Lane {
    uint32_t head = kNil;
    uint32_t tail = kNil;
    uint32_t size = 0;
    int32_t position = -1;  // index in heap_, -1 when unlisted
    bool ineligible = false;
    bool passed = false;
    QueueKey key{};
  };

  static uint32_t slot_of(RequestId id) { return static_cast<uint32_t>(id.value()); }
  bool less(FunctionIndex a, FunctionIndex b) const {
    return lanes_[a.value()].key < lanes_[b.value()].key;
  }
  void place(size_t i, FunctionIndex f);
  void sift_up(size_t i);
  void sift_down(size_t i);
  void unlist(FunctionIndex f);

  std::vector<Entry> entries_;  // by request slot
  std::vector<Lane> lanes_;     // by function index
  std::vector<FunctionIndex> heap_;
  std::vector<FunctionIndex> passed_;
  std::vector<FunctionIndex> ended_;  // end_round()'s answer
  size_t size_ = 0;
};

}  // namespace hiber::scheduler
