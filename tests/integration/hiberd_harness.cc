#include "tests/integration/hiberd_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "common/paths.h"
#include "wire/control_client.h"
#include "wire/handshake.h"
#include "wire/message.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::testing {

std::string hiberd_path() { return HIBERD_PATH; }
std::string probe_path() { return HIBER_PROBE_PATH; }
std::string test_client_path() { return HIBER_TEST_CLIENT_PATH; }
std::string kernel_plugin_path() { return HIBER_TEST_KERNEL_PLUGIN; }
#ifdef HIBER_TEST_KERNELS_FATBIN
std::string kernels_fatbin_path() { return HIBER_TEST_KERNELS_FATBIN; }
#else
std::string kernels_fatbin_path() { return ""; }  // built without the CUDA toolkit
#endif

std::vector<std::byte> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const auto* begin = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(begin, begin + s.size());
}

namespace {

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

// The current environment with `env` ("NAME=value") added, replacing variables of the same name.
std::vector<std::string> environment_with(const std::vector<std::string>& env) {
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& extra : env) replaced = replaced || name_of(extra) == name_of(entry);
    if (!replaced) out.push_back(entry);
  }
  out.insert(out.end(), env.begin(), env.end());
  return out;
}

}  // namespace

pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path, unsigned fd_limit,
            const std::vector<std::string>& env) {
  auto args = c_argv(argv);
  // Built before fork: the child only calls async-signal-safe functions until exec.
  const std::vector<std::string> environment = environment_with(env);
  auto envp = c_argv(environment);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (fd_limit != 0) {
      rlimit limit{fd_limit, fd_limit};
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

PipedProcess spawn_piped(const std::vector<std::string>& argv, const std::string& stderr_path,
                         const std::vector<std::string>& env) {
  auto args = c_argv(argv);
  const std::vector<std::string> environment = environment_with(env);
  auto envp = c_argv(environment);
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return {};
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return {};
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    int fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 2);
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  return PipedProcess{pid, in[1], out[0]};
}

int wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return exit_code_of(status);
    if (done < 0) return -1;
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ProgramResult run_program(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  return run_program(argv, {}, timeout);
}

ProgramResult run_program(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          std::chrono::milliseconds timeout) {
  char tmpl[] = "/tmp/hiber-program-XXXXXX";
  int fd = ::mkstemp(tmpl);
  ::close(fd);
  ProgramResult result;
  pid_t pid = spawn(argv, tmpl, 0, env);
  result.exit_code = wait_exit(pid, timeout);
  if (result.exit_code == -1) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  std::ifstream in(tmpl);
  std::ostringstream text;
  text << in.rdbuf();
  result.output = text.str();
  ::unlink(tmpl);
  return result;
}

namespace {

HiberdOptions flag_options(std::vector<std::string> extra_flags, unsigned fd_limit) {
  HiberdOptions options;
  options.extra_flags = std::move(extra_flags);
  options.fd_limit = fd_limit;
  return options;
}

}  // namespace

Hiberd::Hiberd(std::vector<std::string> extra_flags, unsigned fd_limit)
    : Hiberd(flag_options(std::move(extra_flags), fd_limit)) {}

Hiberd::Hiberd(const HiberdOptions& options) {
  char tmpl[] = "/tmp/hiberd-test-XXXXXX";
  run_dir_ = ::mkdtemp(tmpl);
  log_path_ = run_dir_ + "/hiberd.log";
  std::vector<std::string> argv = {hiberd_path(), "--device=" + options.device,
                                   "--run_dir=" + run_dir_};
  if (options.device == "sim") {
    std::string plugins = kernel_plugin_path();
    for (const auto& plugin : options.extra_plugins) plugins += "," + plugin;
    argv.push_back("--sim_kernel_plugins=" + plugins);
  }
  argv.insert(argv.end(), options.extra_flags.begin(), options.extra_flags.end());
  control_token_file_ = hiber::control_token_path(control_socket_path());
  constexpr std::string_view kTokenFlag = "--control_token_file=";
  for (const std::string& flag : options.extra_flags) {
    if (flag.starts_with(kTokenFlag)) control_token_file_ = flag.substr(kTokenFlag.size());
  }
  argv_ = std::move(argv);
  fd_limit_ = options.fd_limit;
  start();
}

size_t Hiberd::wait_for_session_records(size_t records, std::chrono::milliseconds timeout) const {
  const std::string dir = run_dir_ + "/state/sessions";
  auto count = [&] {
    std::error_code ec;
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      n += entry.path().extension() == ".record" ? 1 : 0;
    }
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t n = count();
  while (n < records && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = count();
  }
  return n;
}

void Hiberd::kill_and_restart(std::chrono::milliseconds pause) {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::this_thread::sleep_for(pause);
  restart();
}

int Hiberd::stop_and_restart() {
  const int status = stop();
  restart();
  return status;
}

void Hiberd::restart() {
  ::rename(log_path_.c_str(), (log_path_ + ".run-" + std::to_string(++restarts_)).c_str());
  start();
  // The killed hiberd's sockets may accept a little longer (the kernel tears its io_uring down
  // after it): ready once the new one says it serves.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (pid_ > 0 && log().find("hiberd serving functions on") == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the restarted hiberd did not serve within 30 s:\n" << log();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Hiberd::start() {
  pid_ = spawn(argv_, log_path_, fd_limit_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    // Ready once the control socket accepts (a status query may be refused on purpose).
    if (wire::connect_unix(control_socket_path()).ok()) return;
    int status_word = 0;
    if (::waitpid(pid_, &status_word, WNOHANG) == pid_) {
      pid_ = -1;
      ADD_FAILURE() << "hiberd exited at start:\n" << log();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "hiberd did not answer within 30 s:\n" << log();
}

Hiberd::~Hiberd() {
  if (pid_ > 0) stop();
  std::system(("rm -rf " + run_dir_).c_str());
}

std::string Hiberd::socket_path() const { return function_socket_path(run_dir_); }
std::string Hiberd::control_socket_path() const { return hiber::control_socket_path(run_dir_); }

Result<wire::ControlClient> Hiberd::control(std::chrono::milliseconds timeout) const {
  HIBER_ASSIGN_OR_RETURN(std::string token, wire::read_token_file(control_token_file_));
  return wire::ControlClient::connect(control_socket_path(), token, timeout);
}

std::string Hiberd::token() const {
  std::ifstream in(auth_token_path(run_dir_));
  std::string token;
  std::getline(in, token);
  return token;
}

wire::ClientOptions Hiberd::client_options(const std::string& function_id) const {
  wire::ClientOptions options;
  options.socket_path = socket_path();
  options.function_id = function_id;
  options.auth_token = token();
  return options;
}

Result<std::unique_ptr<wire::CallClient>> Hiberd::connect(const std::string& function_id) const {
  return wire::CallClient::connect(client_options(function_id));
}

std::string one_gpu_node_config(double pcie_gbps) {
  const std::string path = "/tmp/hiber-one-gpu-" + std::to_string(::getpid()) + "-" +
                           std::to_string(pcie_gbps) + ".json";
  std::ofstream(path) << R"({
    "name": "one-gpu",
    "gpuModels": [{"name": "g", "productName": "Simulated GPU", "memoryBytes": 4294967296,
                   "computeCapabilityMajor": 9, "computeCapabilityMinor": 0,
                   "multiprocessors": 8}],
    "gpus": [{"model": "g", "pcieSwitch": 0}],
    "pcieSwitches": [{"hostToDeviceGBps": )"
                      << pcie_gbps << R"(, "deviceToHostGBps": )" << pcie_gbps << R"(}]
  })";
  return path;
}

std::string slow_node_config() { return one_gpu_node_config(0.1); }

Result<StatusView> Hiberd::status() const {
  HIBER_ASSIGN_OR_RETURN(wire::ControlClient client, control(std::chrono::milliseconds(5000)));
  // Every function's page, merged.
  HIBER_ASSIGN_OR_RETURN(wire::Message reply, client.status());
  StatusView view;
  Status read = wire::read_message<wire::proto::ControlReply>(
      reply, "status", [&](wire::proto::ControlReply::Reader r) -> Status {
        if (r.isError()) {
          return Status(static_cast<ErrorCode>(r.getError().getCode()), r.getError().getMessage());
        }
        if (!r.isStatus()) return Status(ErrorCode::kUnknown, "not a status reply");
        auto s = r.getStatus();
        for (auto x : s.getSessions()) {
          view.sessions.push_back({x.getId(), x.getFunctionId(), x.getPid(), x.getAllocatedBytes(),
                                   x.getCalls(), x.getFailedCalls()});
        }
        for (auto d : s.getDevices()) view.device_session_bytes.push_back(d.getSessionBytes());
        auto c = s.getCounters();
        view.sessions_opened = c.getSessionsOpened();
        view.sessions_closed = c.getSessionsClosed();
        view.handshakes_rejected = c.getHandshakesRejected();
        view.malformed_messages = c.getMalformedMessages();
        view.cached_modules = c.getCachedModules();
        view.cached_module_bytes = c.getCachedModuleBytes();
        view.module_cache_hits = c.getModuleCacheHits();
        view.module_cache_misses = c.getModuleCacheMisses();
        view.module_cache_unknown_hashes = c.getModuleCacheUnknownHashes();
        return Status();
      });
  if (!read.ok()) return read;
  return view;
}

int Hiberd::open_fds() const {
  int count = 0;
  std::string dir = "/proc/" + std::to_string(pid_) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++count;
    }
    ::closedir(d);
  }
  return count;
}

int Hiberd::settled_fds(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int last = open_fds();
  auto stable_since = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    int now = open_fds();
    if (now != last) {
      last = now;
      stable_since = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - stable_since > std::chrono::milliseconds(200)) {
      break;
    }
  }
  return last;
}

int Hiberd::wait_for_fds(int expected, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int now = open_fds();
  while (now != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = open_fds();
  }
  return now;
}

std::chrono::milliseconds process_cpu_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  // Fields after the command name, which is in parentheses and may contain spaces.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoul(field);
    if (i == 15) stime = std::stoul(field);
  }
  const long ticks = ::sysconf(_SC_CLK_TCK);
  return std::chrono::milliseconds((utime + stime) * 1000 / ticks);
}

std::chrono::milliseconds Hiberd::cpu_time() const { return process_cpu_time(pid_); }

std::string Hiberd::log() const {
  std::ifstream in(log_path_);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int Hiberd::stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int code = wait_exit(pid_, timeout);
  if (code == -1) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
  return code;
}

}  // namespace hiber::testing
