// Runs a python3 HTTP server for the router client's tests: a child process whose first
// stdout line tells its port, killed when the object goes away.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

namespace hiber::testing {

class PythonServer {
 public:
  // Starts `python3 -u ARGS...` and reads stdout until a line matches `port_pattern` (its first
  // group is the port). port() is 0 when the server did not come up.
  PythonServer(const std::vector<std::string>& args, const std::string& port_pattern) {
    std::vector<std::string> argv = {"python3", "-u"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::execvp("python3", c.data());
      std::fprintf(stderr, "exec python3: %s\n", std::strerror(errno));
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* f = ::fdopen(out[0], "r");
    const std::regex re(port_pattern);
    char line[1024];
    while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
      std::smatch m;
      const std::string s(line);
      if (std::regex_search(s, m, re)) {
        port_ = static_cast<uint16_t>(std::atoi(m[1].str().c_str()));
        break;
      }
    }
    // Later output is not read; the pipe is kept open so the server never gets SIGPIPE.
    stdout_ = f;
  }
  ~PythonServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_ != nullptr) std::fclose(stdout_);
  }
  PythonServer(const PythonServer&) = delete;
  PythonServer& operator=(const PythonServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  FILE* stdout_ = nullptr;
};

}  // namespace hiber::testing
