// The hiber-coverage binary on nvcc-built programs (built, never run; no GPU needed), with its
// default --shim_dir (the build tree's client_shim/, found from the tool's own location):
//   - every runtime symbol the shim's test programs import is remoted or local, exit 0;
//   - sample_calls' cudaHostGetDevicePointer is refused, exit 1;
//   - texture_stub imports cudaCreateTextureObject, a stub in libhibercuda.so: printed as stub, exit 1;
//   - cublas_create imports cublasCreate_v2 from libcublas.so.13: attributed there, with the
//     status libhibercublas.so gives (missing while it is not built), and the exit status
//     agrees with the statuses printed;
//   - driver_calls imports cuInit, cuMemAlloc_v2 (remoted), cuGetErrorName (local),
//     cuMemHostGetDevicePointer_v2 and cuModuleGetGlobal_v2 (refused) and cuGraphCreate (a
//     stub), unversioned, from libcuda.so.1, with a note naming the stand-in libcuda.so.1;
//   - transitive_user needs only libcoverage_forwarder.so (RUNPATH $ORIGIN), whose
//     cudaCreateTextureObject import is found by following NEEDED;
//   - a missing file and a file that is not ELF: exit 2 with a clear message.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tools/elf_file.h"

namespace hiber::coverage {
namespace {

using ::testing::HasSubstr;

struct ToolRun {
  int exit_code = -1;
  std::string output;  // stdout, then stderr
};

ToolRun run_tool(const std::string& args) {
  std::string command = std::string(HIBER_COVERAGE_TOOL) + " " + args + " 2>&1";
  ToolRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    run.output.append(buffer.data(), n);
  }
  int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

struct SymbolLine {
  std::string library;
  std::string status;
};

// "library  symbol  status" lines by symbol; notes and the summary are left out.
std::map<std::string, SymbolLine> symbol_lines(const std::string& output) {
  std::map<std::string, SymbolLine> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("note: ", 0) == 0 || line.rfind("summary:", 0) == 0) continue;
    std::istringstream fields(line);
    std::string library, symbol, status, extra;
    if (fields >> library >> symbol >> status && !(fields >> extra)) {
      lines[symbol] = {library, status};
    }
  }
  return lines;
}

std::string program(const std::string& name) {
  return std::string(HIBER_COVERAGE_PROGRAMS_DIR) + "/" + name;
}

bool is_stub_or_missing(const SymbolLine& line) {
  return line.status == "stub" || line.status == "missing";
}

class ShimProgramCoverage : public ::testing::TestWithParam<std::string> {};

TEST_P(ShimProgramCoverage, EverySymbolIsRemotedOrLocal) {
  ToolRun run = run_tool(std::string(HIBER_SHIM_PROGRAMS_DIR) + "/" + GetParam());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  auto lines = symbol_lines(run.output);
  for (const auto& [symbol, line] : lines) {
    // The runtime's, or (programs linked with -lcublas etc.) the library's, by the prefix.
    auto starts = [&](const char* prefix) { return symbol.rfind(prefix, 0) == 0; };
    const char* library = starts("cublasLt") ? "libcublasLt.so.13"
                          : starts("cublas") ? "libcublas.so.13"
                          : starts("cudnn")  ? "libcudnn.so.9"
                                             : "libcudart.so.13";
    EXPECT_EQ(line.library, library) << symbol;
    EXPECT_THAT(line.status, ::testing::AnyOf("remoted", "local")) << symbol;
  }
  // Sent to hiberd, or answered in the client, as the calls are (docs/shim.md).
  if (lines.contains("cudaMalloc")) {
    EXPECT_EQ(lines["cudaMalloc"].status, "remoted");
  }
  if (lines.contains("cudaGetErrorString")) {
    EXPECT_EQ(lines["cudaGetErrorString"].status, "local");
  }
  if (GetParam() == "dlopen_runtime") {
    EXPECT_TRUE(lines.empty()) << run.output;  // -cudart none: it needs no CUDA library
  } else {
    EXPECT_TRUE(lines.contains("cudaMalloc") || lines.contains("cudaMallocHost")) << run.output;
  }
  EXPECT_THAT(run.output, HasSubstr("summary:"));
}

INSTANTIATE_TEST_SUITE_P(Programs, ShimProgramCoverage,
                         ::testing::Values("vector_add", "saxpy_streams", "pinned_overlap",
                                           "d2d_memset", "tiny_mlp", "error_cases",
                                           "dlopen_runtime", "mlp_server", "library_cnn",
                                           "library_transformer"));

// Issue 30: sample_calls calls cudaHostGetDevicePointer, which the shim defines and refuses
// (mapped host memory): the tool says so and the program is not runnable as it is.
TEST(ShimProgramCoverage, ARefusedCallIsReportedRefusedAndFails) {
  ToolRun run = run_tool(std::string(HIBER_SHIM_PROGRAMS_DIR) + "/sample_calls");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  auto lines = symbol_lines(run.output);
  ASSERT_TRUE(lines.contains("cudaHostGetDevicePointer")) << run.output;
  EXPECT_EQ(lines["cudaHostGetDevicePointer"].status, "refused");
  EXPECT_EQ(lines["cudaMalloc"].status, "remoted") << run.output;
  EXPECT_THAT(run.output, HasSubstr(" refused"));
}

// library_gemm calls cublasSsyrk on purpose (its error path: a loud stub must say "not
// supported"): the tool reports that one import as a stub, and only it, and exits 1.
TEST(ShimProgramCoverage, ReportsTheStubALibraryProgramImports) {
  ToolRun run = run_tool(std::string(HIBER_SHIM_PROGRAMS_DIR) + "/library_gemm");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  auto lines = symbol_lines(run.output);
  ASSERT_TRUE(lines.contains("cublasSsyrk_v2")) << run.output;
  EXPECT_EQ(lines["cublasSsyrk_v2"].library, "libcublas.so.13");
  EXPECT_EQ(lines["cublasSsyrk_v2"].status, "stub");
  for (const auto& [symbol, line] : lines) {
    if (symbol != "cublasSsyrk_v2") {
      EXPECT_THAT(line.status, ::testing::AnyOf("remoted", "local")) << symbol;
    }
  }
  EXPECT_TRUE(lines.contains("cublasGemmBatchedEx")) << run.output;
}

// The programs' point is a symbol the shim only stubs; say so plainly once it is implemented.
// `table`'s row of `symbol`, read from client_shim/entry_points/<table>.entries.
void expect_shim_stubs(const std::string& table, const std::string& symbol) {
  std::ifstream in(std::string(HIBER_ENTRY_TABLE_DIR) + "/" + table + ".entries");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, kind;
    if (fields >> name >> kind && name == symbol) {
      ASSERT_EQ(kind, "stub") << "the shim implements " << symbol
                              << " now: pick another stub for tests/coverage/programs/";
      return;
    }
  }
  FAIL() << symbol << " has no row in " << table << ".entries";
}

void expect_texture_create_is_a_stub() { expect_shim_stubs("cudart", "cudaCreateTextureObject"); }

TEST(Coverage, AStubIsPrintedAndFails) {
  expect_texture_create_is_a_stub();
  ToolRun run = run_tool(program("texture_stub"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  auto lines = symbol_lines(run.output);
  ASSERT_TRUE(lines.contains("cudaCreateTextureObject")) << run.output;
  EXPECT_EQ(lines["cudaCreateTextureObject"].library, "libcudart.so.13");
  EXPECT_EQ(lines["cudaCreateTextureObject"].status, "stub");
  EXPECT_EQ(lines["cudaGetDeviceCount"].status, "remoted") << run.output;
}

TEST(Coverage, SummaryOnlyPrintsNoSymbolLines) {
  ToolRun run = run_tool("--summary " + program("texture_stub"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(symbol_lines(run.output).empty()) << run.output;
  EXPECT_THAT(run.output, HasSubstr("summary: libcudart.so.13: "));
  EXPECT_THAT(run.output, HasSubstr(" stub"));
}

TEST(Coverage, JsonCarriesTheSameStatuses) {
  ToolRun run = run_tool("--json " + program("texture_stub"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("{\"library\": \"libcudart.so.13\", \"symbol\": "
                                    "\"cudaCreateTextureObject\", \"status\": \"stub\""));
  EXPECT_THAT(run.output, HasSubstr("\"complete\": false"));
}

TEST(Coverage, CublasImportsAreAttributedToLibcublas) {
  ToolRun run = run_tool(program("cublas_create"));
  auto lines = symbol_lines(run.output);
  for (const char* symbol : {"cublasCreate_v2", "cublasDestroy_v2"}) {
    ASSERT_TRUE(lines.contains(symbol)) << symbol << "\n" << run.output;
    EXPECT_EQ(lines[symbol].library, "libcublas.so.13") << symbol;
  }
  EXPECT_EQ(lines["cudaGetDeviceCount"].library, "libcudart.so.13");
  EXPECT_EQ(lines["cudaGetDeviceCount"].status, "remoted");
  const bool replacement_built =
      std::filesystem::exists(std::string(HIBER_SHIM_DIR) + "/libhibercublas.so");
  if (replacement_built) {
    EXPECT_THAT(lines["cublasCreate_v2"].status,
                ::testing::AnyOf("remoted", "local", "stub", "missing"));
  } else {
    EXPECT_EQ(lines["cublasCreate_v2"].status, "missing");
    EXPECT_THAT(run.output, HasSubstr("note: libhibercublas.so (the replacement for "
                                      "libcublas.so.13) is not built"));
  }
  bool any_not_remoted = false;
  for (const auto& [symbol, line] : lines) any_not_remoted |= is_stub_or_missing(line);
  EXPECT_EQ(run.exit_code, any_not_remoted ? 1 : 0) << run.output;
}

// Unversioned imports: attributed to libcuda.so.1 by its exports where the driver is installed,
// by their names where it is not (as on a build machine).
TEST(Coverage, DriverImportsAreAttributedToLibcuda) {
  expect_shim_stubs("cuda", "cuGraphCreate");
  ToolRun run = run_tool(program("driver_calls"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  auto lines = symbol_lines(run.output);
  for (const char* symbol :
       {"cuInit", "cuMemAlloc_v2", "cuGetErrorName", "cuMemHostGetDevicePointer_v2",
        "cuModuleGetGlobal_v2", "cuGraphCreate"}) {
    ASSERT_TRUE(lines.contains(symbol)) << symbol << "\n" << run.output;
    EXPECT_EQ(lines[symbol].library, "libcuda.so.1") << symbol;
  }
  EXPECT_EQ(lines["cuInit"].status, "remoted");
  EXPECT_EQ(lines["cuMemAlloc_v2"].status, "remoted");
  EXPECT_EQ(lines["cuGetErrorName"].status, "local");
  // Mapped host memory and __device__ variables of loaded modules: documented refusals.
  EXPECT_EQ(lines["cuMemHostGetDevicePointer_v2"].status, "refused");
  EXPECT_EQ(lines["cuModuleGetGlobal_v2"].status, "refused");
  EXPECT_EQ(lines["cuGraphCreate"].status, "stub");
  EXPECT_THAT(run.output,
              HasSubstr("summary: libcuda.so.1: 2 remoted, 1 stub, 1 local, 2 refused"));
  // The driver's file itself: the stand-in for nodes without it.
  EXPECT_THAT(run.output, HasSubstr(std::string("note: libcuda.so.1 (the NVIDIA driver) is needed: "
                                                "on a node without it, ") +
                                    HIBER_SHIM_DIR + "/driver/libcuda.so.1 stands in for it"));
}

TEST(Coverage, FollowsNeededLibrariesThroughOrigin) {
  expect_texture_create_is_a_stub();
  ToolRun run = run_tool(program("transitive_user"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  auto lines = symbol_lines(run.output);
  ASSERT_TRUE(lines.contains("cudaCreateTextureObject")) << run.output;
  EXPECT_EQ(lines["cudaCreateTextureObject"].status, "stub");
  ToolRun json = run_tool("--json " + program("transitive_user"));
  EXPECT_THAT(json.output,
              HasSubstr("\"importers\": [\"" + program("libcoverage_forwarder.so") + "\"]"));
}

TEST(Coverage, MissingAndNonElfFilesAreErrors) {
  ToolRun missing = run_tool(program("no_such_program"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("no_such_program: No such file or directory"));
  ToolRun not_elf = run_tool(std::string(HIBER_SOURCE_DIR) + "/README.md");
  EXPECT_EQ(not_elf.exit_code, 2);
  EXPECT_THAT(not_elf.output, HasSubstr("README.md: not an ELF file"));
  ToolRun no_file = run_tool("");
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_THAT(no_file.output, HasSubstr("usage: hiber-coverage"));
  ToolRun unknown_flag = run_tool("--no_such_flag " + program("texture_stub"));
  EXPECT_EQ(unknown_flag.exit_code, 2);  // not 1, which means "stubs found"
  EXPECT_THAT(unknown_flag.output, HasSubstr("unknown flag --no_such_flag"));
  ToolRun bad_shim_dir = run_tool("--shim_dir=/no/such/dir " + program("texture_stub"));
  EXPECT_EQ(bad_shim_dir.exit_code, 2);
  EXPECT_THAT(bad_shim_dir.output, HasSubstr("is not a folder"));
}

TEST(Coverage, HelpListsTheFlags) {
  ToolRun run = run_tool("--help");
  EXPECT_EQ(run.exit_code, 0);
  for (const char* flag : {"-shim_dir", "-summary", "-json"}) {
    EXPECT_THAT(run.output, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace hiber::coverage
