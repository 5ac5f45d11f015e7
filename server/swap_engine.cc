#include "server/swap_engine.h"

#include <algorithm>

namespace hiber::server {

SwapEngine::SwapEngine(device::Device& device, int gpu_count, uint64_t group_bytes)
    : device_(device), group_bytes_(group_bytes), events_(gpu_count) {}

SwapEngine::~SwapEngine() { release(); }

void SwapEngine::release() {
  for (std::vector<device::Event>& pool : events_) {
    for (const device::Event& e : pool) (void)device_.destroy_event(e);
    pool.clear();
  }
}

void SwapEngine::forget_gpu(int gpu) { events_[gpu].clear(); }

Result<device::Event> SwapEngine::event(device::Stream stream, size_t index) {
  // A session's swaps onto a GPU all run in its one context there, where the events are made.
  std::vector<device::Event>& pool = events_[stream.gpu];
  const device::Context context{stream.context, stream.gpu};
  while (pool.size() <= index) {
    HIBER_ASSIGN_OR_RETURN(device::Event e, device_.create_event(context, /*disable_timing=*/true));
    pool.push_back(e);
  }
  return pool[index];
}

device::Event SwapEngine::group_event(int gpu, int32_t group) const {
  return events_[gpu][static_cast<size_t>(group)];
}

Result<std::vector<int32_t>> SwapEngine::start(int gpu, device::Stream stream,
                                               std::span<const Transfer> transfers) {
  flags_ = std::make_shared<Flags>();
  flags_->complete.store(transfers.empty());
  groups_ = 0;
  moved_ = 0;
  started_ = std::chrono::steady_clock::now();
  std::vector<int32_t> completes_in;
  completes_in.reserve(transfers.size());
  uint64_t in_group = 0;
  auto close_group = [&]() -> Status {
    HIBER_ASSIGN_OR_RETURN(device::Event e, event(stream, static_cast<size_t>(groups_)));
    HIBER_RETURN_IF_ERROR(device_.record_event(e, stream));
    ++groups_;
    in_group = 0;
    return Status();
  };
  Status enqueued;
  for (const Transfer& t : transfers) {
    // Large blocks go in group-sized pieces, so the link stays busy and groups stay small.
    const uint64_t piece = group_bytes_ == 0 ? t.bytes : group_bytes_;
    for (uint64_t off = 0; off < t.bytes && enqueued.ok(); off += piece) {
      const uint64_t n = std::min(piece, t.bytes - off);
      if (t.from_gpu) {
        enqueued = device_.copy_peer(stream, t.dst + off, gpu, t.from_va + off, *t.from_gpu, n);
      } else {
        enqueued = device_.copy_host_to_device(stream, t.dst + off, t.host + off, n);
      }
      in_group += n;
      if (enqueued.ok() && (group_bytes_ == 0 ? off + n == t.bytes : in_group >= group_bytes_)) {
        enqueued = close_group();
      }
    }
    if (!enqueued.ok()) break;
    // The block is complete when the group holding its last byte is.
    completes_in.push_back(in_group == 0 ? groups_ - 1 : groups_);
    moved_ += t.bytes;
  }
  if (enqueued.ok() && in_group > 0) enqueued = close_group();
  if (!enqueued.ok()) {
    flags_->failed.store(true);
    flags_->complete.store(true);
    return enqueued;
  }
  return completes_in;
}

Status SwapEngine::report_end(device::Stream stream, SwapDone on_done) {
  return device_.add_callback(
      stream, [flags = flags_, on_done = std::move(on_done), moved = moved_,
               groups = static_cast<uint32_t>(groups_), started = started_](Status status) {
        flags->failed.store(!status.ok());
        flags->complete.store(true);
        SwapReport report;
        report.bytes = moved;
        report.groups = groups;
        report.duration_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - started)
                                 .count();
        on_done(status, report);
      });
}

}  // namespace hiber::server
