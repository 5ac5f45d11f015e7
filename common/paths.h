// Where hiberd's sockets and auth token live, for the daemon and for every client.
//
// The run directory is $HIBER_RUN_DIR if set, else /run/hiber for root and /tmp/hiber-<uid>
// for other users (so developers run hiberd without privileges). Clients find the token in
// $HIBER_AUTH_TOKEN, or else in $HIBER_AUTH_TOKEN_FILE (a secret mounted anywhere), or else in
// the run directory's auth-token file. Operators and the router
// find the control token in the control-token file beside the control socket.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace hiber {

std::string default_run_dir();
std::string function_socket_path(const std::string& run_dir);  // <run_dir>/hiberd.sock
std::string control_socket_path(const std::string& run_dir);   // <run_dir>/control.sock
std::string auth_token_path(const std::string& run_dir);       // <run_dir>/auth-token
// The file a client reads its token from: $HIBER_AUTH_TOKEN_FILE if set, else
// auth_token_path(run_dir).
std::string client_auth_token_file(const std::string& run_dir);
// The control token's default file: "control-token" in the control socket's directory (so
// <run_dir>/control-token), where hiberd creates it and its clients look for it.
std::string control_token_path(const std::string& control_socket);

// Writes `port` and a newline to `path` whole or not at all (a temporary file renamed), so that
// a script or test waiting for the file never reads half a number: the --*_port_file flags.
Status write_port_file(const std::string& path, uint16_t port);

// The token a client presents: $HIBER_AUTH_TOKEN if set, else the first line of `token_file`.
// A missing, unreadable or empty file is an error naming it.
Result<std::string> client_auth_token(const std::string& token_file);

}  // namespace hiber
