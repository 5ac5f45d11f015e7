// HIBER_TRACE on library_gemm, library_cnn and nvml_query through the shim against
// hiberd --device=sim: every call the program makes appears once.
//   - The calls each program's source makes a known number of times (read from the program, the
//     independent reference here: library_gemm's 10 cudaMalloc, its one cublasCreate_v2;
//     nvml_query's one nvmlInit_v2 ...) appear exactly that many times; and a call the program does
//     not make itself, though a body it calls makes it (cudaStreamCreateWithFlags's body calls
//     cudaStreamCreateWithPriority's), does not appear: one line per call, not per body.
//   - Every line names an entry point of the declaration tables, with its arguments and result.
//   - HIBER_TRACE=summary counts each entry point as many times as HIBER_TRACE=1 prints it.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

using namespace std::chrono_literals;

// Calls per entry point: "hiber trace: name(args) 1.2 us -> 0" lines.
std::map<std::string, int> traced_calls(const std::string& output) {
  static const std::regex line(
      R"(^hiber trace: ([A-Za-z_][A-Za-z0-9_]*)\((.*)\)( [0-9.]+ us)?.*$)");
  std::map<std::string, int> calls;
  std::istringstream in(output);
  std::string text;
  while (std::getline(in, text)) {
    std::smatch match;
    if (std::regex_match(text, match, line)) ++calls[match[1]];
  }
  return calls;
}

// "  <library> <name> <count>" lines of the summary.
std::map<std::string, int> summary_calls(const std::string& output) {
  std::map<std::string, int> calls;
  const size_t at = output.find("hiber trace summary: ");
  if (at == std::string::npos) return calls;
  std::istringstream in(output.substr(at));
  std::string text;
  std::getline(in, text);
  static const std::regex row(R"(^  (\S+) (\S+)( \(stub\))? ([0-9]+)$)");
  while (std::getline(in, text)) {
    std::smatch match;
    if (!std::regex_match(text, match, row)) break;
    calls[match[2]] += std::stoi(match[4]);
  }
  return calls;
}

// Every name of every declaration table.
std::set<std::string> declared_names() {
  std::set<std::string> names;
  for (const char* table : {"cudart", "cuda", "cublas", "cublasLt", "cudnn", "nvml"}) {
    std::ifstream in(std::string(HIBER_ENTRY_TABLE_DIR) + "/" + table + ".entries");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      names.insert(line.substr(0, line.find_first_of(" \t")));
    }
  }
  return names;
}

struct Traced {
  std::map<std::string, int> lines;
  std::map<std::string, int> summary;
  std::string output;
};

Traced trace(const Hiberd& hiberd, const ProgramRun& run) {
  Traced traced;
  for (const char* mode : {"1", "summary"}) {
    std::vector<std::string> env = shim_environment(hiberd, run.name);
    env.push_back(std::string("HIBER_TRACE=") + mode);
    const ProgramResult result = run_program(program_argv(run), env, 300s);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    if (std::string(mode) == "1") {
      traced.lines = traced_calls(result.output);
      traced.output = result.output;
    } else {
      traced.summary = summary_calls(result.output);
      EXPECT_NE(result.output.find("hiber-shim stats: "), std::string::npos)
          << "HIBER_TRACE=summary includes HIBER_STATS's line\n"
          << result.output;
    }
  }
  const std::set<std::string> declared = declared_names();
  for (const auto& [name, count] : traced.lines) {
    EXPECT_TRUE(declared.contains(name)) << name << " is traced but no table declares it";
  }
  EXPECT_EQ(traced.lines, traced.summary) << "one line per call, and the summary counts each";
  return traced;
}

class ShimTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(ShimTrace, LibraryGemmEveryCallOnce) {
  Hiberd hiberd(sim_hiberd_options());
  const Traced t = trace(hiberd, {"library_gemm", {}});
  // library_gemm.cu, call by call: six buffers, then two for the batched case and two for the
  // GEMV (10 cudaMalloc, 10 cudaFree); 5 + 3 + 2 uploads (cudaMemcpy); three GEMM cases of two
  // copies and one synchronize each, the batched case's 3 + 1 copies and one synchronize, the
  // GEMV's one of each (11 cudaMemcpyAsync, 5 cudaStreamSynchronize).
  const std::map<std::string, int> expected = {
      {"cudaMalloc", 10},           {"cudaFree", 10},
      {"cudaMemcpy", 10},           {"cudaMemcpyAsync", 11},
      {"cudaStreamSynchronize", 5}, {"cudaStreamCreateWithFlags", 1},
      {"cudaStreamDestroy", 1},     {"cublasCreate_v2", 1},
      {"cublasDestroy_v2", 1},      {"cublasSetStream_v2", 1},
      {"cublasGetStream_v2", 1},    {"cublasSgemm_v2", 2},
      {"cublasGemmEx", 1},          {"cublasGemmBatchedEx", 1},
      {"cublasSgemv_v2", 1},        {"cublasSsyrk_v2", 1},
  };
  for (const auto& [name, count] : expected) {
    auto it = t.lines.find(name);
    EXPECT_EQ(it == t.lines.end() ? 0 : it->second, count) << name << "\n" << t.output;
  }
  // The program calls cudaStreamCreateWithFlags, whose body calls another body: not traced.
  EXPECT_FALSE(t.lines.contains("cudaStreamCreateWithPriority")) << t.output;
  // Handles and sizes: cudaMalloc(pointer, bytes).
  EXPECT_TRUE(
      std::regex_search(t.output, std::regex(R"(hiber trace: cudaMalloc\(0x[0-9a-f]+, [0-9]+\) )")))
      << t.output;
  // The stub, traced with its status.
  EXPECT_NE(t.output.find("hiber trace: cublasSsyrk_v2(...) -> 15 (not supported)"),
            std::string::npos)
      << t.output;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

TEST_F(ShimTrace, LibraryCnnEveryCallOnce) {
  Hiberd hiberd(sim_hiberd_options());
  const Traced t = trace(hiberd, {"library_cnn", {"1"}});
  EXPECT_EQ(t.lines.at("cudnnCreate"), 1) << t.output;
  EXPECT_EQ(t.lines.at("cudnnDestroy"), 1) << t.output;
  EXPECT_GE(t.lines.at("cudnnBackendExecute"), 1) << t.output;
  EXPECT_GE(t.lines.at("cudnnBackendCreateDescriptor"), 1) << t.output;
  EXPECT_EQ(t.lines.at("cudnnBackendCreateDescriptor"), t.lines.at("cudnnBackendDestroyDescriptor"))
      << "library_cnn destroys every descriptor it creates\n"
      << t.output;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

TEST_F(ShimTrace, NvmlQueryEveryCallOnce) {
  Hiberd hiberd(sim_hiberd_options());
  const Traced t = trace(hiberd, {"nvml_query", {}});
  // nvml_query.cc: once each, whatever the device count (the device count twice: before
  // nvmlInit_v2, which must fail, and after).
  for (const char* name : {"nvmlInit_v2", "nvmlShutdown", "nvmlSystemGetCudaDriverVersion_v2",
                           "cudaGetDeviceCount", "cudaDriverGetVersion"}) {
    auto it = t.lines.find(name);
    EXPECT_EQ(it == t.lines.end() ? 0 : it->second, 1) << name << "\n" << t.output;
  }
  EXPECT_EQ(t.lines.at("nvmlDeviceGetCount_v2"), 2) << t.output;
  // Per device: its properties, its handle by index, found again by UUID and twice by PCI bus
  // id; then the handle of device 0 twice more and of one past the last.
  const int devices = t.lines.at("cudaGetDeviceProperties");
  EXPECT_GE(devices, 1);
  EXPECT_EQ(t.lines.at("nvmlDeviceGetHandleByIndex_v2"), devices + 3) << t.output;
  EXPECT_EQ(t.lines.at("nvmlDeviceGetHandleByUUID"), devices) << t.output;
  EXPECT_EQ(t.lines.at("nvmlDeviceGetHandleByPciBusId_v2"), 2 * devices) << t.output;
  EXPECT_EQ(t.lines.at("cudaDeviceGetPCIBusId"), devices) << t.output;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// A kernel's registration: its name quoted, the host function's address (typed const char* by
// nvcc's generated code) shown as the pointer it is.
TEST_F(ShimTrace, AKernelsRegistrationShowsItsNameAndItsHostFunction) {
  Hiberd hiberd(sim_hiberd_options());
  const Traced t = trace(hiberd, {"vector_add", {"1000"}});
  EXPECT_EQ(t.lines.at("__cudaRegisterFunction"), 1) << t.output;
  EXPECT_TRUE(std::regex_search(
      t.output, std::regex(R"(hiber trace: __cudaRegisterFunction\(0x[0-9a-f]+, 0x[0-9a-f]+, )"
                           R"(0x[0-9a-f]+, "_Z10vector_addPKfS0_Pfi", )")))
      << t.output;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

}  // namespace
}  // namespace hiber::testing::shim
