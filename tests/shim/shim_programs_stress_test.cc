// The CUDA programs under load: six clients at once, each running CUDA programs in a loop through
// the shim against one hiberd on the simulated GPU, with larger sizes; one client is SIGKILLed in
// the middle of its run. Every other run must succeed with exact results, hiberd must stay up, and
// afterwards every session must be closed with no device memory held.
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

using namespace std::chrono_literals;

bool wait_for_text(const std::string& path, const std::string& text,
                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_file(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(ShimStress, SixClientsInLoopsOneKilled) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  Hiberd hiberd(sim_hiberd_options());

  // Five clients looping over programs; each client runs its list `kRounds` times.
  constexpr int kRounds = 3;
  const std::vector<std::vector<ProgramRun>> clients = {
      {{"vector_add", {"1048576", "8"}}},
      {{"saxpy_streams", {"262144", "200", "6"}}},
      {{"pinned_overlap", {"1048576", "6", "4", "16"}}},
      {{"d2d_memset", {"4194311", "4"}}, {"tiny_mlp", {"256", "8"}}},
      {{"error_cases", {"65536", "2"}}, {"dlopen_runtime", {"8388608", "16"}}},
  };
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::atomic<int> runs{0};
  std::vector<std::thread> threads;
  for (size_t c = 0; c < clients.size(); ++c) {
    threads.emplace_back([&, c] {
      for (int round = 0; round < kRounds; ++round) {
        for (const ProgramRun& run : clients[c]) {
          const std::string id = "stress-" + std::to_string(c) + "-" + run.name;
          auto result = run_through_shim(hiberd, run, id, 600s);
          ++runs;
          if (result.exit_code != 0 || summary_line(result.output, run.name).empty()) {
            std::lock_guard lock(failures_mutex);
            failures.push_back(id + " round " + std::to_string(round) + ": exit " +
                               std::to_string(result.exit_code) + "\n" + result.output);
          }
        }
      }
    });
  }

  // The sixth client: a long saxpy_streams, killed once it has its session and device memory.
  const std::string victim_log = hiberd.run_dir() + "/victim.log";
  const pid_t victim = spawn_through_shim(hiberd, {"saxpy_streams", {"1048576", "1000000", "4"}},
                                          "stress-victim", victim_log);
  bool victim_killed = false;
  [&] {
    ASSERT_TRUE(wait_for_text(victim_log, "saxpy_streams: start", 120s))
        << "the victim never started:\n"
        << read_file(victim_log);
    // Its session, once hiberd has seen its allocations (the shim may send them in a later
    // batch than the one cudaMalloc returned from).
    auto seen = hiberd.wait_for(
        [&](const StatusView& v) {
          for (const auto& s : v.sessions)
            if (s.function_id == "stress-victim" && s.allocated_bytes > 0) return true;
          return false;
        },
        20s);
    ASSERT_TRUE(seen.ok()) << seen.status();
    bool victim_session = false;
    for (const auto& s : seen->sessions) {
      if (s.function_id != "stress-victim") continue;
      victim_session = true;
      EXPECT_EQ(s.pid, victim) << "the session's pid is not the program's";
      EXPECT_GT(s.allocated_bytes, 0u) << "the victim's session holds no device memory";
    }
    EXPECT_TRUE(victim_session) << "no session with HIBER_FUNCTION_ID=stress-victim";
    std::mt19937 rng(std::random_device{}());
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 400));
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    victim_killed = true;
    EXPECT_EQ(wait_exit(victim, 30s), 128 + SIGKILL) << read_file(victim_log);
  }();
  if (!victim_killed) {  // an assertion above failed: do not leave it running
    ::kill(victim, SIGKILL);
    wait_exit(victim, 30s);
  }

  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
  if (!victim_killed) return;  // the session count below assumes the kill

  // hiberd is up and every session, the victim's included, is closed with its memory freed.
  // The victim's session closes once its queued work is cancelled (hiberd drops what a dead
  // client queued and has not started).
  const uint64_t sessions = static_cast<uint64_t>(runs.load()) + 1;
  auto view = hiberd.wait_for(
      [&](const StatusView& v) { return v.sessions.empty() && v.sessions_closed == sessions; },
      30s);
  ASSERT_TRUE(view.ok()) << "hiberd does not answer: " << view.status() << "\n" << hiberd.log();
  EXPECT_TRUE(view->sessions.empty()) << "a session is still open";
  EXPECT_EQ(view->sessions_opened, sessions);
  EXPECT_EQ(view->sessions_closed, sessions);
  for (uint64_t bytes : view->device_session_bytes) EXPECT_EQ(bytes, 0u) << "device memory leaked";
  // And it still serves.
  auto after = run_through_shim(hiberd, {"vector_add", {"4096"}}, "after-stress");
  EXPECT_EQ(after.exit_code, 0) << after.output;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

}  // namespace
}  // namespace hiber::testing::shim
