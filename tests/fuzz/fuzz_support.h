// What the harnesses share. A broken promise is a glog CHECK: it aborts, and libFuzzer saves
// the input as a crash. Production code logs its refusals at WARNING; the harnesses keep only
// errors, so libFuzzer's own report stays readable.
#pragma once

#include <glog/logging.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace hiber::fuzz {

inline void quiet_logging() { FLAGS_minloglevel = google::GLOG_ERROR; }

inline std::span<const std::byte> bytes_of(const uint8_t* data, size_t size) {
  return std::as_bytes(std::span(data, size));
}

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

}  // namespace hiber::fuzz
