// The runtime and driver calls PyTorch needs beyond the basics, NVML, and dlopen through the
// caller's RUNPATH, each a program run through the shim against hiberd --device=sim
// (tests/shim/programs: runtime_gaps.cu, device_attributes.cu, nvml_query.cc, dlopen_rpath.cc,
// dlopen_versions.cc; each compares with its own CPU reference or with the CUDA runtime's answers
// and prints "<name>: OK" only then).
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

class ShimGapsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  }

  void expect_ok(const std::string& name, std::vector<std::string> args) {
    Hiberd hiberd(sim_hiberd_options());
    auto result = run_through_shim(hiberd, {name, std::move(args)}, name);
    EXPECT_EQ(result.exit_code, 0) << result.output << "\nhiberd:\n" << hiberd.log();
    EXPECT_NE(summary_line(result.output, name), "") << result.output;
    EXPECT_EQ(result.output.find("WRONG"), std::string::npos) << result.output;
    last_output_ = result.output;
    EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
  }

  std::string last_output_;
};

TEST_F(ShimGapsTest, RuntimeAndDriverGapsBehaveAsCudaDocuments) {
  expect_ok("runtime_gaps", {HIBER_GAPS_PTX});
  EXPECT_NE(last_output_.find("64 KiB without the attribute -> cudaErrorInvalidValue"),
            std::string::npos)
      << last_output_;
  EXPECT_NE(last_output_.find("host functions ran in stream order"), std::string::npos);
  EXPECT_NE(last_output_.find("PTX linked, loaded and launched"), std::string::npos);
  EXPECT_NE(last_output_.find("device state: runtime and driver agree"), std::string::npos);
}

// Issue 18, item 13: what cuda-samples (asyncAPI, simpleCallback, matrixMul, the driver API
// samples) call that the shim once refused.
TEST_F(ShimGapsTest, CallsOfTheCudaSamplesBehaveAsCudaDocuments) {
  expect_ok("sample_calls", {});
  EXPECT_NE(last_output_.find("host functions ran in stream order after their copies"),
            std::string::npos)
      << last_output_;
  EXPECT_NE(last_output_.find("mapped host memory refused"), std::string::npos) << last_output_;
}

TEST_F(ShimGapsTest, NvmlAgreesWithCuda) { expect_ok("nvml_query", {}); }

// Issue 31: the attributes say what the shim does (memory pools, virtual memory management,
// managed memory, cooperative launches: absent), the same through both APIs and the properties.
TEST_F(ShimGapsTest, DeviceAttributesTellWhatTheShimDoes) {
  expect_ok("device_attributes", {});
  EXPECT_NE(last_output_.find("attributes agree through both APIs"), std::string::npos)
      << last_output_;
}

// Issue 31: cudaMallocAsync and the memory pools, and cuMemCreate/cuMemMap, carved from the
// function's memory (memory_apis.cu checks every result against its own values).
TEST_F(ShimGapsTest, StreamOrderedAllocationAndVirtualMemoryWork) {
  expect_ok("memory_apis", {});
  for (const char* expected :
       {"memory_apis: stream-ordered allocation correct",
        "memory_apis: freed on one stream, reused on another",
        "memory_apis: virtual memory management correct",
        "cudaMemPoolExportToShareableHandle -> 801", "cuMemMap(a cudaMalloc address) -> 1",
        "cuMemMap(part of an allocation) -> 1", "cuMemExportToShareableHandle -> 801",
        "cuMemExportToShareableHandle(exportable) -> 801"}) {
    EXPECT_NE(last_output_.find(expected), std::string::npos) << expected << "\n" << last_output_;
  }
}

// Issue 31: graphs captured (two streams joined by events), built node by node with a host
// node, their kernel parameters changed and updated, launched 100 times with new inputs; the
// refusals leave the session working (graphs.cu checks every result against its own).
TEST_F(ShimGapsTest, GraphsCapturedAndBuiltRunAsTheirCalls) {
  expect_ok("graphs", {"4099", "100"});
  for (const char* expected :
       {"graphs: captured graph launched 100 times",
        "graphs: built graph with a host node, parameters changed and updated",
        "graphs: driver API graph launched",
        "cudaMemcpy during a global capture -> cudaErrorStreamCaptureUnsupported",
        "cudaMalloc during a global capture -> cudaErrorStreamCaptureUnsupported",
        "cudaStreamEndCapture of the invalidated capture -> cudaErrorStreamCaptureInvalidated",
        "cudaMalloc during a relaxed capture -> cudaSuccess",
        "cudaGraphLaunch of a destroyed graph -> cudaErrorInvalidValue"}) {
    EXPECT_NE(last_output_.find(expected), std::string::npos) << expected << "\n" << last_output_;
  }
}

TEST_F(ShimGapsTest, BareDlopenSearchesTheCallersRunpath) {
  // The target is reachable only through the caller's RUNPATH.
  const std::filesystem::path target(HIBER_RPATH_TARGET);
  ASSERT_EQ(target.parent_path().filename(), "rpath_dir");
  ASSERT_EQ(std::filesystem::path(HIBER_RPATH_CALLER).parent_path(),
            target.parent_path().parent_path());
  expect_ok("dlopen_rpath", {HIBER_RPATH_CALLER});
}

// Issue 30: a framework built for another major version (TensorFlow's CUDA 12 wheels) must not
// bind this ABI silently.
TEST_F(ShimGapsTest, ALoadOfAnotherMajorVersionIsRefusedNamingBoth) {
  expect_ok("dlopen_versions", {});
  EXPECT_NE(last_output_.find("refused: /hibercuda refused the load: libcudart.so."),
            std::string::npos)
      << last_output_;
}

}  // namespace
}  // namespace hiber::testing::shim
