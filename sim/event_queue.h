// Simulated time and the pending events: the heart of the discrete-event loop.
//
// An event is a (time, handler, kind, argument) tuple; the handler is whatever part of the
// simulated node scheduled it (the link model, a node). Events at the same time run in the order
// they were scheduled (a sequence number breaks ties), so a run is a pure function of its inputs.
// Nothing is ever cancelled: a handler that reschedules something bumps a version it keeps and
// ignores events carrying an older one, which is cheaper than deleting from a heap.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/types.h"

namespace hiber::sim {

using scheduler::Time;

class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void on_event(int kind, uint64_t arg, Time now) = 0;
};

class EventQueue {
 public:
  // REQUIRES: time >= now(); an event in the past is a bug of the caller.
  void schedule(Time time, EventHandler* handler, int kind, uint64_t arg);

  bool empty() const { return heap_.empty(); }
  // REQUIRES: !empty().
  Time next_time() const { return heap_.front().time; }
  // Advances the clock to the earliest event and runs it. REQUIRES: !empty().
  void run_next();

  Time now() const { return now_; }
  // Moves the clock forward (an arrival between events). Never backwards.
  void advance_to(Time time);

  uint64_t executed() const { return executed_; }

 private:
  struct Event {
    Time time;
    uint64_t seq;
    EventHandler* handler;
    int kind;
    uint64_t arg;
  };
  // Heap order: the earliest (time, seq) on top.
  static bool later(const Event& a, const Event& b) {
    return a.time != b.time ? a.time > b.time : a.seq > b.seq;
  }

  std::vector<Event> heap_;
  uint64_t next_seq_ = 0;
  uint64_t executed_ = 0;
  Time now_ = 0;
};

}  // namespace hiber::sim
