// Issue 18, item 2: a program whose hiberd is wedged, its listen queue full or silent after
// accepting, gets "no device" from its first call after HIBER_CONNECT_TIMEOUT_MS, with one log
// line naming the socket and the limit, and exits instead of hanging in cuInit. Both the driver
// API (driver_api: CUDA_ERROR_NO_DEVICE) and the runtime (vector_add: cudaErrorNoDevice).
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/integration/wedged_listener.h"
#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

using Wedge = WedgedListener::Wedge;

size_t count_of(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++count;
  }
  return count;
}

class ShimConnectTimeoutTest : public ::testing::TestWithParam<Wedge> {
 protected:
  void SetUp() override {
    if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  }

  // Runs `run` against `wedged` with a 300 ms deadline; the run's own limit is far above it, so
  // a hang shows as exit code -1.
  ProgramResult run_against(const WedgedListener& wedged, const ProgramRun& run) {
    const std::vector<std::string> env = {
        "LD_PRELOAD=" + shim_preload(),
        "LD_LIBRARY_PATH=" + std::filesystem::path(HIBER_DRIVER_STANDIN).parent_path().string(),
        "HIBER_SOCKET=" + wedged.path(),
        "HIBER_AUTH_TOKEN=any-token",
        "HIBER_FUNCTION_ID=" + run.name,
        "HIBER_CONNECT_TIMEOUT_MS=300"};
    return run_program(program_argv(run), env, std::chrono::seconds(60));
  }

  // The one log line about the session, naming the socket, the limit and the variable. (The
  // failing call's own log line, "cuInit failed (100): <why>", quotes it after its "failed".)
  void expect_one_clear_line(const std::string& output, const std::string& socket) {
    EXPECT_EQ(count_of(output, "] hibercuda: cannot open a session"), 1u) << output;
    const std::string what = GetParam() == Wedge::kQueueFull
                                 ? " accepted no connection within 300 ms"
                                 : " accepted the connection but did not answer the hello within "
                                   "300 ms";
    EXPECT_NE(output.find("hibercuda: cannot open a session (HIBER_CONNECT_TIMEOUT_MS=300): "
                          "hiberd at " +
                          socket + what),
              std::string::npos)
        << output;
  }
};

TEST_P(ShimConnectTimeoutTest, DriverCallFailsWithNoDevice) {
  WedgedListener wedged(GetParam());
  ASSERT_TRUE(wedged.ready()) << "could not wedge " << wedged.path();
  const auto result = run_against(wedged, {"driver_api", {HIBER_GAPS_PTX}});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("cuInit(0) failed: CUDA_ERROR_NO_DEVICE (100)"), std::string::npos)
      << result.output;
  expect_one_clear_line(result.output, wedged.path());
  if (GetParam() == Wedge::kSilent) {
    EXPECT_GE(wedged.accepted(), 1);
  }
}

TEST_P(ShimConnectTimeoutTest, RuntimeCallFailsWithNoDevice) {
  WedgedListener wedged(GetParam());
  ASSERT_TRUE(wedged.ready()) << "could not wedge " << wedged.path();
  const auto result = run_against(wedged, {"vector_add", {}});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("cudaGetDeviceCount(&devices) failed: cudaErrorNoDevice"),
            std::string::npos)
      << result.output;
  expect_one_clear_line(result.output, wedged.path());
}

// No hiberd at all (no socket) and so no token beside it: the shim says hiberd is not running
// there, before the missing token.
TEST(ShimWithoutHiberd, SaysHiberdIsNotRunningWhereItLooked) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  char dir[] = "/tmp/hiber-no-hiberd-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::vector<std::string> env = {
      "LD_PRELOAD=" + shim_preload(),
      "LD_LIBRARY_PATH=" + std::filesystem::path(HIBER_DRIVER_STANDIN).parent_path().string(),
      std::string("HIBER_RUN_DIR=") + dir,
      "HIBER_AUTH_TOKEN=",
      "HIBER_AUTH_TOKEN_FILE=",
      "HIBER_SOCKET=",
      "HIBER_FUNCTION_ID=lonely"};
  const auto result = run_program(program_argv({"vector_add", {}}), env, std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(std::string("hibercuda: hiberd is not running at ") + dir),
            std::string::npos)
      << result.output;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Wedges, ShimConnectTimeoutTest,
                         ::testing::Values(Wedge::kQueueFull, Wedge::kSilent),
                         [](const ::testing::TestParamInfo<Wedge>& info) {
                           return info.param == Wedge::kQueueFull ? "QueueFull"
                                                                  : "SilentAfterAccept";
                         });

}  // namespace
}  // namespace hiber::testing::shim
