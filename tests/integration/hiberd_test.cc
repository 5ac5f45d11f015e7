// hiberd end to end: real hiberd processes on the simulated GPU, real client processes.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include "tests/integration/hiberd_harness.h"
#include "wire/control_client.h"
#include "wire/socket_frame.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;

std::vector<std::string> client_argv(const Hiberd& hiberd, const std::string& mode,
                                     std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {test_client_path(), "--mode=" + mode,
                                   "--socket=" + hiberd.socket_path(), "--token=" + hiberd.token()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

bool wait_for_line(const std::string& path, const std::string& text,
                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    std::stringstream all;
    all << in.rdbuf();
    if (all.str().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(Hiberd, AnswersHelpWithItsOwnFlags) {
  auto result = run_program({hiberd_path(), "--help"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("-device (GPU backend"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("-sim_kernel_plugins"), std::string::npos);
  for (const std::string& tool : {probe_path(), test_client_path()}) {
    auto help = run_program({tool, "--help"});
    EXPECT_EQ(help.exit_code, 0) << tool << ": " << help.output;
  }
}

TEST(Hiberd, RefusesABadDeviceFlag) {
  auto result = run_program({hiberd_path(), "--device=tpu", "--run_dir=/tmp/hiber-bad-flag"}, 20s);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("--device must be"), std::string::npos) << result.output;
}

TEST(Hiberd, ProbeReportsDevicesTopologyAndRoundTrips) {
  Hiberd hiberd;
  auto result = run_program({probe_path(), "--run_dir=" + hiberd.run_dir(), "--pings=200"});
  ASSERT_EQ(result.exit_code, 0) << result.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(result.output.find("NVIDIA H100 80GB HBM3"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("PCIe switch 1"), std::string::npos);
  EXPECT_NE(result.output.find("round trip over 200 synchronous calls"), std::string::npos);
  EXPECT_NE(result.output.find("matches the host reference"), std::string::npos);
  EXPECT_NE(result.output.find("hiber-probe: OK"), std::string::npos);
}

TEST(Hiberd, ServesManyClientsAtOnceWithCorrectResults) {
  Hiberd hiberd;
  const int baseline_fds = hiberd.settled_fds();
  constexpr int kClients = 24;
  std::vector<pid_t> clients;
  std::vector<std::string> logs;
  for (int i = 0; i < kClients; ++i) {
    logs.push_back(hiberd.run_dir() + "/client-" + std::to_string(i) + ".log");
    std::vector<std::string> extra = {"--function_id=fn-" + std::to_string(i),
                                      "--seed=" + std::to_string(i + 1), "--iterations=3",
                                      "--bytes=" + std::to_string((256 + 64 * i) << 10)};
    if (!kernels_fatbin_path().empty()) extra.push_back("--fatbin=" + kernels_fatbin_path());
    clients.push_back(spawn(client_argv(hiberd, "verify", extra), logs.back()));
  }
  for (int i = 0; i < kClients; ++i) {
    std::ifstream in(logs[i]);
    std::stringstream out;
    int code = wait_exit(clients[i], 120s);
    out << in.rdbuf();
    EXPECT_EQ(code, 0) << "client " << i << ": " << out.str();
  }
  auto view = hiberd.wait_for(
      [](const StatusView& v) { return v.sessions.empty() && v.sessions_closed == kClients; }, 10s);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->sessions_opened, uint64_t{kClients});
  EXPECT_EQ(view->sessions_closed, uint64_t{kClients});
  for (uint64_t bytes : view->device_session_bytes) EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(hiberd.wait_for_fds(baseline_fds), baseline_fds) << "hiberd leaked file descriptors";
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

TEST(Hiberd, AClientKilledMidBatchIsCleanedUpAndOthersAreUnaffected) {
  // A 64 KiB request ring: the victims' 4096-call batches are several fragments long, so a kill
  // lands in the middle of a message.
  Hiberd hiberd({"--request_ring_kib=64"});
  const int baseline_fds = hiberd.settled_fds();
  const std::string bystander_log = hiberd.run_dir() + "/bystander.log";
  pid_t bystander = spawn(client_argv(hiberd, "verify",
                                      {"--function_id=bystander", "--iterations=30",
                                       "--bytes=" + std::to_string(2 << 20)}),
                          bystander_log);
  std::mt19937 rng(42);
  constexpr int kVictims = 6;
  for (int i = 0; i < kVictims; ++i) {
    const std::string log = hiberd.run_dir() + "/victim-" + std::to_string(i) + ".log";
    pid_t victim = spawn(client_argv(hiberd, "victim", {"--function_id=victim"}), log);
    ASSERT_TRUE(wait_for_line(log, "READY", 30s)) << "victim " << i << " never got ready";
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    EXPECT_EQ(wait_exit(victim, 10s), 128 + SIGKILL);
  }
  int code = wait_exit(bystander, 120s);
  std::ifstream in(bystander_log);
  std::stringstream out;
  out << in.rdbuf();
  EXPECT_EQ(code, 0) << "the bystander was affected: " << out.str() << "\nhiberd:\n"
                     << hiberd.log();

  auto view = hiberd.wait_for([](const StatusView& v) { return v.sessions.empty(); }, 20s);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->sessions.empty()) << "a killed client's session is still open";
  EXPECT_EQ(view->sessions_closed, view->sessions_opened);
  EXPECT_EQ(view->sessions_opened, uint64_t{kVictims + 1});
  for (uint64_t bytes : view->device_session_bytes) EXPECT_EQ(bytes, 0u) << "device memory leaked";
  EXPECT_EQ(hiberd.wait_for_fds(baseline_fds), baseline_fds) << "hiberd leaked file descriptors";
  // A fresh client is served normally afterwards.
  auto after = run_program(client_argv(hiberd, "verify", {"--iterations=1"}));
  EXPECT_EQ(after.exit_code, 0) << after.output;
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

TEST(Hiberd, AnIdleServerAndClientBurnNoCpu) {
  Hiberd hiberd;
  const std::string log = hiberd.run_dir() + "/idle.log";
  pid_t client = spawn(client_argv(hiberd, "idle", {"--seconds=4"}), log);
  ASSERT_TRUE(wait_for_line(log, "READY", 30s));
  std::this_thread::sleep_for(300ms);  // past any adaptive spinning after the last call
  const auto server_before = hiberd.cpu_time();
  const auto client_before = process_cpu_time(client);
  std::this_thread::sleep_for(2s);
  const auto server_used = hiberd.cpu_time() - server_before;
  const auto client_used = process_cpu_time(client) - client_before;
  // Two seconds of spinning would be ~2000 ms; sleeping costs nothing measurable.
  EXPECT_LT(server_used.count(), 100) << "hiberd burns CPU while idle";
  EXPECT_LT(client_used.count(), 100) << "the client burns CPU while idle";
  EXPECT_EQ(wait_exit(client, 30s), 0);
}

TEST(Hiberd, ShutsDownCleanlyWithSessionsOpen) {
  Hiberd hiberd;
  std::vector<std::unique_ptr<wire::CallClient>> clients;
  for (int i = 0; i < 3; ++i) {
    auto c = hiberd.connect("open-" + std::to_string(i));
    ASSERT_TRUE(c.ok()) << c.status();
    const uint64_t va = (*c)->session().grant.va_base;
    ASSERT_TRUE((*c)->enqueue([&](proto::Call::Builder call) {
                      auto a = call.initMemAllocate();
                      a.setVa(va);
                      a.setBytes(8 << 20);
                    })
                    .ok());
    ASSERT_TRUE((*c)->ping().ok());
    clients.push_back(std::move(c).value());
  }
  // Exit status 0 also means no leak report from the sanitizer build.
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
  for (auto& c : clients) {
    Status after = c->ping();
    EXPECT_EQ(after.code(), ErrorCode::kDeinitialized) << after;
  }
}

TEST(Hiberd, RunningOutOfFileDescriptorsIsSurvived) {
  // 64 descriptors in all: a few dozen silent connections exhaust them.
  Hiberd hiberd({}, /*fd_limit=*/64);
  std::vector<UniqueFd> crowd;
  for (int i = 0; i < 80; ++i) {
    auto s = wire::connect_unix(hiberd.socket_path());
    if (s.ok()) crowd.push_back(std::move(s).value());
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_NE(hiberd.log().find("Too many open files"), std::string::npos) << hiberd.log();
  crowd.clear();
  // Descriptors come back; accepting resumes and hiberd serves as before.
  auto after = run_program(client_argv(hiberd, "verify", {"--iterations=1"}), 60s);
  EXPECT_EQ(after.exit_code, 0) << after.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// Queues `copies` throttled 32 MiB copies on a new session and returns its client.
std::unique_ptr<wire::CallClient> queue_slow_copies(const Hiberd& hiberd, int copies) {
  auto c = hiberd.connect("busy");
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  const uint64_t va = (*c)->session().grant.va_base;
  EXPECT_TRUE((*c)->enqueue([&](proto::Call::Builder call) {
                    auto a = call.initMemAllocate();
                    a.setVa(va);
                    a.setBytes(32 << 20);
                  })
                  .ok());
  auto staged = (*c)->stage(32 << 20);
  EXPECT_TRUE(staged.ok());
  for (int i = 0; i < copies && staged.ok(); ++i) {
    EXPECT_TRUE((*c)->enqueue([&](proto::Call::Builder call) {
                      auto m = call.initMemcpyHtoD();
                      m.setDst(va);
                      m.setSrcOffset(staged->offset);
                      m.setBytes(32 << 20);
                    })
                    .ok());
  }
  EXPECT_TRUE((*c)->flush().ok());
  return std::move(c).value();
}

TEST(Hiberd, ShutdownDoesNotWaitForeverForDeviceWork) {
  Hiberd hiberd(
      {"--sim_throttle", "--shutdown_timeout_ms=1000", "--node_config=" + slow_node_config()});
  auto client = queue_slow_copies(hiberd, 40);  // about 13 s of copying
  ASSERT_NE(client, nullptr);
  std::this_thread::sleep_for(100ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(hiberd.stop(20s), 2) << "hiberd should give up on the session's work";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Hiberd, ASecondSignalExitsAtOnce) {
  Hiberd hiberd({"--sim_throttle", "--node_config=" + slow_node_config()});
  auto client = queue_slow_copies(hiberd, 40);
  ASSERT_NE(client, nullptr);
  std::this_thread::sleep_for(100ms);
  ::kill(hiberd.pid(), SIGTERM);
  std::this_thread::sleep_for(300ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(hiberd.stop(10s), 2);  // the second SIGTERM
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(Hiberd, StatusListsHundredsOfSessions) {
  Hiberd hiberd({"--arena_mib=1", "--default_quota_mib=64"});
  std::vector<std::unique_ptr<wire::CallClient>> clients;
  for (int i = 0; i < 200; ++i) {
    auto c = hiberd.connect(std::string(200, 'a' + i % 26) + std::to_string(i));
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    clients.push_back(std::move(c).value());
  }
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->sessions.size(), 200u);
  EXPECT_EQ(view->malformed_messages, 0u);
}

TEST(Hiberd, RefusesARunDirectoryOthersCanWrite) {
  char tmpl[] = "/tmp/hiber-open-dir-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ::chmod(dir.c_str(), 0777);  // anybody could swap the sockets in here
  auto result = run_program({hiberd_path(), "--device=sim", "--run_dir=" + dir}, 20s);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("writable only by us"), std::string::npos) << result.output;
  ::rmdir(dir.c_str());
}

TEST(Hiberd, RefusesToStealTheSocketOfARunningHiberd) {
  Hiberd hiberd;
  auto second = run_program({hiberd_path(), "--device=sim", "--run_dir=" + hiberd.run_dir()}, 20s);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.output.find("already serving"), std::string::npos) << second.output;
  EXPECT_TRUE(hiberd.status().ok());
}

TEST(Hiberd, EnforcesTheQuotaAndTheGrant) {
  Hiberd hiberd({"--default_quota_mib=16"});
  auto c = hiberd.connect("quota");
  ASSERT_TRUE(c.ok()) << c.status();
  const wire::Grant grant = (*c)->session().grant;
  EXPECT_EQ(grant.quota_bytes, 16u << 20);
  auto allocate = [&](uint64_t va, uint64_t bytes) {
    return (*c)->call([&](proto::Call::Builder call) {
      auto a = call.initMemAllocate();
      a.setVa(va);
      a.setBytes(bytes);
    });
  };
  EXPECT_TRUE(allocate(grant.va_base, 8 << 20).ok());
  auto over = allocate(grant.va_base + (8 << 20), 10 << 20);
  EXPECT_EQ(over.status().code(), ErrorCode::kOutOfMemory) << over.status();
  auto outside = allocate(grant.va_base + grant.va_bytes, 2 << 20);
  EXPECT_EQ(outside.status().code(), ErrorCode::kInvalidValue) << outside.status();
  auto overlap = allocate(grant.va_base + (2 << 20), 2 << 20);
  EXPECT_EQ(overlap.status().code(), ErrorCode::kInvalidValue) << overlap.status();
  EXPECT_TRUE(allocate(grant.va_base + (8 << 20), 8 << 20).ok());
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->sessions.size(), 1u);
  EXPECT_EQ(view->sessions[0].allocated_bytes, 16u << 20);
  // A client asking for more than the maximum is refused at the handshake.
  auto options = hiberd.client_options("greedy");
  options.requested_quota_bytes = uint64_t{1} << 50;
  auto greedy = wire::ClientChannel::connect(options);
  ASSERT_FALSE(greedy.ok());
  EXPECT_EQ(greedy.status().code(), ErrorCode::kOutOfMemory) << greedy.status();
}

TEST(Hiberd, LaunchesKernelsFromARealFatbin) {
  if (kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no fatbin";
  Hiberd hiberd;
  auto result = run_program(
      client_argv(hiberd, "verify", {"--iterations=1", "--fatbin=" + kernels_fatbin_path()}));
  EXPECT_EQ(result.exit_code, 0) << result.output << "\nhiberd:\n" << hiberd.log();
  EXPECT_NE(result.output.find("and vec_add"), std::string::npos);
}

// Who may resume a kept session after hiberd restarts: only a client with the node's auth
// token (checked before the record is looked at), presenting the session's resume token for the
// same function, which then gets its own address range back. Refusals leave the session kept.
TEST(Hiberd, AKeptSessionResumesOnlyForItsTokenItsFunctionAndTheAuthToken) {
  Hiberd hiberd;
  auto control = wire::ControlClient::connect(hiberd.control_socket_path(), 60s);
  ASSERT_TRUE(control.ok()) << control.status();
  for (const char* id : {"kept", "other"}) {
    ASSERT_TRUE(control->register_function({.function_id = id, .slo_ms = 60000}).ok());
  }
  auto client = hiberd.connect("kept");
  ASSERT_TRUE(client.ok()) << client.status();
  const wire::SessionInfo session = (*client)->session();
  ASSERT_FALSE(session.resume_token.empty()) << "hiberd keeps sessions by default";
  auto allocated = (*client)->call([&](proto::Call::Builder call) {
    auto a = call.initMemAllocate();
    a.setVa(session.grant.va_base);
    a.setBytes(2 << 20);
  });
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  // Its first request fixes the model: from then on the session is kept.
  auto started = control->request_begin("kept");
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(control->request_done(started->request_id).ok());
  ASSERT_EQ(hiberd.wait_for_session_records(1), 1u) << hiberd.log();
  hiberd.kill_and_restart(0ms);

  wire::ClientOptions resume = hiberd.client_options("kept");
  resume.resume_token = session.resume_token;
  wire::ClientOptions no_credential = resume;
  no_credential.auth_token = std::string(resume.auth_token.size(), 'x');
  auto intruder = wire::ClientChannel::connect(no_credential);
  ASSERT_FALSE(intruder.ok());
  EXPECT_EQ(intruder.status().code(), ErrorCode::kNotPermitted) << intruder.status();
  EXPECT_NE(intruder.status().message().find("wrong auth token"), std::string::npos)
      << intruder.status();
  wire::ClientOptions other_function = hiberd.client_options("other");
  other_function.resume_token = session.resume_token;
  auto foreign = wire::ClientChannel::connect(other_function);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), ErrorCode::kNotPermitted) << foreign.status();
  EXPECT_NE(foreign.status().message().find("another function"), std::string::npos)
      << foreign.status();
  wire::ClientOptions guessed = resume;
  guessed.resume_token[0] = guessed.resume_token[0] == '0' ? '1' : '0';
  auto unknown = wire::ClientChannel::connect(guessed);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kNotFound) << unknown.status();

  auto resumed = wire::ClientChannel::connect(resume);
  ASSERT_TRUE(resumed.ok()) << resumed.status() << "\n" << hiberd.log();
  EXPECT_TRUE((*resumed)->session().resumed);
  EXPECT_EQ((*resumed)->session().grant.va_base, session.grant.va_base);
  EXPECT_EQ((*resumed)->session().grant.va_bytes, session.grant.va_bytes);
  EXPECT_FALSE(wire::ClientChannel::connect(resume).ok()) << "a session resumes once";
}

// Numbers hiberd converts to integers are checked first: NaN, infinities and negative values are
// refused with the field's name, and a valid registration still works afterwards.
TEST(Hiberd, RegistrationNumbersThatAreNotFiniteAreRefused) {
  Hiberd hiberd;
  auto control = wire::ControlClient::connect(hiberd.control_socket_path());
  ASSERT_TRUE(control.ok()) << control.status();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double hint : {nan, inf, -inf, -1.0}) {
    const Status refused =
        control->register_function({.function_id = "f", .slo_ms = 100, .exec_ms_hint = hint});
    EXPECT_EQ(refused.code(), ErrorCode::kInvalidValue) << hint;
    EXPECT_NE(refused.message().find("execMsHint"), std::string::npos) << refused;
  }
  for (double slo : {nan, inf, -inf, 0.0}) {
    const Status refused = control->register_function({.function_id = "f", .slo_ms = slo});
    EXPECT_EQ(refused.code(), ErrorCode::kInvalidValue) << slo;
    EXPECT_NE(refused.message().find("sloMs"), std::string::npos) << refused;
  }
  for (double percentile : {nan, inf, -inf, -0.5, 1.0}) {
    const Status refused = control->register_function(
        {.function_id = "f", .slo_ms = 100, .tail_percentile = percentile});
    EXPECT_EQ(refused.code(), ErrorCode::kInvalidValue) << percentile;
    EXPECT_NE(refused.message().find("tailPercentile"), std::string::npos) << refused;
  }
  EXPECT_TRUE(
      control->register_function({.function_id = "f", .slo_ms = 100, .exec_ms_hint = 5}).ok());
}

// Registrations are capped per node: past --max_registered_functions a registration is refused
// with the flag's name, and unregistering one makes room again.
TEST(Hiberd, RegistrationsPastTheCapAreRefused) {
  Hiberd hiberd({"--max_registered_functions=3"});
  auto control = wire::ControlClient::connect(hiberd.control_socket_path());
  ASSERT_TRUE(control.ok()) << control.status();
  for (const char* id : {"f1", "f2", "f3"}) {
    EXPECT_TRUE(control->register_function({.function_id = id, .slo_ms = 100}).ok()) << id;
  }
  const Status refused = control->register_function({.function_id = "f4", .slo_ms = 100});
  EXPECT_EQ(refused.code(), ErrorCode::kDeviceUnavailable) << refused;
  EXPECT_NE(refused.message().find("--max_registered_functions"), std::string::npos) << refused;
  ASSERT_TRUE(control->unregister_function("f2").ok());
  EXPECT_TRUE(control->register_function({.function_id = "f4", .slo_ms = 100}).ok());
}

// A function id reaches logs and terminals: one with a newline or an escape sequence, or longer
// than 256 bytes, is refused by every control call that names one.
TEST(Hiberd, FunctionIdsMustBePrintableAndShort) {
  Hiberd hiberd;
  auto control = wire::ControlClient::connect(hiberd.control_socket_path());
  ASSERT_TRUE(control.ok()) << control.status();
  for (const std::string& id : {std::string("two\nlines"), std::string("\x1b[2Jcleared"),
                                std::string(257, 'a'), std::string("tab\there"), std::string()}) {
    const Status registered = control->register_function({.function_id = id, .slo_ms = 100});
    EXPECT_EQ(registered.code(), ErrorCode::kInvalidValue);
    EXPECT_NE(registered.message().find("function id"), std::string::npos) << registered;
    const auto arrived = control->request_arrived(id);
    EXPECT_EQ(arrived.status().code(), ErrorCode::kInvalidValue);
    EXPECT_EQ(control->unregister_function(id).code(), ErrorCode::kInvalidValue);
  }
  EXPECT_TRUE(
      control->register_function({.function_id = std::string(256, 'a'), .slo_ms = 100}).ok());
  EXPECT_TRUE(control->register_function({.function_id = "resnet-50 v1.2", .slo_ms = 100}).ok());
  EXPECT_TRUE(control->ping().ok());
}

}  // namespace
}  // namespace hiber::testing
