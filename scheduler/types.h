// The few names every part of scheduler/ shares: time, ids, GPU sets and where a load comes from.
//
// scheduler/ is a pure library (docs/design.md): it never reads a clock, so time is whatever
// the caller says it is. hiberd passes its steady clock, hiber-sim its simulated clock; both in
// nanoseconds. Time must not go backwards between calls; a smaller `now` is taken as the latest
// time seen (the scheduler never fails on it).
#pragma once

#include <cstdint>
#include <limits>

#include "common/ids.h"

namespace hiber::scheduler {

// Nanoseconds on the caller's clock (any epoch).
using Time = int64_t;
// Nanoseconds.
using Duration = int64_t;

inline constexpr Duration kMicrosecond = 1'000;
inline constexpr Duration kMillisecond = 1'000'000;
inline constexpr Duration kSecond = 1'000'000'000;

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// A function (one tenant, one model). The caller (hiberd, hiber-sim) chooses the numbers.
using FunctionId = hiber::FunctionId;

// A request the scheduler has accepted. Built by the scheduler: the low 32 bits are a slot, the
// high 32 bits a generation, so a stale id never names a later request. "None" is
// std::optional<RequestId>.
using RequestId = hiber::RequestId;

// Dense internal index of a registered function (FunctionTable). Policies use it to keep
// per-function state in vectors (indexed by .value()) instead of hash maps. "None" is
// std::optional<FunctionIndex>.
using FunctionIndex = StrongId<struct FunctionIndexTag, uint32_t>;

// A set of GPUs, bit g for GPU g. Topology refuses nodes with more than kMaxGpus GPUs.
using GpuMask = uint64_t;
inline constexpr int kMaxGpus = 64;
inline constexpr GpuMask gpu_bit(int gpu) { return GpuMask{1} << gpu; }

// Where the model of a placed request comes from.
enum class Source : uint8_t {
  kResident,  // already on the chosen GPU: no swap
  kPeer,      // copied GPU-to-GPU from another GPU's replica (NVLink)
  kHost,      // copied from the authoritative host copy over PCIe
};

const char* source_name(Source source);

}  // namespace hiber::scheduler
