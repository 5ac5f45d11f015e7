#include "common/token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace hiber {
namespace {

constexpr size_t kTokenRandomBytes = 32;
constexpr size_t kMaxTokenFileBytes = 256;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

Result<std::string> create_token(const std::string& path) {
  HIBER_ASSIGN_OR_RETURN(std::string token, random_hex(kTokenRandomBytes));
  // O_EXCL: if another hiberd raced us to it, read theirs instead of overwriting.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) {
    if (errno == EEXIST) return load_or_create_token(path);
    return os_error("creating auth token " + path, errno);
  }
  std::string line = token + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return os_error("writing auth token " + path, errno);
  }
  return token;
}

}  // namespace

Result<std::string> random_hex(size_t bytes) {
  std::string random(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(random.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("getrandom", errno);
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes);
  for (char c : random) {
    const auto b = static_cast<unsigned char>(c);
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

Result<std::string> load_or_create_token(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return create_token(path);
    return os_error("opening auth token " + path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return os_error("stat " + path, errno);
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return error(ErrorCode::kNotPermitted, "auth token ", path,
                 " is accessible to group or others (mode ", std::oct, (st.st_mode & 07777),
                 "); chmod 600 it");
  }
  char buf[kMaxTokenFileBytes + 1];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n < 0) return os_error("reading auth token " + path, errno);
  if (static_cast<size_t>(n) > kMaxTokenFileBytes) {
    return error(ErrorCode::kInvalidValue, "auth token ", path, " is longer than ",
                 kMaxTokenFileBytes, " bytes");
  }
  std::string token = trim(std::string(buf, static_cast<size_t>(n)));
  if (token.empty()) return error(ErrorCode::kInvalidValue, "auth token ", path, " is empty");
  return token;
}

bool tokens_equal(std::string_view a, std::string_view b) {
  // The loop runs over b (the secret) whatever a is, so neither where a differs nor how long it
  // is shows in the time taken (the control token is an operator's, of any length).
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char presented = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(presented ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

}  // namespace hiber
