#include "tests/integration/wedged_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace hiber::testing {
namespace {

// Enough to fill any queue listen(fd, 0) gives (Linux queues one connection).
constexpr int kMaxQueueFillers = 64;

sockaddr_un address_of(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  return address;
}

}  // namespace

WedgedListener::WedgedListener(Wedge wedge) {
  char dir[] = "/tmp/hiber-wedged-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return;
  dir_ = dir;
  path_ = dir_ + "/hiberd.sock";
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const sockaddr_un address = address_of(path_);
  if (!listener_ ||
      ::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener_.get(), wedge == Wedge::kQueueFull ? 0 : 16) != 0) {
    return;
  }
  if (wedge == Wedge::kSilent) {
    ready_ = true;
    acceptor_ = std::thread([this] { accept_loop(); });
    return;
  }
  // Non-blocking connects queue until the queue is full, then fail with EAGAIN.
  for (int i = 0; i < kMaxQueueFillers; ++i) {
    UniqueFd filler(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!filler) return;
    if (::connect(filler.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) !=
        0) {
      ready_ = errno == EAGAIN;
      return;
    }
    held_.push_back(std::move(filler));
  }
}

WedgedListener::~WedgedListener() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  if (!path_.empty()) ::unlink(path_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

void WedgedListener::accept_loop() {
  std::vector<UniqueFd> accepted;  // held open, never read
  while (!stop_) {
    pollfd p{.fd = listener_.get(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    UniqueFd connection(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection) continue;
    accepted.push_back(std::move(connection));
    ++accepted_;
  }
}

}  // namespace hiber::testing
