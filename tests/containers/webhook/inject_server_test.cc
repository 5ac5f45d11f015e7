// The real hiber-inject over TLS: a self-signed certificate made here with the openssl CLI, the
// fixtures' reviews posted with a Beast TLS client that verifies the certificate, /healthz, and
// clients that misbehave (plaintext, garbage, silent, oversized) without stopping the server.
// Also its startup errors, and a renewed certificate picked up without a restart.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
namespace fs = std::filesystem;
using asio::ip::tcp;
using nlohmann::json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string fixture(const std::string& name) {
  return read_file(fs::path(HIBER_SOURCE_DIR) / "tests/containers/webhook/fixtures" / name);
}

fs::path fresh_dir() {
  char pattern[] = "/tmp/hiber-inject-test-XXXXXX";
  const char* dir = ::mkdtemp(pattern);
  EXPECT_NE(dir, nullptr);
  return dir;
}

// A self-signed certificate for 127.0.0.1 (and the Service name), as an operator makes one.
void make_certificate(const fs::path& cert, const fs::path& key, const std::string& subject) {
  const std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=" +
      subject +
      " -addext subjectAltName=IP:127.0.0.1,DNS:hiber-inject.hiber-system.svc"
      " -keyout " +
      key.string() + " -out " + cert.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// hiber-inject as a child process, its log in a file.
class Inject {
 public:
  explicit Inject(const fs::path& dir, std::vector<std::string> flags) : log_(dir / "inject.log") {
    const fs::path port_file = dir / "port";
    fs::remove(port_file);
    std::vector<std::string> args = {HIBER_INJECT_PATH, "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // Up to 30 s (sanitizer builds start slowly) for the port file, or the process's end.
    for (int i = 0; i < 3000 && port_ == 0 && running(); ++i) {
      std::ifstream in(port_file);
      if (!(in >> port_)) port_ = 0;
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Inject() {
    if (pid_ > 0 && exit_status_ < 0) {
      ::kill(pid_, SIGTERM);
      wait();
    }
  }

  uint16_t port() const { return port_; }
  std::string log() const { return read_file(log_); }
  bool running() {
    if (exit_status_ >= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) exit_status_ = status;
    return exit_status_ < 0;
  }
  // The exit status (waitpid's), waiting up to 30 s.
  int wait() {
    for (int i = 0; i < 3000 && running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return exit_status_;
  }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  uint16_t port_ = 0;
};

struct Answer {
  unsigned status = 0;
  std::string body;
};

// One HTTPS request, the certificate verified against `ca` (host 127.0.0.1).
// A `declared_length` other than the body's says so in Content-Length (an oversized request
// whose body is never sent: the server answers from the header, and no unread bytes make its
// close a reset that would lose the answer).
Answer https(uint16_t port, const fs::path& ca, http::verb method, const std::string& target,
             const std::string& body = "", std::optional<uint64_t> declared_length = {}) {
  asio::io_context io;
  ssl::context context(ssl::context::tls_client);
  context.load_verify_file(ca.string());
  context.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(io, context);
  stream.set_verify_callback(ssl::host_name_verification("127.0.0.1"));
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(30));
  beast::get_lowest_layer(stream).connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  stream.handshake(ssl::stream_base::client);
  http::request<http::string_body> request(method, target, 11);
  request.set(http::field::host, "127.0.0.1");
  request.set(http::field::content_type, "application/json");
  request.body() = body;
  request.prepare_payload();
  if (declared_length) request.content_length(*declared_length);
  http::write(stream, request);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(stream, buffer, parser);
  return Answer{parser.get().result_int(), parser.get().body()};
}

// Raw bytes over plain TCP; returns what came back before the server closed (or 5 s passed).
std::string plain_exchange(uint16_t port, const std::string& bytes) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::seconds(5));
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  boost::system::error_code ec;
  // The server may close before reading it all: a failed write is no failure here.
  asio::write(stream, asio::buffer(bytes), ec);
  std::string reply;
  char chunk[4096];
  for (size_t n; (n = stream.read_some(asio::buffer(chunk), ec)) > 0 || !ec;)
    reply.append(chunk, n);
  return reply;
}

class InjectServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir();
    cert_ = dir_ / "tls.crt";
    key_ = dir_ / "tls.key";
    make_certificate(cert_, key_, "hiber-inject.hiber-system.svc");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> tls_flags() const {
    return {"--tls_cert_file=" + cert_.string(), "--tls_key_file=" + key_.string()};
  }

  fs::path dir_, cert_, key_;
};

TEST_F(InjectServerTest, AnswersReviewsOverTls) {
  Inject inject(dir_, tls_flags());
  ASSERT_NE(inject.port(), 0) << inject.log();

  const Answer health = https(inject.port(), cert_, http::verb::get, "/healthz");
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(health.body, "ok\n");

  const Answer injected =
      https(inject.port(), cert_, http::verb::post, "/mutate", fixture("review_pod_with_gpu.json"));
  ASSERT_EQ(injected.status, 200u) << injected.body;
  const json answer = json::parse(injected.body);
  EXPECT_EQ(answer["response"]["uid"], "7f3e1c2a-0b4d-4e5f-8a6b-9c0d1e2f3a03");
  EXPECT_EQ(answer["response"]["allowed"], true);
  EXPECT_EQ(answer["response"]["patchType"], "JSONPatch");
  EXPECT_FALSE(answer["response"]["patch"].get<std::string>().empty());

  const Answer plain = https(inject.port(), cert_, http::verb::post, "/mutate",
                             fixture("review_pod_without_label.json"));
  EXPECT_EQ(plain.status, 200u);
  EXPECT_EQ(json::parse(plain.body)["response"]["allowed"], true);
  EXPECT_FALSE(json::parse(plain.body)["response"].contains("patch"));

  const Answer denied = https(inject.port(), cert_, http::verb::post, "/mutate",
                              fixture("review_pod_without_function.json"));
  EXPECT_EQ(denied.status, 200u);
  EXPECT_EQ(json::parse(denied.body)["response"]["allowed"], false);

  const Answer malformed =
      https(inject.port(), cert_, http::verb::post, "/mutate", fixture("review_not_json.txt"));
  EXPECT_EQ(malformed.status, 400u);
  EXPECT_NE(malformed.body.find("not JSON"), std::string::npos);

  EXPECT_EQ(https(inject.port(), cert_, http::verb::get, "/mutate").status, 405u);
  EXPECT_EQ(https(inject.port(), cert_, http::verb::get, "/other").status, 404u);
  EXPECT_NE(inject.log().find("injected function resnet-50"), std::string::npos);
}

TEST_F(InjectServerTest, MisbehavingClientsDoNotStopIt) {
  Inject inject(dir_, {"--tls_cert_file=" + cert_.string(), "--tls_key_file=" + key_.string(),
                       "--max_body_mib=1", "--read_timeout_ms=1000"});
  ASSERT_NE(inject.port(), 0) << inject.log();
  // A silent client holds a connection while others are served.
  asio::io_context io;
  tcp::socket silent(io);
  silent.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), inject.port()));

  // Plain HTTP to the TLS port, then garbage: each connection is closed, with no HTTP answer.
  const std::string plain = plain_exchange(
      inject.port(), "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  EXPECT_EQ(plain.find("HTTP/1.1 200"), std::string::npos);
  plain_exchange(inject.port(), std::string(10000, '\x16'));
  plain_exchange(inject.port(), std::string("\x16\x03\x01\x00\x05hello", 10));
  EXPECT_NE(inject.log().find("TLS handshake with 127.0.0.1"), std::string::npos) << inject.log();

  // An oversized review: 413, and the server goes on.
  const Answer big = https(inject.port(), cert_, http::verb::post, "/mutate", "{}", 2 << 20);
  EXPECT_EQ(big.status, 413u);
  EXPECT_NE(big.body.find("exceeds hiber-inject's limit of 1048576 bytes"), std::string::npos);

  const Answer health = https(inject.port(), cert_, http::verb::get, "/healthz");
  EXPECT_EQ(health.status, 200u);
  const Answer review = https(inject.port(), cert_, http::verb::post, "/mutate",
                              fixture("review_pod_with_ld_preload.json"));
  EXPECT_EQ(review.status, 200u);
  EXPECT_TRUE(inject.running());

  // The silent client is cut off after --read_timeout_ms (else the test's time-out ends it).
  char byte;
  boost::system::error_code ec;
  silent.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_EQ(ec, asio::error::eof);
  EXPECT_TRUE(inject.running());
}

TEST_F(InjectServerTest, ConnectionsPastTheLimitAreClosed) {
  Inject inject(dir_, {"--tls_cert_file=" + cert_.string(), "--tls_key_file=" + key_.string(),
                       "--max_connections=1", "--read_timeout_ms=60000"});
  ASSERT_NE(inject.port(), 0) << inject.log();
  asio::io_context io;
  auto silent = std::make_unique<tcp::socket>(io);
  silent->connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), inject.port()));
  // Accepted in order: the silent connection holds the one place, so this one is closed.
  EXPECT_THROW(https(inject.port(), cert_, http::verb::get, "/healthz"),
               boost::system::system_error);
  silent.reset();
  // Once the server has seen the silent one go, it serves again.
  unsigned status = 0;
  for (int i = 0; i < 1000 && status == 0; ++i) {
    try {
      status = https(inject.port(), cert_, http::verb::get, "/healthz").status;
    } catch (const boost::system::system_error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_EQ(status, 200u);
  EXPECT_NE(inject.log().find("refusing a connection: 1 are open"), std::string::npos);
}

TEST_F(InjectServerTest, StartupErrorsAreClear) {
  const fs::path other_cert = dir_ / "other.crt";
  const fs::path other_key = dir_ / "other.key";
  make_certificate(other_cert, other_key, "other");
  const fs::path not_pem = dir_ / "not.pem";
  std::ofstream(not_pem) << "not a certificate\n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "--tls_cert_file is required"},
      {{"--tls_cert_file=" + (dir_ / "missing.crt").string(), "--tls_key_file=" + key_.string()},
       "cannot read it: No such file or directory"},
      {{"--tls_cert_file=" + not_pem.string(), "--tls_key_file=" + key_.string()},
       "not a PEM certificate"},
      {{"--tls_cert_file=" + cert_.string(), "--tls_key_file=" + not_pem.string()},
       "not a PEM private key"},
      {{"--tls_cert_file=" + cert_.string(), "--tls_key_file=" + other_key.string()},
       "is not the key of the certificate"},
      {{"--tls_cert_file=" + cert_.string(), "--tls_key_file=" + key_.string(),
        "--shim_mount_path=opt"},
       "--shim_mount_path \"opt\": expected an absolute path"},
  };
  for (const auto& [flags, message] : cases) {
    Inject inject(dir_, flags);
    const int status = inject.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << message << ": " << status;
    EXPECT_NE(inject.log().find(message), std::string::npos) << inject.log();
  }
}

TEST_F(InjectServerTest, RenewedCertificateIsServedWithoutARestart) {
  Inject inject(dir_, tls_flags());
  ASSERT_NE(inject.port(), 0) << inject.log();
  EXPECT_EQ(https(inject.port(), cert_, http::verb::get, "/healthz").status, 200u);

  // As a Secret's update does: new files renamed over the old ones.
  const fs::path new_cert = dir_ / "new.crt";
  const fs::path new_key = dir_ / "new.key";
  make_certificate(new_cert, new_key, "renewed");
  const fs::path old_cert = dir_ / "old.crt";
  const fs::path renewed = dir_ / "renewed.crt";
  fs::copy_file(cert_, old_cert);
  fs::copy_file(new_cert, renewed);
  fs::rename(new_key, key_);
  fs::rename(new_cert, cert_);
  // Trusting only the new certificate, the handshake succeeds only if it is the one served.
  EXPECT_EQ(https(inject.port(), cert_, http::verb::get, "/healthz").status, 200u);
  EXPECT_THROW(https(inject.port(), old_cert, http::verb::get, "/healthz"),
               boost::system::system_error);
  EXPECT_NE(inject.log().find("loaded the changed certificate"), std::string::npos);

  // A broken renewal keeps the last good pair.
  std::ofstream(dir_ / "broken") << "broken\n";
  fs::rename(dir_ / "broken", cert_);
  EXPECT_EQ(https(inject.port(), renewed, http::verb::get, "/healthz").status, 200u);
  EXPECT_NE(inject.log().find("does not load; keeping the previous pair"), std::string::npos)
      << inject.log();
  EXPECT_TRUE(inject.running());
}

}  // namespace
