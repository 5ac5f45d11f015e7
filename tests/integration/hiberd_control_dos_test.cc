// Denial of service through hiberd's sockets (issue 18, items 1, 4 and 7): a burst of connections
// that overflows the io_uring completion queue, a status report of thousands of functions, idle
// and crowding control connections, and the control token on the Unix control socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "tests/integration/hiberd_harness.h"
#include "wire/client_channel.h"
#include "wire/control_client.h"
#include "wire/control_codec.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;

std::string hiberctl_path() { return HIBERCTL_PATH; }

// A control request frame of `body` with `token` ("" sends none).
std::vector<std::byte> request_frame(wire::control::RequestBody body, const std::string& token) {
  capnp::MallocMessageBuilder request;
  wire::write_control_request(
      request.initRoot<proto::ControlRequest>(),
      wire::control::Request{wire::current_protocol_version(), std::move(body), token});
  auto frame = wire::encode_frame(request);
  EXPECT_TRUE(frame.ok()) << frame.status();
  return frame.ok() ? std::move(*frame) : std::vector<std::byte>{};
}

// Sends one control request on `fd`; hiberd's reply, or its error answer as a Status.
// A control reply's error as a Status (OK for any other reply).
Status reply_error(const wire::Message& reply) {
  return wire::read_message<proto::ControlReply>(
      reply, "reply", [](proto::ControlReply::Reader r) -> Status {
        if (!r.isError()) return Status();
        return Status(static_cast<ErrorCode>(r.getError().getCode()), r.getError().getMessage());
      });
}

Result<wire::Message> exchange(int fd, wire::control::RequestBody body, const std::string& token) {
  wire::Message reply;
  HIBER_RETURN_IF_ERROR(wire::exchange_frame(fd, request_frame(std::move(body), token), reply,
                                             nullptr, 10s, wire::kMaxControlReplyBytes));
  Status refused = reply_error(reply);
  if (!refused.ok()) return refused;
  return reply;
}

// A TCP connection to 127.0.0.1:port from `source` (another loopback address is another peer).
UniqueFd connect_from(const char* source, int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0)
      << std::strerror(errno);
  return fd;
}

int read_port(const std::string& path) {
  for (int i = 0; i < 1500; ++i) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

// ---- Item 1: the accept loop survives a completion queue overflow ----

// Connects to a Unix socket without waiting (a hiberd that stopped accepting fills its backlog,
// and a blocking connect would then wait for ever), and closes at once. Whether it connected.
bool connect_and_close(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

TEST(ControlDos, AcceptingSurvivesABurstThatOverflowsTheCompletionQueue) {
  // A completion queue of 4 entries: a burst of connections overflows it at once.
  Hiberd hiberd({"--io_queue_depth=4", "--io_completion_entries=4"});
  const std::string paths[] = {hiberd.socket_path(), hiberd.control_socket_path()};
  std::vector<std::thread> burst;
  std::atomic<int> connected{0};
  for (int t = 0; t < 8; ++t) {
    burst.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        if (connect_and_close(paths[(t + i) % 2])) ++connected;
      }
    });
  }
  for (auto& thread : burst) thread.join();
  EXPECT_GT(connected.load(), 0);
  // The kernel ended the multishot accepts with a socket and no F_MORE; hiberd accepted again.
  ASSERT_NE(hiberd.log().find("multishot accept ended"), std::string::npos) << hiberd.log();
  // Both sockets still serve: a function and a control request.
  auto function = hiberd.connect("after-the-burst");
  ASSERT_TRUE(function.ok()) << function.status();
  EXPECT_TRUE((*function)->ping().ok());
  auto control = hiberd.control();
  ASSERT_TRUE(control.ok()) << control.status();
  EXPECT_TRUE(control->ping().ok());
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->sessions.size(), 1u);
}

// ---- Item 4: a status report of thousands of functions ----

// A printable 256-byte function id (the longest allowed), distinct per index.
std::string long_id(int index) {
  std::string id = "function-" + std::to_string(index) + "-";
  id.resize(wire::kMaxFunctionIdBytes, 'x');
  return id;
}

constexpr int kManyFunctions = 5000;

void register_many(Hiberd& hiberd) {
  auto control = hiberd.control();
  ASSERT_TRUE(control.ok()) << control.status();
  for (int i = 0; i < kManyFunctions; ++i) {
    wire::FunctionRegistration r;
    r.function_id = long_id(i);
    r.slo_ms = 100;
    ASSERT_TRUE(control->register_function(r).ok()) << i;
  }
}

TEST(ControlDos, StatusListsThousandsOfFunctionsWithLongIds) {
  // More than the default cap on registrations (--max_registered_functions, 4096).
  Hiberd hiberd({"--max_registered_functions=" + std::to_string(kManyFunctions)});
  register_many(hiberd);

  // hiberctl fetches every page and prints every function.
  auto status = run_program({hiberctl_path(), "--run_dir=" + hiberd.run_dir(), "status"});
  ASSERT_EQ(status.exit_code, 0) << status.output.substr(0, 2000);
  EXPECT_NE(status.output.find(std::to_string(kManyFunctions) + " functions"), std::string::npos);
  std::set<std::string> listed;
  std::istringstream lines(status.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("function-");
    if (at != std::string::npos) listed.insert(line.substr(at, wire::kMaxFunctionIdBytes));
  }
  EXPECT_EQ(listed.size(), size_t{kManyFunctions});
  for (int i = 0; i < kManyFunctions; ++i) EXPECT_EQ(listed.count(long_id(i)), 1u) << i;

  // Pages by hand: a page holds what was asked and says how many there are in all.
  auto socket = wire::connect_unix(hiberd.control_socket_path());
  ASSERT_TRUE(socket.ok());
  const std::string token = *wire::read_token_file(hiberd.control_token_file());
  auto page = exchange(socket->get(), wire::control::StatusQuery{4500, 1000}, token);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_TRUE(wire::read_message<proto::ControlReply>(
                  *page, "page",
                  [](proto::ControlReply::Reader r) -> Status {
                    EXPECT_EQ(r.getStatus().getFunctionCount(), uint64_t(kManyFunctions));
                    EXPECT_EQ(r.getStatus().getFunctionOffset(), 4500u);
                    EXPECT_EQ(r.getStatus().getFunctions().size(), 500u);
                    return Status();
                  })
                  .ok());
  // A request of a client before 1.5 (no limit) still gets every function at once, through
  // however many short writes the socket takes.
  auto all = exchange(socket->get(), wire::control::StatusQuery{}, token);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_GT(all->size(), size_t{kManyFunctions} * wire::kMaxFunctionIdBytes);
  ASSERT_TRUE(wire::read_message<proto::ControlReply>(
                  *all, "all",
                  [](proto::ControlReply::Reader r) -> Status {
                    EXPECT_EQ(r.getStatus().getFunctions().size(), uint32_t(kManyFunctions));
                    return Status();
                  })
                  .ok());
}

// ---- Item 7: idle and crowding control connections, the control token ----

TEST(ControlDos, AnIdleControlConnectionIsClosed) {
  Hiberd hiberd({"--control_idle_timeout_ms=300"});
  auto idle = wire::connect_unix(hiberd.control_socket_path());
  ASSERT_TRUE(idle.ok());
  wire::Message nothing;
  const Status closed = wire::receive_frame(idle->get(), nothing, nullptr, 10s);
  EXPECT_EQ(closed.code(), ErrorCode::kDeinitialized) << closed;

  // So is one idle after a request.
  auto used = wire::connect_unix(hiberd.control_socket_path());
  ASSERT_TRUE(used.ok());
  const std::string token = *wire::read_token_file(hiberd.control_token_file());
  ASSERT_TRUE(exchange(used->get(), wire::control::Ping{}, token).ok());
  const Status closed_after = wire::receive_frame(used->get(), nothing, nullptr, 10s);
  EXPECT_EQ(closed_after.code(), ErrorCode::kDeinitialized) << closed_after;

  // A client left idle as long reconnects by itself on its next request.
  auto client = hiberd.control();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(client->ping().ok());
  std::this_thread::sleep_for(1s);
  EXPECT_TRUE(client->ping().ok());
}

TEST(ControlDos, APeerWithManyIdleConnectionsCannotStarveAnother) {
  const std::string token_file = "/tmp/hiber-dos-token-" + std::to_string(::getpid());
  { std::ofstream(token_file) << "crowd-token\n"; }
  ASSERT_EQ(::chmod(token_file.c_str(), 0600), 0);
  const std::string port_file = token_file + ".port";
  Hiberd hiberd({"--max_pending_per_peer=8", "--max_pending_connections=32",
                 "--control_tcp_listen=127.0.0.1:0", "--control_tcp_port_file=" + port_file,
                 "--control_token_file=" + token_file});
  const int port = read_port(port_file);
  ASSERT_GT(port, 0) << hiberd.log();

  // The harness's readiness probes are gone.
  hiberd.settled_fds();
  // This uid fills its share of the Unix sockets with silent connections...
  std::vector<UniqueFd> crowd;
  for (int i = 0; i < 8; ++i) {
    auto fd = wire::connect_unix(hiberd.control_socket_path());
    ASSERT_TRUE(fd.ok());
    crowd.push_back(std::move(*fd));
  }
  // ... and 127.0.0.1 its share of the TCP listener.
  for (int i = 0; i < 8; ++i) crowd.push_back(connect_from("127.0.0.1", port));
  hiberd.settled_fds();  // all accepted

  // Each holds no more: a newer connection of the same peer is served, and the peer's oldest
  // silent connection is dropped for it, told why (so a squatter cannot lock out its own uid's
  // other clients either).
  auto more = wire::connect_unix(hiberd.control_socket_path());
  ASSERT_TRUE(more.ok());
  EXPECT_TRUE(exchange(more->get(), wire::control::Ping{}, "crowd-token").ok());
  UniqueFd more_tcp = connect_from("127.0.0.1", port);
  EXPECT_TRUE(exchange(more_tcp.get(), wire::control::Ping{}, "crowd-token").ok());
  for (int oldest : {0, 8}) {  // the first Unix and the first TCP connection
    wire::Message reply;
    ASSERT_TRUE(wire::receive_frame(crowd[oldest].get(), reply, nullptr, 5s).ok()) << oldest;
    Status dropped = reply_error(reply);
    EXPECT_EQ(dropped.code(), ErrorCode::kDeviceUnavailable) << dropped;
    EXPECT_NE(dropped.message().find("the most one peer may hold"), std::string::npos) << dropped;
  }
  // Connections that proved the token are no longer pending: a router holds one per request
  // in flight, more than the caps, and none of them is dropped or keeps another out.
  std::vector<UniqueFd> proven;
  for (int i = 0; i < 40; ++i) {  // past the per-peer (8) and global (32) caps
    proven.push_back(connect_from("127.0.0.3", port));
    ASSERT_TRUE(exchange(proven.back().get(), wire::control::Ping{}, "crowd-token").ok()) << i;
  }
  for (UniqueFd& p : proven) EXPECT_TRUE(exchange(p.get(), wire::control::Ping{}, "crowd-token").ok());

  // Another peer is served.
  UniqueFd other = connect_from("127.0.0.2", port);
  EXPECT_TRUE(exchange(other.get(), wire::control::Ping{}, "crowd-token").ok());
  crowd.clear();
  ::unlink(token_file.c_str());
  ::unlink(port_file.c_str());
}

TEST(ControlDos, TheUnixControlSocketAsksForTheControlToken) {
  Hiberd hiberd;
  // hiberd made one, beside its control socket, for its uid only.
  auto token = wire::read_token_file(hiberd.control_token_file());
  ASSERT_TRUE(token.ok()) << token.status();
  struct stat st {};
  ASSERT_EQ(::stat(hiberd.control_token_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string auth_token = hiberd.token();
  ASSERT_NE(*token, auth_token);

  auto expect_refused = [&](const std::string& presented, const std::string& reason) {
    auto socket = wire::connect_unix(hiberd.control_socket_path());
    ASSERT_TRUE(socket.ok());
    wire::FunctionRegistration r;
    r.function_id = "stolen";
    r.slo_ms = 10;
    auto reply = exchange(socket->get(), r, presented);
    EXPECT_EQ(reply.status().code(), ErrorCode::kNotPermitted) << reply.status();
    EXPECT_NE(reply.status().message().find(reason), std::string::npos) << reply.status();
  };
  expect_refused("", "must carry the node's control token");
  expect_refused("not-the-token", "wrong control token");
  // A function's auth token is no operator's.
  expect_refused(auth_token, "wrong control token");
  auto view = hiberd.control();
  ASSERT_TRUE(view.ok());
  auto status = view->status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(wire::read_message<proto::ControlReply>(
                  *status, "status",
                  [](proto::ControlReply::Reader r) -> Status {
                    EXPECT_EQ(r.getStatus().getFunctions().size(), 0u) << "nothing registered";
                    return Status();
                  })
                  .ok());

  // Nor is the control token a function's.
  wire::ClientOptions options = hiberd.client_options("operator-as-function");
  options.auth_token = *token;
  auto channel = wire::ClientChannel::connect(options);
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().code(), ErrorCode::kNotPermitted) << channel.status();
  EXPECT_NE(channel.status().message().find("wrong auth token"), std::string::npos)
      << channel.status();

  // hiberctl finds the token beside the socket; given the wrong file, it is refused.
  auto ping = run_program({hiberctl_path(), "--run_dir=" + hiberd.run_dir(), "ping"});
  EXPECT_EQ(ping.exit_code, 0) << ping.output;
  const std::string auth_file = hiberd.run_dir() + "/auth-token";
  auto wrong = run_program({hiberctl_path(), "--run_dir=" + hiberd.run_dir(),
                            "--control_token_file=" + auth_file, "ping"});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("wrong control token"), std::string::npos) << wrong.output;
}

TEST(ControlDos, HiberdRefusesAControlTokenThatIsTheAuthToken) {
  char tmpl[] = "/tmp/hiber-dos-same-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string same = dir + "/token";
  { std::ofstream(same) << "one-token-for-both\n"; }
  ASSERT_EQ(::chmod(same.c_str(), 0600), 0);
  auto run = run_program({hiberd_path(), "--device=sim", "--run_dir=" + dir + "/run",
                          "--auth_token_file=" + same, "--control_token_file=" + same},
                         60s);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("must differ from the functions' auth token"), std::string::npos)
      << run.output;
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace hiber::testing
