// Issue 18, item 14: a driver-API program linked with -lcuda (NEEDED libcuda.so.1) on a node
// without the NVIDIA driver. With the shim preloaded and the stand-in
// (client_shim/driver/libcuda.so.1) on LD_LIBRARY_PATH, it runs against hiberd --device=sim and
// its results match its CPU reference (tests/shim/programs/driver_api.cc); the file loaded as
// libcuda.so.1 is the stand-in (not the toolkit's stub), and the driver calls, by name and
// through dlopen/dlsym, run in libhibercuda.so.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

namespace fs = std::filesystem;

// The line "driver_api: <what> <value>" in `output`, as its value; empty if absent.
std::string reported(const std::string& output, const std::string& what) {
  const std::string prefix = "driver_api: " + what + " ";
  const size_t at = output.find(prefix);
  if (at == std::string::npos) return "";
  const size_t end = output.find('\n', at);
  return output.substr(at + prefix.size(),
                       end == std::string::npos ? end : end - at - prefix.size());
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  return !a.empty() && !b.empty() && fs::equivalent(a, b, error);
}

std::string standin_dir() { return fs::path(HIBER_DRIVER_STANDIN).parent_path(); }

// libhibercuda.so: the first entry of what the runner preloads.
std::string shim_path() { return shim_library_path().substr(0, shim_library_path().find(':')); }

class DriverStandinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(DriverStandinTest, DriverApiProgramRunsWithOnlyTheStandIn) {
  ASSERT_EQ(fs::path(HIBER_DRIVER_STANDIN).filename(), "libcuda.so.1");
  Hiberd hiberd(sim_hiberd_options());
  std::vector<std::string> env = shim_environment(hiberd, "driver_api");
  env.push_back("LD_LIBRARY_PATH=" + standin_dir());
  const auto result = run_program(program_argv({"driver_api", {HIBER_GAPS_PTX, "5000"}}), env,
                                  std::chrono::seconds(120));
  EXPECT_EQ(result.exit_code, 0) << result.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(summary_line(result.output, "driver_api"), "") << result.output;
  EXPECT_EQ(result.output.find("WRONG"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("dlopen and dlsym give the program's driver functions"),
            std::string::npos)
      << result.output;
  const std::string libcuda = reported(result.output, "libcuda.so.1 is");
  EXPECT_TRUE(same_file(libcuda, HIBER_DRIVER_STANDIN)) << "loaded: " << libcuda;
  EXPECT_FALSE(same_file(libcuda, HIBER_CUDA_STUB)) << "loaded: " << libcuda;
  const std::string driver = reported(result.output, "driver calls run in");
  EXPECT_TRUE(same_file(driver, shim_path())) << "driver calls in: " << driver;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

TEST_F(DriverStandinTest, WithoutTheShimEveryCallFailsClearly) {
  // No hiberd is needed: nothing gets as far as a session.
  std::vector<std::string> env = {"LD_LIBRARY_PATH=" + standin_dir()};
  // An instrumented stand-in loads only after its sanitizer's runtime.
  env.push_back("LD_PRELOAD=" + sanitizer_runtime());
  const auto result =
      run_program(program_argv({"driver_api", {HIBER_GAPS_PTX}}), env, std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(same_file(reported(result.output, "libcuda.so.1 is"), HIBER_DRIVER_STANDIN))
      << result.output;
  EXPECT_NE(result.output.find("cuInit(0) failed: ? (34)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("libcuda.so.1 is Hiber's stand-in for the NVIDIA driver, and "
                               "libhibercuda.so is not loaded: cuInit"),
            std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace hiber::testing::shim
