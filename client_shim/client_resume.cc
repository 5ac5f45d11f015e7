// Resuming the session after hiberd restarts (client.h, "After hiberd restarts"; docs/shim.md,
// "When hiberd restarts").
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include <glog/logging.h>

#include "client_shim/client.h"
#include "common/unique_fd.h"
#include "wire/socket_frame.h"

namespace hiber::shim {
namespace {

// HIBER_RESUME_TIMEOUT_MS: how long a lost session waits for hiberd to come back.
std::chrono::milliseconds resume_timeout() {
  constexpr unsigned long long kDefault = 60000, kMost = 24ull * 3600 * 1000;
  const char* value = std::getenv("HIBER_RESUME_TIMEOUT_MS");
  if (value == nullptr || *value == '\0') return std::chrono::milliseconds(kDefault);
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  return std::chrono::milliseconds(end != nullptr && *end == '\0' ? std::min(parsed, kMost)
                                                                  : kDefault);
}

constexpr auto kRetryInterval = std::chrono::milliseconds(50);
constexpr auto kRestartCheckInterval = std::chrono::milliseconds(500);

}  // namespace

Status Client::lost_session_locked(const Status& why, bool answer_lost) {
  if (why.code() != ErrorCode::kDeinitialized || !calls_) return why;
  session_lost_ = true;
  if (unsynced_streams_.empty() && !answer_lost) {
    // Nothing was in flight: the next call resumes, and nothing is lost. The call at hand
    // (one that only made or freed something) is in the journal and is replayed.
    return Status();
  }
  if (unsynced_streams_.empty()) {
    return Status(ErrorCode::kDeviceUnavailable,
                  "hiberd restarted while this call waited for its answer; the next call "
                  "resumes the session");
  }
  // Reported here, once; the work of the streams that had some is gone.
  unsynced_streams_.clear();
  LOG(WARNING) << "hibercuda: the session with hiberd was lost (" << why.message()
               << "): the work in flight is lost; the next call resumes the session";
  return Status(ErrorCode::kDeviceUnavailable,
                "hiberd restarted (its session was lost): the work queued before the restart "
                "was lost; later calls run in the resumed session");
}

Status Client::check_session_locked() {
  if (!resume_failed_.ok()) return resume_failed_;
  // Idle, a dead hiberd would go unnoticed until the work queued now is lost. The watcher says
  // so at once; asking the socket too (a system call) covers the moment before the watcher has
  // run, at most once per interval so that a program's idle queries stay cheap.
  constexpr auto kSocketCheckInterval = std::chrono::milliseconds(1);
  if (!session_lost_ && unsynced_streams_.empty() && calls_->batched_calls() == 0) {
    if (gone_session_.load(std::memory_order_acquire) == sessions_resumed_ + 1) {
      session_lost_ = true;
    } else if (const auto now = std::chrono::steady_clock::now();
               now - last_socket_check_ >= kSocketCheckInterval) {
      last_socket_check_ = now;
      if (!calls_->channel().server_alive()) session_lost_ = true;
    }
  }
  if (session_lost_) return resume_locked();
  return Status();
}

// The socket file's inode: a restarted hiberd binds a new one.
std::optional<ino_t> socket_inode(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return st.st_ino;
}

void Client::watcher_main() {
  while (true) {
    UniqueFd socket;
    uint64_t resumed = 0;
    std::string path;
    {
      std::lock_guard lock(mu_);
      if (forked_child_ || !resume_failed_.ok()) return;
      // Its own descriptor: a resume by a call closes the channel's while this one waits.
      socket = UniqueFd(::fcntl(calls_->channel().socket_fd(), F_DUPFD_CLOEXEC, 0));
      resumed = sessions_resumed_;
      path = connect_options_.socket_path;
    }
    if (!socket) return;
    const std::optional<ino_t> served_by = socket_inode(path);
    // A killed hiberd's sockets may stay open for a while (the kernel tears its io_uring down
    // after it), so a new socket file tells of a restart too: checked once per interval.
    while (true) {
      pollfd p{.fd = socket.get(), .events = POLLRDHUP, .revents = 0};
      const int ready = ::poll(&p, 1, static_cast<int>(kRestartCheckInterval.count()));
      if (ready > 0) break;
      if (ready < 0 && errno != EINTR) break;
      const std::optional<ino_t> now = socket_inode(path);
      if (now && served_by && *now != *served_by) {
        // A call waiting for the old hiberd notices at once, and lets go of the core.
        ::shutdown(socket.get(), SHUT_RDWR);
        break;
      }
    }
    // hiberd is gone: wait for the next one without holding the core, so that the program (and
    // its exit) is not held up by the wait, only by the resume itself. An idle call meanwhile
    // waits for it too (check_session_locked) instead of queueing work into the lost session.
    gone_session_.store(resumed + 1, std::memory_order_release);
    const auto deadline = std::chrono::steady_clock::now() + resume_timeout();
    while (!wire::connect_unix(path, kRetryInterval).ok() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kRetryInterval);
    }
    std::lock_guard lock(mu_);
    if (forked_child_) return;
    if (sessions_resumed_ != resumed) continue;  // a call resumed it meanwhile
    session_lost_ = true;
    if (!resume_locked(deadline).ok()) return;
  }
}

Status Client::resume_locked(std::optional<std::chrono::steady_clock::time_point> deadline) {
  const bool work_lost = !unsynced_streams_.empty();
  Status resumed = reconnect_locked(deadline.value_or(std::chrono::steady_clock::now() +
                                                      resume_timeout()));
  if (!resumed.ok()) {
    resume_failed_ = Status(ErrorCode::kDeviceUnavailable,
                            str_cat("hiberd restarted and the session could not be resumed: ",
                                    resumed.message()));
    LOG(ERROR) << "hibercuda: " << resume_failed_.message();
    return resume_failed_;
  }
  session_lost_ = false;
  ++sessions_resumed_;
  if (work_lost) {
    // Not reported yet (no call was waiting for it): the next synchronisation says so.
    calls_->set_error(Status(ErrorCode::kDeviceUnavailable,
                             "hiberd restarted (its session was lost): the work queued before "
                             "the restart was lost; later calls run in the resumed session"));
  }
  return Status();
}

Status Client::reconnect_locked(std::chrono::steady_clock::time_point deadline) {
  const SessionJournal journal = std::move(journal_);
  journal_ = SessionJournal();
  // Each try resumes the session the last one gave (its token): a hiberd may die again while a
  // session is being replayed into it.
  while (true) {
    const wire::SessionInfo old = calls_->session();
    if (old.resume_token.empty()) {
      return Status(ErrorCode::kNotSupported, "hiberd keeps no state (--keep_sessions=false)");
    }
    const std::span<std::byte> old_arena = calls_->channel().arena();
    wire::ClientOptions options = connect_options_;
    options.resume_token = old.resume_token;
    Result<std::unique_ptr<wire::ClientChannel>> channel = Status(ErrorCode::kNoDevice, "");
    std::minstd_rand rng(static_cast<unsigned>(::getpid()));
    std::uniform_real_distribution<double> retry_jitter(0.0, 1.0);
    while (true) {
      channel = wire::ClientChannel::connect(options);
      // Down, not listening yet, or the killed one's socket still accepting and then reset:
      // hiberd is restarting. Busy (every function of the node resumes at once, and a connection
      // not yet served may be dropped for a newer one; or it is stopping, or at its session
      // limit): later. Anything else is its answer.
      const ErrorCode code = channel.status().code();
      if (channel.ok() || (code != ErrorCode::kNoDevice && code != ErrorCode::kTimeout &&
                           code != ErrorCode::kDeinitialized &&
                           code != ErrorCode::kDeviceUnavailable)) {
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return channel.status().with_context(
            str_cat("hiberd did not come back within HIBER_RESUME_TIMEOUT_MS=",
                    resume_timeout().count()));
      }
      // Spread out, so that the node's sessions do not all come back in the same instant again.
      std::this_thread::sleep_for(kRetryInterval + kRetryInterval * retry_jitter(rng));
    }
    HIBER_RETURN_IF_ERROR(channel.status());
    const wire::SessionInfo now = (*channel)->session();
    if (!now.resumed || now.grant.va_base != old.grant.va_base ||
        now.grant.va_bytes != old.grant.va_bytes ||
        (*channel)->arena().size() != old_arena.size()) {
      return Status(ErrorCode::kIllegalState,
                    "hiberd gave the session another address range or arena");
    }
    // The program's pinned memory lives in the arena: its bytes move to the new one, which then
    // takes the old one's place, so the program's pointers stay good.
    std::memcpy((*channel)->arena().data(), old_arena.data(), old_arena.size());
    calls_.reset();  // unmaps the old channel, arena included
    HIBER_RETURN_IF_ERROR((*channel)->move_arena(old_arena.data()));
    calls_ = std::make_unique<wire::CallClient>(std::move(channel).value(), call_options_);
    unsynced_streams_.clear();
    idle_as_of_.reset();
    journal_ = SessionJournal();
    session_lost_ = false;
    const Status replayed = replay_locked(journal);
    if (replayed.ok() && !session_lost_) {
      LOG(WARNING) << "hibercuda: hiberd restarted; session " << now.session_id
                   << " resumes the lost one (" << now.restored.size()
                   << " model blocks restored by hiberd, " << journal.blocks.size()
                   << " allocations, " << journal.streams.size() << " streams, "
                   << journal.modules.size() << " modules, " << journal.library_handles.size()
                   << " library handles)";
      return Status();
    }
    if (!session_lost_ && replayed.code() != ErrorCode::kDeinitialized) return replayed;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(ErrorCode::kDeinitialized, "hiberd went away again while it was resumed");
    }
    LOG(WARNING) << "hibercuda: hiberd went away again while session " << now.session_id
                 << " was resumed; trying again";
  }
}

Status Client::replay_locked(SessionJournal old) {
  // Blocks: the model's came back with their contents; the others come back empty (scratch,
  // whose contents no request may count on: a swap does not keep them either).
  std::map<uint64_t, uint64_t> restored;
  for (const wire::DeviceRange& range : calls_->session().restored) restored[range.va] = range.bytes;
  for (const auto& [va, bytes] : restored) {
    auto it = old.blocks.find(va);
    if (it == old.blocks.end() || it->second != bytes) {
      HIBER_RETURN_IF_ERROR(calls_->enqueue(wire::calls::MemFree{.va = va}));
    }
  }
  for (const auto& [va, bytes] : old.blocks) {
    auto it = restored.find(va);
    if (it == restored.end() || it->second != bytes) {
      HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::MemAllocate{.va = va, .bytes = bytes}));
    } else {
      journal_.blocks[va] = bytes;
    }
  }
  for (const auto& [handle, module] : old.modules) {
    module->wire = wire::ModuleHandle();
    HIBER_RETURN_IF_ERROR(load_module_as_locked(module, handle));
  }
  for (const auto& [handle, get] : old.functions) HIBER_RETURN_IF_ERROR(enqueue_locked(get));
  for (const auto& [handle, create] : old.streams) HIBER_RETURN_IF_ERROR(enqueue_locked(create));
  for (const auto& [handle, create] : old.events) HIBER_RETURN_IF_ERROR(enqueue_locked(create));
  for (const auto& [handle, create] : old.library_handles) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(create));
  }
  for (const SessionJournal::LibraryState& state : old.library_state) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::LibraryCall{
        .stream = wire::StreamHandle(), .handle = state.handle, .op = state.op, .args = state.args}));
  }
  // Executable graphs are defined again from the calls they keep.
  for (auto& [handle, exec] : graph_execs_) {
    for (GraphExecObj::Piece& piece : exec->pieces) piece.graph.reset();
    HIBER_RETURN_IF_ERROR(define_pieces_locked(exec.get()));
  }
  // Everything replayed must have worked before the program goes on.
  auto replayed = calls_->call(wire::calls::DeviceSynchronize{});
  Status sticky = calls_->take_error();
  unsynced_streams_.clear();
  if (!replayed.ok()) return replayed.status().with_context("replaying the session");
  return sticky.with_context("replaying the session");
}

}  // namespace hiber::shim
