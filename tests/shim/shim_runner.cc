#include "tests/shim/shim_runner.h"

#include <fstream>
#include <sstream>

namespace hiber::testing::shim {

const std::vector<std::string>& all_programs() {
  static const std::vector<std::string> programs = {
      "vector_add", "saxpy_streams", "pinned_overlap", "d2d_memset",
      "tiny_mlp",   "dlopen_runtime", "error_cases"};
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

std::vector<std::string> shim_environment(const Hiberd& hiberd, const std::string& function_id) {
  std::string preload = shim_library_path();
  // The programs are built by nvcc, without sanitizers; a sanitizer build instruments the shim,
  // and an instrumented library only loads into a process whose first library is the
  // sanitizer's runtime.
  if (!sanitizer_runtime().empty()) preload = sanitizer_runtime() + ":" + preload;
  std::vector<std::string> env = {"LD_PRELOAD=" + preload, "HIBER_RUN_DIR=" + hiberd.run_dir(),
                                  "HIBER_FUNCTION_ID=" + function_id};
  // LeakSanitizer stays on (scripts/test.sh sets detect_leaks=1): the preloaded runtime checks
  // the whole process at exit, which catches what the shim leaks in a real program. The
  // uninstrumented programs, libstdc++ and the shim give no leak reports on a successful run
  // (checked with every program); a failing program exits from deep inside (exit(1)) and may
  // add a report to its own failure. If leaks of code that is not ours ever cause noise, append
  // detect_leaks=0 to ASAN_OPTIONS here, for the child programs only.
  return env;
}

ProgramResult run_through_shim(const Hiberd& hiberd, const ProgramRun& run,
                               const std::string& function_id,
                               std::chrono::milliseconds timeout) {
  return run_program(program_argv(run), shim_environment(hiberd, function_id), timeout);
}

pid_t spawn_through_shim(const Hiberd& hiberd, const ProgramRun& run,
                         const std::string& function_id, const std::string& log_path) {
  return spawn(program_argv(run), log_path, 0, shim_environment(hiberd, function_id));
}

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

}  // namespace hiber::testing::shim
