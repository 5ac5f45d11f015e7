#include "scheduler/function_queues.h"

namespace hiber::scheduler {

void FunctionQueues::add_function(FunctionIndex f) {
  if (f.value() >= lanes_.size()) lanes_.resize(size_t{f.value()} + 1);
}

void FunctionQueues::push_back(const QueuedRequest& r, int64_t tag) {
  const uint32_t e = slot_of(r.id);
  if (e >= entries_.size()) entries_.resize(static_cast<size_t>(e) + 1);
  Lane& lane = lanes_[r.function.value()];
  Entry& entry = entries_[e];
  entry.request = r;
  entry.tag = tag;
  entry.prev = lane.tail;
  entry.next = kNil;
  entry.used = true;
  if (lane.tail == kNil) {
    lane.head = e;
  } else {
    entries_[lane.tail].next = e;
  }
  lane.tail = e;
  ++lane.size;
  ++size_;
}

void FunctionQueues::erase(uint32_t e) {
  Entry& entry = entries_[e];
  Lane& lane = lanes_[entry.request.function.value()];
  if (entry.prev == kNil) {
    lane.head = entry.next;
  } else {
    entries_[entry.prev].next = entry.next;
  }
  if (entry.next == kNil) {
    lane.tail = entry.prev;
  } else {
    entries_[entry.next].prev = entry.prev;
  }
  entry.used = false;
  entry.prev = entry.next = kNil;
  --lane.size;
  --size_;
}

void FunctionQueues::erase_lane(FunctionIndex f, std::vector<RequestId>* out) {
  while (lanes_[f.value()].head != kNil) {
    const uint32_t e = lanes_[f.value()].head;
    if (out != nullptr) out->push_back(entries_[e].request.id);
    erase(e);
  }
}

uint32_t FunctionQueues::find(RequestId id) const {
  const uint32_t e = slot_of(id);
  if (e >= entries_.size() || !entries_[e].used || entries_[e].request.id != id) return kNil;
  return e;
}

void FunctionQueues::pass(FunctionIndex f) {
  Lane& lane = lanes_[f.value()];
  if (lane.passed) return;
  lane.passed = true;
  passed_.push_back(f);
  unlist(f);
}

const std::vector<FunctionIndex>& FunctionQueues::end_round() {
  ended_.swap(passed_);
  passed_.clear();
  for (FunctionIndex f : ended_) lanes_[f.value()].passed = false;
  return ended_;
}

void FunctionQueues::relist(FunctionIndex f, const QueueKey& key) {
  if (!should_list(f)) {
    unlist(f);
    return;
  }
  Lane& lane = lanes_[f.value()];
  if (lane.position < 0) {
    lane.key = key;
    heap_.push_back(f);
    lane.position = static_cast<int32_t>(heap_.size() - 1);
    sift_up(heap_.size() - 1);
    return;
  }
  const bool smaller = key < lane.key;
  lane.key = key;
  if (smaller) {
    sift_up(static_cast<size_t>(lane.position));
  } else {
    sift_down(static_cast<size_t>(lane.position));
  }
}

void FunctionQueues::unlist(FunctionIndex f) {
  Lane& lane = lanes_[f.value()];
  if (lane.position < 0) return;
  const size_t i = static_cast<size_t>(lane.position);
  lane.position = -1;
  const FunctionIndex last = heap_.back();
  heap_.pop_back();
  if (i == heap_.size()) return;
  place(i, last);
  sift_up(i);
  sift_down(static_cast<size_t>(lanes_[last.value()].position));
}

void FunctionQueues::place(size_t i, FunctionIndex f) {
  heap_[i] = f;
  lanes_[f.value()].position = static_cast<int32_t>(i);
}

void FunctionQueues::sift_up(size_t i) {
  const FunctionIndex f = heap_[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!less(f, heap_[parent])) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, f);
}

void FunctionQueues::sift_down(size_t i) {
  const FunctionIndex f = heap_[i];
  const size_t n = heap_.size();
  while (true) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && less(heap_[child + 1], heap_[child])) ++child;
    if (!less(heap_[child], f)) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, f);
}

Status FunctionQueues::check_invariants() const {
  size_t total = 0;
  for (FunctionIndex f{0}; f.value() < lanes_.size(); f = FunctionIndex{f.value() + 1}) {
    const Lane& lane = lanes_[f.value()];
    uint32_t count = 0;
    uint32_t prev = kNil;
    for (uint32_t e = lane.head; e != kNil; e = entries_[e].next) {
      const Entry& entry = entries_[e];
      if (!entry.used || entry.request.function != f || entry.prev != prev)
        return error(ErrorCode::kIllegalState, "queue lane of function index ", f,
                     " is broken at entry ", e);
      if (prev != kNil && entries_[prev].request.arrival_index >= entry.request.arrival_index)
        return error(ErrorCode::kIllegalState, "queue lane of function index ", f,
                     " is out of arrival order at entry ", e);
      prev = e;
      if (++count > lane.size) break;
    }
    if (count != lane.size || prev != lane.tail)
      return error(ErrorCode::kIllegalState, "queue lane of function index ", f, " holds ", count,
                   " entries, its size says ", lane.size);
    total += lane.size;
    if (lane.passed)
      return error(ErrorCode::kIllegalState, "function index ", f, " is passed outside a round");
    if (should_list(f) != (lane.position >= 0))
      return error(ErrorCode::kIllegalState, "function index ", f,
                   should_list(f) ? " has requests to offer but is not in the heap"
                                  : " is in the heap with nothing to offer");
    if (lane.position >= 0 && (static_cast<size_t>(lane.position) >= heap_.size() ||
                               heap_[static_cast<size_t>(lane.position)] != f))
      return error(ErrorCode::kIllegalState, "heap position of function index ", f, " is wrong");
  }
  if (total != size_)
    return error(ErrorCode::kIllegalState, "queue lanes hold ", total, " requests, size says ",
                 size_);
  for (size_t i = 1; i < heap_.size(); ++i) {
    if (less(heap_[i], heap_[(i - 1) / 2]))
      return error(ErrorCode::kIllegalState, "queue heap out of order at ", i);
  }
  return Status();
}

}  // namespace hiber::scheduler
