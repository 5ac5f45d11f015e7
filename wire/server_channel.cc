#include "wire/server_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include <glog/logging.h>

namespace hiber::wire {

Result<std::unique_ptr<ServerChannel>> ServerChannel::create(const ChannelConfig& config) {
  HIBER_ASSIGN_OR_RETURN(const ChannelLayout layout, make_layout(config));
  UniqueFd memfd(::memfd_create("hiber-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd) return os_error("memfd_create");
  if (::ftruncate(memfd.get(), static_cast<off_t>(layout.memfd_bytes)) != 0) {
    return os_error(str_cat("ftruncate to ", layout.memfd_bytes, " bytes"));
  }
  // F_SEAL_SEAL too: nobody may add seals later (a write seal would break the channel).
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return os_error("sealing the channel memfd");
  }
  void* base =
      ::mmap(nullptr, layout.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (base == MAP_FAILED) return os_error(str_cat("mmap of ", layout.memfd_bytes, " bytes"));

  // The memfd is zero-filled; start the objects' lifetimes and stamp the header.
  const ChannelViews views = views_of(static_cast<std::byte*>(base), layout);
  ChannelHeader* header = new (views.header) ChannelHeader();
  header->magic = kChannelMagic;
  header->layout_version = kChannelLayoutVersion;
  init_ring(views.requests);
  init_ring(views.completions);
  return std::unique_ptr<ServerChannel>(
      new ServerChannel(std::move(memfd), static_cast<std::byte*>(base), layout));
}

ServerChannel::ServerChannel(UniqueFd memfd, std::byte* base, ChannelLayout layout)
    : memfd_(std::move(memfd)),
      base_(base),
      layout_(layout),
      views_(views_of(base, layout)),
      requests_(views_.requests),
      completions_(views_.completions) {}

ServerChannel::~ServerChannel() {
  close();  // the client learns at once, not only when the socket closes
  if (::munmap(base_, layout_.memfd_bytes) != 0) PLOG(ERROR) << "munmap of a channel";
}

Status ServerChannel::receive(Message& out, std::chrono::nanoseconds timeout) {
  if (closed()) return Status(ErrorCode::kDeinitialized, "the channel is closed");
  if (interrupted_.exchange(false)) return Status(ErrorCode::kNotReady, "interrupted");
  Status status = requests_.read(
      out, [this] { return closed() || interrupted_.load(std::memory_order_acquire); }, timeout);
  // The ring reports any cancellation as closed; tell an interruption apart.
  if (status.code() == ErrorCode::kDeinitialized && !closed() && interrupted_.exchange(false)) {
    return Status(ErrorCode::kNotReady, "interrupted");
  }
  return status;
}

void ServerChannel::interrupt() {
  interrupted_.store(true, std::memory_order_release);
  ring_always(views_.requests.header->not_empty);
}

Status ServerChannel::send(capnp::MessageBuilder& message, std::chrono::nanoseconds timeout) {
  std::lock_guard lock(send_mutex_);
  if (closed()) return Status(ErrorCode::kDeinitialized, "the channel is closed");
  const auto pieces = frame_pieces(message, frame_table_);
  if (timeout != std::chrono::nanoseconds::max()) {
    uint64_t total = 0;
    for (const auto& piece : pieces) total += piece.size();
    if (total > max_unfragmented_message_bytes()) {
      return error(ErrorCode::kInvalidValue, "a message of ", total,
                   " bytes cannot be sent with a time limit: at most ",
                   max_unfragmented_message_bytes(), " bytes travel as one record");
    }
  }
  const auto deadline =
      doorbell_internal::deadline_after(std::chrono::steady_clock::now(), timeout);
  bool timed_out = false;
  const Status status = completions_.write(
      pieces,
      [&] {
        if (closed()) return false;
        // The clock is read only while waiting for room, and only with a finite timeout.
        if (deadline != std::chrono::steady_clock::time_point::max() &&
            std::chrono::steady_clock::now() >= deadline) {
          timed_out = true;
          return false;
        }
        return true;
      },
      // A client blocked on a full request ring would not drain our completions: wake it.
      [this] { ring(views_.requests.header->not_full); });
  if (timed_out && !closed()) {
    return error(ErrorCode::kTimeout, "no room on the completion ring within ",
                 std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(),
                 " ms: the client is not reading");
  }
  return status;
}

uint64_t ServerChannel::max_unfragmented_message_bytes() const {
  return wire::max_unfragmented_message_bytes(views_.completions.capacity);
}

void ServerChannel::release_staging(uint64_t end) {
  std::lock_guard lock(staging_mutex_);
  if (end <= staging_released_) return;
  staging_released_ = end;
  views_.header->staging_released.store(end, std::memory_order_release);
  ring(views_.header->staging_bell);
}

void ServerChannel::close() {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  views_.header->server_closed.store(1, std::memory_order_release);
  // Unconditionally: the client can write the sleeper counts, and this wake-up must not be lost.
  for (const RingView* view : {&views_.requests, &views_.completions}) {
    ring_always(view->header->not_empty);
    ring_always(view->header->not_full);
  }
  ring_always(views_.header->staging_bell);
}

}  // namespace hiber::wire
