#include "common/paths.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace hiber {

std::string default_run_dir() {
  if (const char* dir = std::getenv("HIBER_RUN_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (::geteuid() == 0) return "/run/hiber";
  return "/tmp/hiber-" + std::to_string(::geteuid());
}

std::string function_socket_path(const std::string& run_dir) { return run_dir + "/hiberd.sock"; }
std::string control_socket_path(const std::string& run_dir) { return run_dir + "/control.sock"; }
std::string auth_token_path(const std::string& run_dir) { return run_dir + "/auth-token"; }

std::string client_auth_token_file(const std::string& run_dir) {
  const char* file = std::getenv("HIBER_AUTH_TOKEN_FILE");
  return file != nullptr && *file != '\0' ? file : auth_token_path(run_dir);
}

std::string control_token_path(const std::string& control_socket) {
  const size_t slash = control_socket.rfind('/');
  if (slash == std::string::npos) return "control-token";
  return control_socket.substr(0, slash + 1) + "control-token";
}

Result<std::string> client_auth_token(const std::string& token_file) {
  if (const char* token = std::getenv("HIBER_AUTH_TOKEN"); token != nullptr && *token != '\0') {
    return std::string(token);
  }
  std::ifstream in(token_file);
  if (!in) {
    return error(ErrorCode::kNotPermitted, "cannot read the auth token ", token_file, ": ",
                 std::strerror(errno),
                 " (set HIBER_AUTH_TOKEN, or HIBER_AUTH_TOKEN_FILE to the file that holds it)");
  }
  std::string token;
  std::getline(in, token);
  if (token.empty())
    return error(ErrorCode::kNotPermitted, "auth token file ", token_file, " is empty");
  return token;
}

Status write_port_file(const std::string& path, uint16_t port) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) return os_error("write " + temporary);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return os_error("rename " + temporary + " to " + path);
  }
  return Status();
}

}  // namespace hiber
