// Who may talk to hiberd: peer credentials of Unix-socket clients and the node's auth token.
//
// Functions prove two things at the handshake: their process runs as an allowed user (the
// kernel's SO_PEERCRED, which the client cannot forge) and they hold the node's secret token
// (handed to function containers by the platform). Operators and the router on the control
// socket prove the first and hold the control token, another secret, which every control
// request carries; over the TCP control listener, which has no peer credentials, the control
// token is all they prove.
#pragma once

#include <sys/types.h>

#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/token.h"  // load_or_create_token, tokens_equal

namespace hiber::server {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The credentials of the process at the other end of a connected Unix socket.
Result<PeerCredentials> peer_credentials(int socket_fd);

// Parses "0,1000,1001" into uids. kInvalidValue naming the bad entry.
Result<std::vector<uid_t>> parse_uid_list(std::string_view list);

}  // namespace hiber::server
