// hiberd's TCP control listener (--control_tcp_listen, --control_token_file): three hiberd
// processes on this machine, each reached over TCP with its own control token, as a router
// fronting several nodes reaches them; requests without the right token are refused without
// disturbing anyone else.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/hiberd_harness.h"
#include "wire/control_client.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;

std::string hiberctl_path() { return HIBERCTL_PATH; }

// A folder for a node's token and port files, outside its run directory (which the harness
// creates when it starts hiberd).
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/hiber-tcp-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// The port hiberd wrote to `port_file` (whole, by a rename, just after it started listening);
// 0 if it wrote none within 30 s.
int wait_for_port(const std::string& port_file) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (read_file(port_file).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  return std::atoi(read_file(port_file).c_str());
}

// A hiberd with the TCP control listener on a free port of 127.0.0.1.
struct TcpNode {
  explicit TcpNode(const std::string& token_text) : token(token_text) {
    token_file = files.path() + "/control-token";
    port_file = files.path() + "/port";
    write_file(token_file, token + "\n", 0600);
    hiberd = std::make_unique<Hiberd>(std::vector<std::string>{
        "--control_tcp_listen=127.0.0.1:0", "--control_tcp_port_file=" + port_file,
        "--control_token_file=" + token_file});
    port = wait_for_port(port_file);
    EXPECT_GT(port, 0) << hiberd->log();
  }

  std::string address() const { return "tcp:127.0.0.1:" + std::to_string(port); }

  Result<wire::ControlClient> client(const std::string& with_token) const {
    return wire::ControlClient::connect(address(), with_token, 30s);
  }

  TempDir files;
  std::string token;
  std::string token_file;
  std::string port_file;
  int port = 0;
  std::unique_ptr<Hiberd> hiberd;
};

wire::FunctionRegistration registration(const std::string& function_id) {
  wire::FunctionRegistration r;
  r.function_id = function_id;
  r.slo_ms = 5000;
  return r;
}

// The functions a status reply lists as registered.
std::vector<std::string> registered_functions(wire::ControlClient& client) {
  std::vector<std::string> names;
  auto reply = client.status();
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return names;
  Status read = wire::read_message<proto::ControlReply>(
      *reply, "status", [&](proto::ControlReply::Reader r) -> Status {
        if (!r.isStatus()) return Status(ErrorCode::kInvalidValue, "not a status reply");
        for (auto f : r.getStatus().getFunctions()) {
          if (f.getRegistered()) names.push_back(f.getFunctionId());
        }
        return Status();
      });
  EXPECT_TRUE(read.ok()) << read;
  return names;
}

// One request of `function_id` through the control protocol: arrive, start, done. The function
// must have a process connected (its session) for hiberd to run its requests.
void run_request(wire::ControlClient& client, const Hiberd& hiberd,
                 const std::string& function_id) {
  auto id = client.request_arrived(function_id);
  ASSERT_TRUE(id.ok()) << id.status() << "\n" << hiberd.log();
  auto started = client.request_start(*id);
  ASSERT_TRUE(started.ok()) << started.status() << "\n" << hiberd.log();
  EXPECT_GE(started->gpu, 0);
  EXPECT_FALSE(started->source.empty());
  const Status done = client.request_done(*id);
  ASSERT_TRUE(done.ok()) << done << "\n" << hiberd.log();
}

TEST(HiberdTcpControl, ThreeNodesEachServeTheirOwnClientsOverTcp) {
  std::vector<std::unique_ptr<TcpNode>> nodes;
  for (int n = 0; n < 3; ++n) {
    nodes.push_back(std::make_unique<TcpNode>("token-of-node-" + std::to_string(n)));
  }
  for (int n = 0; n < 3; ++n) {
    ASSERT_GT(nodes[n]->port, 0);
    for (int m = 0; m < n; ++m) EXPECT_NE(nodes[n]->port, nodes[m]->port);
  }
  for (int n = 0; n < 3; ++n) {
    TcpNode& node = *nodes[n];
    SCOPED_TRACE("node " + std::to_string(n));
    auto client = node.client(node.token);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE(client->ping().ok());
    const std::string function_id = "fn-on-node-" + std::to_string(n);
    const Status registered = client->register_function(registration(function_id));
    ASSERT_TRUE(registered.ok()) << registered << "\n" << node.hiberd->log();
    auto session = node.hiberd->connect(function_id);
    ASSERT_TRUE(session.ok()) << session.status() << "\n" << node.hiberd->log();
    for (int i = 0; i < 3; ++i) run_request(*client, *node.hiberd, function_id);
  }
  // Each registration reached its own node, and only it.
  for (int n = 0; n < 3; ++n) {
    auto client = nodes[n]->client(nodes[n]->token);
    ASSERT_TRUE(client.ok());
    EXPECT_EQ(registered_functions(*client),
              std::vector<std::string>{"fn-on-node-" + std::to_string(n)});
  }
  // A node's token opens no other node.
  auto crossed = nodes[1]->client(nodes[0]->token);
  ASSERT_TRUE(crossed.ok());
  EXPECT_EQ(crossed->ping().code(), ErrorCode::kNotPermitted);
  // Each shuts down cleanly with TCP clients still connected.
  for (auto& node : nodes) {
    const int exit_code = node->hiberd->stop();
    EXPECT_EQ(exit_code, 0) << node->hiberd->log();
  }
}

// requestBegin (1.13): a request arrives and gets its GPU in one round trip, and the answer
// names it for requestDone. One refused leaves nothing behind: the function's only instance
// serves the requests after it (each instance runs one request at a time).
TEST(HiberdTcpControl, RequestBeginStartsARequestInOneRoundTrip) {
  TcpNode node("begin-token");
  ASSERT_GT(node.port, 0);
  auto client = node.client(node.token);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(client->register_function(registration("fn")).ok());
  auto session = node.hiberd->connect("fn");
  ASSERT_TRUE(session.ok()) << session.status();
  std::set<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    auto started = client->request_begin("fn");
    ASSERT_TRUE(started.ok()) << started.status() << "\n" << node.hiberd->log();
    EXPECT_NE(started->request_id, 0u);
    EXPECT_GE(started->gpu, 0);
    EXPECT_FALSE(started->source.empty());
    ids.insert(started->request_id);
    ASSERT_TRUE(client->request_done(started->request_id).ok());
  }
  EXPECT_EQ(ids.size(), 3u) << "each request has an id of its own";

  const auto unknown = client->request_begin("nobody");
  EXPECT_EQ(unknown.status().code(), ErrorCode::kNotFound) << unknown.status();
  EXPECT_NE(unknown.status().message().find("is not registered"), std::string::npos);
  const auto absent = client->request_begin("fn", "no-such-instance");
  EXPECT_EQ(absent.status().code(), ErrorCode::kDeviceUnavailable) << absent.status();
  EXPECT_NE(absent.status().message().find("has no connected instance"), std::string::npos);
  const auto bad_id = client->request_begin("two\nlines");
  EXPECT_EQ(bad_id.status().code(), ErrorCode::kInvalidValue) << bad_id.status();
  for (int i = 0; i < 2; ++i) run_request(*client, *node.hiberd, "fn");
  auto again = client->request_begin("fn");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(client->request_done(again->request_id).ok());
}

TEST(HiberdTcpControl, WrongAndMissingTokensAreRefusedWithoutDisturbingAGoodClient) {
  TcpNode node("the-right-token");
  ASSERT_GT(node.port, 0);
  auto good = node.client(node.token);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE(good->ping().ok());
  ASSERT_TRUE(good->register_function(registration("fn")).ok());
  auto session = node.hiberd->connect("fn");
  ASSERT_TRUE(session.ok()) << session.status();
  auto before = node.hiberd->status();
  ASSERT_TRUE(before.ok());

  // The same length as the right token, one letter off; and one that is a prefix of it.
  for (const std::string wrong : {"the-right-tokem", "the-right"}) {
    auto bad = node.client(wrong);
    ASSERT_TRUE(bad.ok()) << bad.status();
    const Status refused = bad->request_arrived("fn").status();
    EXPECT_EQ(refused.code(), ErrorCode::kNotPermitted) << refused;
    EXPECT_NE(refused.message().find("wrong control token"), std::string::npos) << refused;
    EXPECT_FALSE(bad->ping().ok());
    auto bad_begin = node.client(wrong);
    ASSERT_TRUE(bad_begin.ok()) << bad_begin.status();
    const Status refused_begin = bad_begin->request_begin("fn").status();
    EXPECT_EQ(refused_begin.code(), ErrorCode::kNotPermitted) << refused_begin;
    EXPECT_NE(refused_begin.message().find("wrong control token"), std::string::npos)
        << refused_begin;
    EXPECT_NE(refused.message().find("wrong control token"), std::string::npos) << refused;
    // ...and disconnected.
    EXPECT_FALSE(bad->ping().ok());
  }
  auto missing = node.client("");
  ASSERT_TRUE(missing.ok()) << missing.status();
  const Status refused = missing->register_function(registration("intruder"));
  EXPECT_EQ(refused.code(), ErrorCode::kNotPermitted) << refused;
  EXPECT_NE(refused.message().find("must carry the node's control token"), std::string::npos)
      << refused;

  // Counted, and nothing the refused requests asked for happened.
  auto after = node.hiberd->status();
  ASSERT_TRUE(after.ok());
  // Two wrong tokens, each for requestArrived and requestBegin, and a missing one.
  EXPECT_EQ(after->handshakes_rejected, before->handshakes_rejected + 5);
  EXPECT_EQ(registered_functions(*good), std::vector<std::string>{"fn"});
  EXPECT_NE(node.hiberd->log().find("TCP control connection from 127.0.0.1:"), std::string::npos);

  // The good client's connection, opened before them all, still works.
  for (int i = 0; i < 3; ++i) run_request(*good, *node.hiberd, "fn");

  // The Unix control socket admits by uid and asks for the same token (protocol 1.5).
  auto local = wire::ControlClient::connect(node.hiberd->control_socket_path(), node.token, 30s);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(local->ping().ok());
  auto local_with_junk = wire::ControlClient::connect("unix:" + node.hiberd->control_socket_path(),
                                                      "not-the-token", 30s);
  ASSERT_TRUE(local_with_junk.ok()) << local_with_junk.status();
  const Status junk = local_with_junk->ping();
  EXPECT_EQ(junk.code(), ErrorCode::kNotPermitted) << junk;
  EXPECT_NE(junk.message().find("wrong control token"), std::string::npos) << junk;
  const int exit_code = node.hiberd->stop();
  EXPECT_EQ(exit_code, 0) << node.hiberd->log();
}

TEST(HiberdTcpControl, ARawRequestWithoutATokenGetsAnErrorReply) {
  // A client that knows nothing of tokens (an older hiberctl, a port scanner speaking the
  // protocol): the reply is the control protocol's error, not a silent close.
  TcpNode node("raw-token");
  ASSERT_GT(node.port, 0);
  auto socket = wire::connect_tcp("127.0.0.1", static_cast<uint16_t>(node.port));
  ASSERT_TRUE(socket.ok()) << socket.status();
  capnp::MallocMessageBuilder request;
  auto root = request.initRoot<proto::ControlRequest>();
  root.initVersion().setMajor(1);
  root.setPing();
  auto frame = wire::encode_frame(request);
  ASSERT_TRUE(frame.ok());
  wire::Message reply;
  ASSERT_TRUE(wire::exchange_frame(socket->get(), *frame, reply, nullptr, 30s).ok());
  Status read = wire::read_message<proto::ControlReply>(
      reply, "reply", [](proto::ControlReply::Reader r) -> Status {
        EXPECT_TRUE(r.isError());
        if (r.isError()) {
          EXPECT_EQ(static_cast<ErrorCode>(r.getError().getCode()), ErrorCode::kNotPermitted);
        }
        return Status();
      });
  EXPECT_TRUE(read.ok()) << read;
}

TEST(HiberdTcpControl, AConnectionThatNeverSendsATokenIsDroppedButAnIdleGoodOneIsNot) {
  TempDir files;
  const std::string token_file = files.path() + "/token";
  const std::string port_file = files.path() + "/port";
  write_file(token_file, "idle-token\n", 0600);
  Hiberd hiberd({"--control_tcp_listen=127.0.0.1:0", "--control_tcp_port_file=" + port_file,
                 "--control_token_file=" + token_file, "--handshake_timeout_ms=100"});
  const auto port = static_cast<uint16_t>(wait_for_port(port_file));
  ASSERT_GT(port, 0) << hiberd.log();
  auto good = wire::ControlClient::connect("tcp:127.0.0.1:" + std::to_string(port), "idle-token");
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE(good->ping().ok());
  // Says nothing: hiberd answers with a time-out and hangs up (the read waits for that answer).
  auto silent = wire::connect_tcp("127.0.0.1", port);
  ASSERT_TRUE(silent.ok()) << silent.status();
  wire::Message reply;
  ASSERT_TRUE(wire::receive_frame(silent->get(), reply, nullptr, 60s).ok());
  Status read = wire::read_message<proto::ControlReply>(
      reply, "reply", [](proto::ControlReply::Reader r) -> Status {
        EXPECT_TRUE(r.isError());
        if (r.isError()) {
          EXPECT_EQ(static_cast<ErrorCode>(r.getError().getCode()), ErrorCode::kTimeout);
        }
        return Status();
      });
  EXPECT_TRUE(read.ok()) << read;
  // The good client, idle as long, proved itself already and keeps its connection.
  EXPECT_TRUE(good->ping().ok());
}

TEST(HiberdTcpControl, HiberctlReachesANodeOverTcp) {
  TcpNode node("hiberctl-token");
  ASSERT_GT(node.port, 0);
  auto ping = run_program({hiberctl_path(), "--control=" + node.address(),
                           "--control_token_file=" + node.token_file, "ping"});
  EXPECT_EQ(ping.exit_code, 0) << ping.output;
  auto status = run_program({hiberctl_path(), "--control=" + node.address(),
                             "--control_token_file=" + node.token_file, "status"});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("sim device"), std::string::npos) << status.output;
  auto no_token = run_program({hiberctl_path(), "--control=" + node.address(), "ping"});
  EXPECT_NE(no_token.exit_code, 0);
  EXPECT_NE(no_token.output.find("--control_token_file"), std::string::npos) << no_token.output;
}

// Where no hiberd runs, hiberctl says where it looked, not that a token file is missing.
TEST(HiberdTcpControl, HiberctlWithoutAHiberdSaysWhereItLooked) {
  char dir[] = "/tmp/hiber-no-hiberd-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string run_dir = dir;
  for (const char* command : {"status", "ping"}) {
    auto r = run_program({hiberctl_path(), "--run_dir=" + run_dir, command});
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("hiberd is not running at " + run_dir + "/control.sock"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("token"), std::string::npos) << r.output;
  }
  ::rmdir(dir);
}

TEST(HiberdTcpControl, RefusesToStartWithoutAUsableTokenFile) {
  TempDir files;
  auto without = run_program({hiberd_path(), "--device=sim", "--run_dir=" + files.path() + "/run",
                              "--control_tcp_listen=127.0.0.1:0"},
                             60s);
  EXPECT_EQ(without.exit_code, 1) << without.output;
  EXPECT_NE(without.output.find("--control_tcp_listen needs --control_token_file"),
            std::string::npos)
      << without.output;

  // A token file others may read protects nothing.
  const std::string readable = files.path() + "/readable-token";
  write_file(readable, "secret\n", 0644);
  auto exposed =
      run_program({hiberd_path(), "--device=sim", "--run_dir=" + files.path() + "/run",
                   "--control_tcp_listen=127.0.0.1:0", "--control_token_file=" + readable},
                  60s);
  EXPECT_EQ(exposed.exit_code, 1) << exposed.output;
  EXPECT_NE(exposed.output.find("others may read"), std::string::npos) << exposed.output;

  const std::string empty = files.path() + "/empty-token";
  write_file(empty, "\n", 0600);
  auto blank = run_program({hiberd_path(), "--device=sim", "--run_dir=" + files.path() + "/run",
                            "--control_tcp_listen=127.0.0.1:0", "--control_token_file=" + empty},
                           60s);
  EXPECT_EQ(blank.exit_code, 1) << blank.output;
  EXPECT_NE(blank.output.find("is empty"), std::string::npos) << blank.output;
}

}  // namespace
}  // namespace hiber::testing
