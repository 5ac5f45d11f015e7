#include "sim/event_queue.h"

#include <algorithm>

#include <glog/logging.h>

namespace hiber::sim {

void EventQueue::schedule(Time time, EventHandler* handler, int kind, uint64_t arg) {
  CHECK_GE(time, now_) << "event scheduled in the past";
  heap_.push_back({time, next_seq_++, handler, kind, arg});
  std::push_heap(heap_.begin(), heap_.end(), later);
}

void EventQueue::run_next() {
  std::pop_heap(heap_.begin(), heap_.end(), later);
  const Event event = heap_.back();
  heap_.pop_back();
  now_ = event.time;
  ++executed_;
  event.handler->on_event(event.kind, event.arg, event.time);
}

void EventQueue::advance_to(Time time) {
  if (time > now_) now_ = time;
}

}  // namespace hiber::sim
