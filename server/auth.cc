#include "server/auth.h"

#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace hiber::server {

Result<PeerCredentials> peer_credentials(int socket_fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return os_error("getsockopt(SO_PEERCRED)", errno);
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

Result<std::vector<uid_t>> parse_uid_list(std::string_view list) {
  std::vector<uid_t> uids;
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    uid_t uid = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), uid);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      return error(ErrorCode::kInvalidValue, "not a uid: '", item, "'");
    }
    uids.push_back(uid);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return uids;
}

}  // namespace hiber::server
