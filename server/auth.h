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

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace hiber::server {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The credentials of the process at the other end of a connected Unix socket.
Result<PeerCredentials> peer_credentials(int socket_fd);

// Reads the token at `path`, or creates it (32 random bytes as hex, mode 0600) if the file does
// not exist. kNotPermitted if the file is readable by others than its owner: a token anybody can
// read protects nothing.
Result<std::string> load_or_create_token(const std::string& path);

// Compares a presented token `a` with the secret `b` in time that depends only on b's length.
bool tokens_equal(std::string_view a, std::string_view b);

// Parses "0,1000,1001" into uids. kInvalidValue naming the bad entry.
Result<std::vector<uid_t>> parse_uid_list(std::string_view list);

}  // namespace hiber::server
