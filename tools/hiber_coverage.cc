// hiber-coverage FILE: which CUDA symbols a program or library imports (following its NEEDED
// libraries as the loader would) and whether Hiber remotes each, only stubs it, or lacks it.
// Exit status: 0 all remoted (or local), 1 a stub, refused or missing symbol, 2 an error (no such
// file, not ELF, wrong usage). docs/coverage.md explains the search and the output.
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "tools/coverage.h"

DEFINE_string(
    shim_dir, "",
    "Folder of Hiber's replacement libraries (libhibercuda.so, libhibercublas.so, ...). "
    "Default: the first of <tool dir>/../client_shim (build tree), <tool dir>/../lib/hiber, "
    "<tool dir>/../lib, <tool dir> that holds libhibercuda.so");
DEFINE_bool(summary, false, "Print only the notes and the summary line, not one line per symbol");
DEFINE_bool(json, false, "Print the report as one JSON object instead of text");

namespace hiber::coverage {
namespace {

constexpr int kExitError = 2;

// The default --shim_dir, relative to this program's own file; "" when none holds the shim.
std::string find_shim_dir() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  std::filesystem::path dir = self.parent_path();
  for (const std::filesystem::path& candidate :
       {dir / ".." / "client_shim", dir / ".." / "lib" / "hiber", dir / ".." / "lib", dir}) {
    if (std::filesystem::is_regular_file(candidate / "libhibercuda.so", ec)) {
      return std::filesystem::weakly_canonical(candidate, ec).string();
    }
  }
  return "";
}

// gflags exits 1 on a flag it does not know, which here means "stubs found": catch it first.
// Returns the first unknown flag's name, or "".
std::string first_unknown_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name.c_str(), &info)) continue;
    // --noflag negates a bool flag.
    if (name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.c_str() + 2, &info) &&
        info.type == "bool") {
      continue;
    }
    return name;
  }
  return "";
}

int run(const std::string& path) {
  ScanOptions options;
  options.shim_dir = FLAGS_shim_dir.empty() ? find_shim_dir() : FLAGS_shim_dir;
  if (options.shim_dir.empty()) {
    std::fprintf(stderr,
                 "hiber-coverage: no libhibercuda.so found next to this program (looked in "
                 "../client_shim, ../lib/hiber, ../lib and its own folder); pass --shim_dir\n");
    return kExitError;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(options.shim_dir, ec)) {
    std::fprintf(stderr, "hiber-coverage: --shim_dir %s is not a folder\n",
                 options.shim_dir.c_str());
    return kExitError;
  }
  options.search = system_search_config();
  auto report = scan(path, options);
  if (!report.ok()) {
    std::fprintf(stderr, "hiber-coverage: %s\n", report.status().message().c_str());
    return kExitError;
  }
  std::string out = FLAGS_json ? format_json(*report) : format_text(*report, FLAGS_summary);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return exit_code(*report);
}

}  // namespace
}  // namespace hiber::coverage

int main(int argc, char** argv) {
  if (std::string flag = hiber::coverage::first_unknown_flag(argc, argv); !flag.empty()) {
    std::fprintf(stderr, "hiber-coverage: unknown flag --%s (see --help)\n", flag.c_str());
    return hiber::coverage::kExitError;
  }
  hiber::init_program(
      &argc, &argv,
      "hiber-coverage: the CUDA runtime/driver, cuBLAS, cuBLASLt, cuDNN, NVRTC and NVML symbols\n"
      "FILE imports (itself and through its NEEDED libraries), each with the library it binds to\n"
      "and whether Hiber remotes it, answers it in the client (local), refuses it as documented, has\n"
    "only a stub, or lacks it\n"
      "(NVRTC: local, runs in the client). See docs/coverage.md.\n"
      "  hiber-coverage [--summary | --json] [--shim_dir=DIR] FILE\n"
      "Exit status: 0 all remoted or local, 1 a stub, refused or missing symbol, 2 an error.",
      __FILE__);
  if (argc != 2) {
    std::fprintf(stderr, "usage: hiber-coverage [flags] FILE (see --help)\n");
    return 2;
  }
  return hiber::coverage::run(argv[1]);
}
