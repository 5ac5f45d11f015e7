// A function process for integration tests: talks to hiberd through the real wire client.
//   --mode=verify   copies, memsets and (with --fatbin) kernel launches, every result checked
//                   against the same computation on the host; exit 0 only if all match
//   --mode=victim   holds memory, streams and events, then streams large batches forever (the
//                   test kills it at a random moment, usually in the middle of a message)
//   --mode=idle     connects and sleeps
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

#include "common/cli.h"
#include "wire/call_client.h"

DEFINE_string(mode, "verify", "verify, victim or idle");
DEFINE_string(socket, "", "hiberd's function socket");
DEFINE_string(token, "", "auth token");
DEFINE_string(function_id, "test-client", "function identity");
DEFINE_int32(iterations, 4, "verify: rounds of checked work");
DEFINE_uint64(bytes, 1 << 20, "verify: bytes per buffer");
DEFINE_string(fatbin, "", "verify: test kernels' fatbin; also launch kernels");
DEFINE_int32(seconds, 10, "idle: how long to stay connected");
DEFINE_uint32(seed, 1, "random seed for the data");

namespace hiber {
namespace {

namespace proto = wire::proto;

#define CHECK_OK(expr)                                                              \
  do {                                                                              \
    ::hiber::Status s_ = (expr);                                                    \
    if (!s_.ok()) {                                                                 \
      std::fprintf(stderr, "test-client: %s: %s\n", #expr, s_.to_string().c_str()); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

template <typename T>
T value_or_exit(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "test-client: %s: %s\n", what, r.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

// Host -> device through staging, in arena-sized pieces.
void upload(wire::CallClient& c, uint64_t dst, const void* src, uint64_t bytes) {
  const uint64_t chunk = c.channel().arena().size() / 4;
  for (uint64_t done = 0; done < bytes; done += chunk) {
    const uint64_t n = std::min(chunk, bytes - done);
    auto staged = value_or_exit(c.stage(n), "stage");
    std::memcpy(staged.bytes.data(), static_cast<const char*>(src) + done, n);
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
      auto m = call.initMemcpyHtoD();
      m.setDst(dst + done);
      m.setSrcOffset(staged.offset);
      m.setBytes(n);
      m.setStagingEnd(staged.staging_end);
    }));
  }
}

// Device -> host, waiting for each piece.
void download(wire::CallClient& c, void* dst, uint64_t src, uint64_t bytes) {
  const uint64_t chunk = c.channel().arena().size() / 4;
  for (uint64_t done = 0; done < bytes; done += chunk) {
    const uint64_t n = std::min(chunk, bytes - done);
    auto staged = value_or_exit(c.stage(n), "stage");
    value_or_exit(c.call([&](proto::Call::Builder call) {
      auto m = call.initMemcpyDtoH();
      m.setDstOffset(staged.offset);
      m.setSrc(src + done);
      m.setBytes(n);
      m.setStagingEnd(staged.staging_end);
    }),
                  "memcpyDtoH");
    std::memcpy(static_cast<char*>(dst) + done, staged.bytes.data(), n);
  }
}

void allocate(wire::CallClient& c, uint64_t va, uint64_t bytes) {
  CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
    auto a = call.initMemAllocate();
    a.setVa(va);
    a.setBytes(bytes);
  }));
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  return std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()),
                                reinterpret_cast<const std::byte*>(s.data()) + s.size());
}

// Loads the test fatbin and runs vec_add(a, b, c, n) on the device; returns c.
void check_vec_add(wire::CallClient& c, uint64_t a, uint64_t b, uint64_t out, uint32_t n,
                   const std::vector<float>& ha, const std::vector<float>& hb) {
  auto image = read_file(FLAGS_fatbin);
  if (image.empty()) {
    std::fprintf(stderr, "test-client: cannot read %s\n", FLAGS_fatbin.c_str());
    std::exit(1);
  }
  auto staged = value_or_exit(c.stage(image.size()), "stage fatbin");
  std::memcpy(staged.bytes.data(), image.data(), image.size());
  CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
    auto m = call.initModuleLoad();
    m.setModule(1);
    m.setImageOffset(staged.offset);
    m.setImageBytes(image.size());
    m.setStagingEnd(staged.staging_end);
  }));
  auto info = value_or_exit(c.call([&](proto::Call::Builder call) {
    auto f = call.initFunctionGet();
    f.setFunction(7);
    f.setModule(1);
    f.setName(HIBER_VEC_ADD_KERNEL);
  }),
                            "functionGet");
  const KernelInfo* kernel = std::get_if<KernelInfo>(&info);
  if (kernel == nullptr || kernel->params.size() != 4) {
    std::fprintf(stderr, "test-client: unexpected layout for vec_add\n");
    std::exit(1);
  }
  std::vector<std::byte> params(kernel->param_bytes());
  std::memcpy(params.data() + kernel->params[0].offset, &a, 8);
  std::memcpy(params.data() + kernel->params[1].offset, &b, 8);
  std::memcpy(params.data() + kernel->params[2].offset, &out, 8);
  std::memcpy(params.data() + kernel->params[3].offset, &n, 4);
  CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
    auto l = call.initLaunchKernel();
    l.setFunction(7);
    l.setGridX((n + 255) / 256);
    l.setGridY(1);
    l.setGridZ(1);
    l.setBlockX(256);
    l.setBlockY(1);
    l.setBlockZ(1);
    l.setParams(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(params.data()), params.size()));
  }));
  std::vector<float> result(n);
  download(c, result.data(), out, n * sizeof(float));
  for (uint32_t i = 0; i < n; ++i) {
    if (result[i] != ha[i] + hb[i]) {
      std::fprintf(stderr, "test-client: vec_add[%u] = %g, host says %g\n", i, result[i],
                   ha[i] + hb[i]);
      std::exit(1);
    }
  }
}

int verify(wire::CallClient& c) {
  const wire::Grant& grant = c.session().grant;
  const uint64_t bytes = FLAGS_bytes;
  const uint64_t span = round_up(bytes, grant.allocation_granularity);
  const uint64_t a = grant.va_base, b = a + span, out = b + span;
  allocate(c, a, bytes);
  allocate(c, b, bytes);
  allocate(c, out, bytes);
  std::mt19937 rng(FLAGS_seed);
  std::vector<uint8_t> host_a(bytes), host_b(bytes), back(bytes);
  for (int round = 0; round < FLAGS_iterations; ++round) {
    for (auto& x : host_a) x = static_cast<uint8_t>(rng());
    upload(c, a, host_a.data(), bytes);
    // b = a, then a memset over its second quarter, written 4 bytes at a time.
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
      auto m = call.initMemcpyDtoD();
      m.setDst(b);
      m.setSrc(a);
      m.setBytes(bytes);
    }));
    const uint32_t pattern = 0x01020304u + round;
    const uint64_t words = bytes / 16;
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
      auto m = call.initMemset();
      m.setDst(b + bytes / 4 / 4 * 4);
      m.setValue(pattern);
      m.setElementBytes(4);
      m.setCount(words);
    }));
    host_b = host_a;
    for (uint64_t w = 0; w < words; ++w) {
      std::memcpy(host_b.data() + bytes / 4 / 4 * 4 + w * 4, &pattern, 4);
    }
    download(c, back.data(), b, bytes);
    if (back != host_b) {
      std::fprintf(stderr, "test-client: round %d: device bytes differ from the host's\n", round);
      return 1;
    }
  }
  if (!FLAGS_fatbin.empty()) {
    const uint32_t n = static_cast<uint32_t>(bytes / sizeof(float));
    std::vector<float> fa(n), fb(n);
    for (uint32_t i = 0; i < n; ++i) {
      fa[i] = static_cast<float>(rng() % 1000) / 8;
      fb[i] = static_cast<float>(rng() % 1000) / 4;
    }
    upload(c, a, fa.data(), n * sizeof(float));
    upload(c, b, fb.data(), n * sizeof(float));
    check_vec_add(c, a, b, out, n, fa, fb);
  }
  for (uint64_t va : {a, b, out}) {
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) { call.initMemFree().setVa(va); }));
  }
  CHECK_OK(c.ping());
  CHECK_OK(c.take_error());
  std::printf("test-client: verified %d rounds of %" PRIu64 " bytes%s\n", FLAGS_iterations, bytes,
              FLAGS_fatbin.empty() ? "" : " and vec_add");
  return 0;
}

int victim(wire::CallClient& c) {
  const wire::Grant& grant = c.session().grant;
  allocate(c, grant.va_base, 64 << 20);
  for (uint64_t h = 1; h <= 4; ++h) {
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) { call.initStreamCreate().setStream(h); }));
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) { call.initEventCreate().setEvent(h); }));
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) {
      auto r = call.initEventRecord();
      r.setEvent(h);
      r.setStream(h);
    }));
  }
  CHECK_OK(c.ping());
  CHECK_OK(c.take_error());
  std::printf("READY\n");
  std::fflush(stdout);
  for (uint64_t i = 0;; ++i) {
    // Pings without reply: the server does real decoding work and sends nothing back.
    CHECK_OK(c.enqueue([&](proto::Call::Builder call) { call.initPing().setValue(i); }));
  }
}

int idle(wire::CallClient& c) {
  CHECK_OK(c.ping());
  std::printf("READY\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(FLAGS_seconds));
  CHECK_OK(c.ping());
  return 0;
}

int run() {
  wire::ClientOptions options;
  options.socket_path = FLAGS_socket;
  options.function_id = FLAGS_function_id;
  options.auth_token = FLAGS_token;
  wire::CallClientOptions call_options;
  call_options.max_batch_calls = FLAGS_mode == "victim" ? 4096 : 256;
  auto client = value_or_exit(wire::CallClient::connect(options, call_options), "connect");
  if (FLAGS_mode == "verify") return verify(*client);
  if (FLAGS_mode == "victim") return victim(*client);
  if (FLAGS_mode == "idle") return idle(*client);
  std::fprintf(stderr, "test-client: unknown mode %s\n", FLAGS_mode.c_str());
  return 2;
}

}  // namespace
}  // namespace hiber

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv, "A function process for Hiber's integration tests.", __FILE__);
  return hiber::run();
}
