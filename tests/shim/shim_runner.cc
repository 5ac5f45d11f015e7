#include "tests/shim/shim_runner.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/shim/programs/tiny_mlp_model.h"

namespace hiber::testing::shim {

const std::vector<std::string>& all_programs() {
  static const std::vector<std::string> programs = {
      "vector_add",   "saxpy_streams",  "pinned_overlap",      "d2d_memset",
      "tiny_mlp",     "dlopen_runtime", "error_cases",         "large_allocations",
      "library_gemm", "library_cnn",    "library_transformer", "library_dnn_matmul",
      "library_dnn_attention", "rdc_affine"};
  return programs;
}

std::string program_path(const std::string& name) {
  return std::string(HIBER_SHIM_PROGRAMS_DIR) + "/" + name;
}

std::vector<std::string> program_argv(const ProgramRun& run) {
  std::vector<std::string> argv = {program_path(run.name)};
  argv.insert(argv.end(), run.args.begin(), run.args.end());
  return argv;
}

std::string programs_plugin_path() { return HIBER_SHIM_PROGRAMS_PLUGIN; }
std::string shim_library_path() { return HIBER_SHIM_LIBRARY; }
std::string sanitizer_runtime() { return HIBER_SANITIZER_RUNTIME; }

std::string missing_shim() {
  if (shim_library_path().empty()) {
    return "libhibercuda.so is not part of this build (no hibercuda target in client_shim/)";
  }
  return "";
}

HiberdOptions sim_hiberd_options() {
  HiberdOptions options;
  options.extra_plugins = {programs_plugin_path()};
  return options;
}

std::string shim_preload() {
  // The programs are built by nvcc, without sanitizers; a sanitizer build instruments the shim,
  // and an instrumented library only loads into a process whose first library is the
  // sanitizer's runtime.
  if (sanitizer_runtime().empty()) return shim_library_path();
  return sanitizer_runtime() + ":" + shim_library_path();
}

std::vector<std::string> shim_environment(const Hiberd& hiberd, const std::string& function_id) {
  std::vector<std::string> env = {"LD_PRELOAD=" + shim_preload(),
                                  "HIBER_RUN_DIR=" + hiberd.run_dir(),
                                  "HIBER_FUNCTION_ID=" + function_id};
  // LeakSanitizer stays on (scripts/test.sh sets detect_leaks=1): the preloaded runtime checks
  // the whole process at exit, which catches what the shim leaks in a real program. The
  // uninstrumented programs, libstdc++ and the shim give no leak reports on a successful run
  // (checked with every program); a failing program exits from deep inside (exit(1)) and may
  // add a report to its own failure. If leaks of code that is not ours ever cause noise, append
  // detect_leaks=0 to ASAN_OPTIONS here, for the child programs only.
  return env;
}

namespace {

// The shim's environment and the run's own variables.
std::vector<std::string> run_environment(const Hiberd& hiberd, const ProgramRun& run,
                                         const std::string& function_id) {
  std::vector<std::string> env = shim_environment(hiberd, function_id);
  env.insert(env.end(), run.env.begin(), run.env.end());
  return env;
}

}  // namespace

ProgramResult run_through_shim(const Hiberd& hiberd, const ProgramRun& run,
                               const std::string& function_id, std::chrono::milliseconds timeout) {
  return run_program(program_argv(run), run_environment(hiberd, run, function_id), timeout);
}

pid_t spawn_through_shim(const Hiberd& hiberd, const ProgramRun& run,
                         const std::string& function_id, const std::string& log_path) {
  return spawn(program_argv(run), log_path, 0, run_environment(hiberd, run, function_id));
}

ServedProgram::ServedProgram(const Hiberd& hiberd, const ProgramRun& run,
                             const std::string& function_id, const std::string& stderr_path)
    : process_(
          spawn_piped(program_argv(run), stderr_path, run_environment(hiberd, run, function_id))) {}

ServedProgram::~ServedProgram() {
  if (process_.pid > 0 && !exited_) {
    ::kill(process_.pid, SIGKILL);
    (void)wait_exit(process_.pid, std::chrono::seconds(30));
  }
  if (process_.to_stdin >= 0) ::close(process_.to_stdin);
  if (process_.from_stdout >= 0) ::close(process_.from_stdout);
}

bool ServedProgram::send_line(const std::string& line) {
  const std::string text = line + "\n";
  size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::write(process_.to_stdin, text.data() + sent, text.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string ServedProgram::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd p{process_.from_stdout, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(process_.from_stdout, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "";
    buffered_.append(chunk, static_cast<size_t>(n));
  }
}

int ServedProgram::finish(std::chrono::milliseconds timeout) {
  if (process_.to_stdin >= 0) {
    ::close(process_.to_stdin);
    process_.to_stdin = -1;
  }
  const int code = wait_exit(process_.pid, timeout);
  exited_ = code != -1;
  return code;
}

void ServedProgram::kill(int signal) { ::kill(process_.pid, signal); }

std::string summary_line(const std::string& output, const std::string& name) {
  std::istringstream lines(output);
  const std::string prefix = name + ": OK";
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string mlp_server_answer(uint64_t seed, int input, long long entry) {
  const std::vector<tiny_mlp::Layer> layers = tiny_mlp::make_model(seed);
  std::vector<float> out;
  if (!tiny_mlp::reference(layers, tiny_mlp::make_input(input), out)) return "no reference";
  char buf[64];
  std::string answer = "result " + std::to_string(input);
  for (float v : out) {
    std::snprintf(buf, sizeof buf, " %a", static_cast<double>(v));
    answer += buf;
  }
  const float value = entry >= 0 ? tiny_mlp::table_value(seed, static_cast<uint64_t>(entry)) : 0.0f;
  std::snprintf(buf, sizeof buf, " %a", static_cast<double>(value));
  return answer + buf;
}

}  // namespace hiber::testing::shim
