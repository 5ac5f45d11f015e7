// Unmodified CUDA programs run through hiberd. Each program of tests/shim/programs runs
// with libhibercuda.so preloaded against a hiberd on the simulated GPU (which runs the programs'
// kernels with hiber_shim_programs_plugin), must print its OK line and exit 0, and must leave
// hiberd running with its session closed and no device memory held.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

using namespace std::chrono_literals;

// hiberd is up, has no session open, has closed all `expected_sessions` it opened and holds no
// device memory for sessions.
void expect_clean(const Hiberd& hiberd, uint64_t expected_sessions) {
  ASSERT_EQ(::kill(hiberd.pid(), 0), 0) << "hiberd is gone:\n" << hiberd.log();
  auto view = hiberd.wait_for(
      [&](const StatusView& v) {
        return v.sessions.empty() && v.sessions_closed == expected_sessions;
      },
      20s);
  ASSERT_TRUE(view.ok()) << view.status() << "\nhiberd:\n" << hiberd.log();
  EXPECT_TRUE(view->sessions.empty()) << "a session is still open";
  EXPECT_EQ(view->sessions_opened, expected_sessions) << "one session per program run";
  EXPECT_EQ(view->sessions_closed, expected_sessions);
  for (uint64_t bytes : view->device_session_bytes) EXPECT_EQ(bytes, 0u) << "device memory leaked";
}

class ShimProgramTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(ShimProgramTest, RunsUnmodifiedThroughHiberd) {
  const std::string name = GetParam();
  Hiberd hiberd(sim_hiberd_options());
  auto result = run_through_shim(hiberd, {name, {}}, name);
  EXPECT_EQ(result.exit_code, 0) << result.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(summary_line(result.output, name), "") << result.output;
  expect_clean(hiberd, 1);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

INSTANTIATE_TEST_SUITE_P(Programs, ShimProgramTest, ::testing::ValuesIn(all_programs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ShimErrorCases, TheNextClientIsServedNormally) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  Hiberd hiberd(sim_hiberd_options());
  auto errors = run_through_shim(hiberd, {"error_cases", {"4096", "2"}}, "error_cases");
  EXPECT_EQ(errors.exit_code, 0) << errors.output << "\nhiberd:\n" << hiberd.log();
  for (const char* expected :
       {"out_of_bounds_copy: cudaMemcpy(HostToDevice) -> cudaErrorInvalidValue",
        "destroyed_stream: cudaStreamSynchronize -> cudaErrorInvalidResourceHandle",
        "destroyed_stream: cudaMemsetAsync -> cudaErrorInvalidResourceHandle",
        "unknown_kernel: cudaLaunchKernel(host function) -> cudaErrorInvalidDeviceFunction",
        "over_quota_malloc: cudaMalloc(2 x total) -> cudaErrorMemoryAllocation",
        // Above the pools' largest block (2 GiB of a 4 GiB chunk): served in pieces, usable.
        "large_allocation: cudaMalloc(3000 MiB) served"}) {
    EXPECT_NE(errors.output.find(expected), std::string::npos) << expected << "\n" << errors.output;
  }
  EXPECT_EQ(errors.output.find("UNEXPECTED"), std::string::npos) << errors.output;
  EXPECT_EQ(errors.output.find("WRONG"), std::string::npos) << errors.output;
  // Another client, afterwards, on the same hiberd.
  auto next = run_through_shim(hiberd, {"vector_add", {"100000"}}, "after-errors");
  EXPECT_EQ(next.exit_code, 0) << next.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(summary_line(next.output, "vector_add"), "") << next.output;
  expect_clean(hiberd, 2);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// HIBER_AUTH_TOKEN_FILE names the token's file wherever it is mounted (a Kubernetes secret):
// hiberd keeps its token outside its run directory, and a program finds it only through the
// variable; a missing file is a clear error naming it.
TEST(ShimAuthToken, ReadFromHiberAuthTokenFile) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  char folder[] = "/tmp/hiber-secret-XXXXXX";
  ASSERT_NE(::mkdtemp(folder), nullptr);
  const std::string token_file = std::string(folder) + "/token";
  HiberdOptions options = sim_hiberd_options();
  options.extra_flags.push_back("--auth_token_file=" + token_file);
  Hiberd hiberd(options);
  ASSERT_EQ(::access((hiberd.run_dir() + "/auth-token").c_str(), F_OK), -1)
      << "the run directory must hold no token for this test";
  const ProgramRun run{"vector_add", {"100000"}};

  std::vector<std::string> env = shim_environment(hiberd, "secret-token");
  env.push_back("HIBER_AUTH_TOKEN_FILE=" + token_file);
  auto served = run_program(program_argv(run), env, 120s);
  EXPECT_EQ(served.exit_code, 0) << served.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(summary_line(served.output, "vector_add"), "") << served.output;

  auto without = run_program(program_argv(run), shim_environment(hiberd, "no-token"), 120s);
  EXPECT_NE(without.exit_code, 0) << without.output;
  EXPECT_NE(without.output.find("cannot read the auth token " + hiberd.run_dir() + "/auth-token"),
            std::string::npos)
      << without.output;

  env.back() = "HIBER_AUTH_TOKEN_FILE=" + std::string(folder) + "/missing";
  auto missing = run_program(program_argv(run), env, 120s);
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_NE(missing.output.find("cannot read the auth token " + std::string(folder) +
                                "/missing: No such file or directory"),
            std::string::npos)
      << missing.output;
  expect_clean(hiberd, 1);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
  std::filesystem::remove_all(folder);
}

// A cuBLAS call Hiber does not remote returns CUBLAS_STATUS_NOT_SUPPORTED (library_gemm checks
// that) and says so in the program's log, naming the call.
TEST(ShimLibraries, AStubSaysWhichCallIsNotSupported) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  Hiberd hiberd(sim_hiberd_options());
  auto result = run_through_shim(hiberd, {"library_gemm", {}}, "library_gemm-stub");
  EXPECT_EQ(result.exit_code, 0) << result.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(result.output.find("cuBLAS: cublasSsyrk_v2 is not supported by Hiber"),
            std::string::npos)
      << result.output;
  expect_clean(hiberd, 1);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// Bad arguments are refused by the program itself, before any CUDA call (exit status 2): the
// runner's own sanity check, which needs no shim.
// The synchronous round trips a run makes, from the shim's HIBER_STATS line at exit.
uint64_t round_trips(const Hiberd& hiberd, const ProgramRun& run) {
  std::vector<std::string> env = shim_environment(hiberd, run.name);
  env.push_back("HIBER_STATS=1");
  const ProgramResult result = run_program(program_argv(run), env, std::chrono::seconds(300));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const size_t at = result.output.find("hiber-shim stats: ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no stats line in:\n" << result.output;
    return 0;
  }
  unsigned long long calls = 0, batches = 0, trips = 0;
  EXPECT_EQ(std::sscanf(result.output.c_str() + at,
                        "hiber-shim stats: %llu calls in %llu batches, %llu round trips", &calls,
                        &batches, &trips),
            3)
      << result.output.substr(at);
  return trips;
}

// A warm inference waits for hiberd once, for its output, and no more: library calls, descriptor
// work, heuristics and plans (answered from the client's caches after the first inference) and
// the input's copy all go out in batches. One more inference per case of a run is exactly one
// more round trip per case (library_cnn: 4 cases, each copying its output back and then
// synchronising its stream), or none (library_transformer's repeats copy nothing back).
TEST(ShimLibraries, AWarmInferenceMakesNoRoundTripButItsOutputCopy) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  Hiberd hiberd(sim_hiberd_options());
  const uint64_t cnn_two = round_trips(hiberd, {"library_cnn", {"2"}});
  const uint64_t cnn_three = round_trips(hiberd, {"library_cnn", {"3"}});
  EXPECT_EQ(cnn_three - cnn_two, 4u) << "one round trip per warm inference of each of 4 cases";
  const uint64_t block_two = round_trips(hiberd, {"library_transformer", {"0", "2"}});
  const uint64_t block_three = round_trips(hiberd, {"library_transformer", {"0", "3"}});
  EXPECT_EQ(block_three, block_two) << "a warm transformer block makes no round trip";
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

TEST(ShimPrograms, RefuseBadArguments) {
  for (const std::string& name : all_programs()) {
    auto result = run_program({program_path(name), "not-a-number"}, 60s);
    EXPECT_EQ(result.exit_code, 2) << name << ": " << result.output;
  }
}

}  // namespace
}  // namespace hiber::testing::shim
