// The worker protocol's frames (docs/router.md, "Worker protocol"), shared by hiber-router and
// the function SDK. I/O-free: the router feeds bytes from its event loop, the SDK from a
// blocking socket.
//
//   u32 header_bytes (LE) | u64 body_bytes (LE) | header (a JSON object) | body
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace hiber::router {

inline constexpr uint32_t kMaxWorkerHeaderBytes = 64 << 10;
inline constexpr uint64_t kMaxWorkerBodyBytes = 1ull << 30;
inline constexpr size_t kWorkerPrefixBytes = 4 + 8;

struct WorkerFrame {
  nlohmann::json header;  // always an object
  std::string body;
};

// One frame. REQUIRES: the header is an object whose text is at most kMaxWorkerHeaderBytes and
// the body at most kMaxWorkerBodyBytes (the reader on the other side rejects larger ones).
// Strings that are not valid UTF-8 are sent with U+FFFD in place of the bad bytes.
std::string encode_worker_frame(const nlohmann::json& header, std::string_view body);

// Accumulates stream bytes until one frame is complete.
class WorkerFrameReader {
 public:
  // Consumes bytes; returns how many it used. It stops after one complete frame (take() it,
  // then feed the rest) and consumes nothing once complete or failed.
  size_t feed(std::string_view bytes);

  bool complete() const { return complete_; }

  // Set for a header length of 0 or above kMaxWorkerHeaderBytes, a body length above
  // kMaxWorkerBodyBytes, or a header that is not a JSON object; the stream is then unusable.
  const Status& error() const { return error_; }

  // REQUIRES: complete(). The frame; the reader starts over for the next one.
  WorkerFrame take();

 private:
  void parse_header();

  char prefix_[kWorkerPrefixBytes] = {};
  size_t prefix_received_ = 0;
  uint32_t header_bytes_ = 0;
  uint64_t body_bytes_ = 0;
  std::string header_text_;
  bool have_header_ = false;
  bool complete_ = false;
  WorkerFrame frame_;
  Status error_;
};

}  // namespace hiber::router
