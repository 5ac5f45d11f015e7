// A Unix socket in a fresh temporary folder that stands in for a wedged hiberd: one that accepts
// nothing while its listen queue is full, or one that accepts and never answers. Clients that
// connect to it must give up on their own deadline.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"

namespace hiber::testing {

class WedgedListener {
 public:
  enum class Wedge {
    kQueueFull,  // never accepts; the queue is filled, so a blocking connect waits
    kSilent,     // accepts every connection, then reads and writes nothing
  };

  explicit WedgedListener(Wedge wedge);
  ~WedgedListener();
  WedgedListener(const WedgedListener&) = delete;
  WedgedListener& operator=(const WedgedListener&) = delete;

  const std::string& path() const { return path_; }
  // kQueueFull: whether the queue was filled (a connect to it would block); kSilent: true.
  bool ready() const { return ready_; }
  // kSilent: the connections accepted so far.
  int accepted() const { return accepted_.load(); }

 private:
  void accept_loop();

  std::string dir_;
  std::string path_;
  UniqueFd listener_;
  bool ready_ = false;
  std::vector<UniqueFd> held_;  // kQueueFull: the connections that fill the queue
  std::atomic<int> accepted_{0};
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
};

}  // namespace hiber::testing
