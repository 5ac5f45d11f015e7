// What the shim tests share: where the programs, their kernel plugin and libhibercuda.so are,
// and how a program is run through the shim against a hiberd.
//
// The contract with the shim (client_shim/, target hibercuda): a program started with
//   LD_PRELOAD=[<sanitizer runtime>:]<libhibercuda.so>
//   HIBER_RUN_DIR=<hiberd's run directory>   (the shim finds the socket and the auth token there)
//   HIBER_FUNCTION_ID=<name>                 (the session's function id)
// runs unmodified: it talks to that hiberd only, opens one session, and closes it when it exits.
#pragma once

#include <string>
#include <vector>

#include "tests/integration/hiberd_harness.h"

namespace hiber::testing::shim {

// One run of a program: its name (a file in the programs folder) and its arguments.
struct ProgramRun {
  std::string name;
  std::vector<std::string> args;
  std::vector<std::string> env = {};  // KEY=VALUE added to the shim's environment
};

// Every program in tests/shim/programs, in a fixed order.
const std::vector<std::string>& all_programs();

std::string program_path(const std::string& name);
std::vector<std::string> program_argv(const ProgramRun& run);
// The kernel plugin with the host implementations of the programs' kernels.
std::string programs_plugin_path();
// What LD_PRELOAD lists for a program: libhibercuda.so, then the replacement libraries
// (libhibercublas.so, ...) built here, colon-separated; empty where the build has no hibercuda
// target yet.
std::string shim_library_path();
// The sanitizer runtime the shim was built against (libasan.so, libtsan.so), which must be
// preloaded before it into the uninstrumented programs; empty in a build without sanitizers.
std::string sanitizer_runtime();

// What LD_PRELOAD lists for a program run through the shim: the sanitizer runtime (if any),
// then shim_library_path().
std::string shim_preload();

// Why the shim tests cannot run here (no shim built), or empty.
std::string missing_shim();

// The answer line mlp_server gives for model `seed`, input `input`, table entry `entry` (-1: none),
// computed on the host from tiny_mlp_model.h.
std::string mlp_server_answer(uint64_t seed, int input, long long entry);

// hiberd --device=sim with the test kernel plugin and the programs' plugin.
HiberdOptions sim_hiberd_options();

// The environment for a program run through the shim against `hiberd`, as function
// `function_id`.
std::vector<std::string> shim_environment(const Hiberd& hiberd, const std::string& function_id);

// Runs `run` through the shim against `hiberd`.
ProgramResult run_through_shim(const Hiberd& hiberd, const ProgramRun& run,
                               const std::string& function_id,
                               std::chrono::milliseconds timeout = std::chrono::seconds(300));
// Starts it in the background, output to `log_path`.
pid_t spawn_through_shim(const Hiberd& hiberd, const ProgramRun& run,
                         const std::string& function_id, const std::string& log_path);

// A program run through the shim that serves requests line by line (mlp_server): lines go to
// its stdin, answers come from its stdout. Killed (SIGKILL) when destroyed if still running.
class ServedProgram {
 public:
  ServedProgram(const Hiberd& hiberd, const ProgramRun& run, const std::string& function_id,
                const std::string& stderr_path);
  ~ServedProgram();
  ServedProgram(const ServedProgram&) = delete;
  ServedProgram& operator=(const ServedProgram&) = delete;

  pid_t pid() const { return process_.pid; }
  bool send_line(const std::string& line);
  // The next line of output without its newline; empty on time-out or end of output.
  std::string read_line(std::chrono::milliseconds timeout);
  // Closes its stdin and waits; the exit code as from wait_exit.
  int finish(std::chrono::milliseconds timeout);
  void kill(int signal);

 private:
  PipedProcess process_;
  std::string buffered_;
  bool exited_ = false;
};

// The program's summary line ("<name>: OK ...") in `output`, or empty if there is none.
std::string summary_line(const std::string& output, const std::string& name);

// The whole of a file, or empty.
std::string read_file(const std::string& path);

}  // namespace hiber::testing::shim
