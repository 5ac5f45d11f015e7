// The channel's costs, each against a baseline measured in the same run (docs/perf.md):
//   round trip       a one-call batch with reply = true and its completion, vs a blocking
//                    8-byte ping-pong over a socketpair
//   async calls      batches of fire-and-forget calls into a server that only walks them
//   bulk copy        user data staged through the arena and copied out by the server, vs memcpy
// The server side runs in a forked child that does the real handshake, like hiberd.
#include <benchmark/benchmark.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "wire/batch_builder.h"
#include "wire/client_channel.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/schema/calls.capnp.h"
#include "wire/server_channel.h"
#include "wire/socket_frame.h"

namespace hiber::wire {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr ChannelConfig kChannelConfig{.request_ring_bytes = 1 << 20,
                                       .completion_ring_bytes = 256 << 10,
                                       .arena_bytes = 64 << 20,
                                       .max_message_bytes = 16 << 20};
constexpr uint64_t kMaxCopyBytes = 256 << 20;  // the largest bulk copy measured

[[noreturn]] void die(const Status& status, const char* what) {
  fprintf(stderr, "wire_bench: %s: %s\n", what, status.to_string().c_str());
  _exit(1);
}

// --- The server process -----------------------------------------------------------------

bool hung_up(int socket) {
  pollfd p{.fd = socket, .events = POLLRDHUP, .revents = 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// hiberd's session loop, executing nothing: walks every call, copies memcpyHtoD payloads out
// of the arena, releases staging, and answers calls with reply = true. A ping's completion
// carries the number of calls seen so far, so the client can check that none was skipped.
[[noreturn]] void serve(int listener) {
  UniqueFd socket(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  Message message;
  if (Status s = receive_frame(socket.get(), message, nullptr, 5000ms); !s.ok()) die(s, "hello");
  if (auto hello = decode_hello(message); !hello.ok()) die(hello.status(), "decode hello");
  auto created = ServerChannel::create(kChannelConfig);
  if (!created.ok()) die(created.status(), "create channel");
  ServerChannel& channel = **created;
  SessionInfo session;
  session.session_id = 1;
  session.server_version = current_protocol_version();
  session.grant.allocation_granularity = 2 << 20;
  session.layout = channel.layout();
  session.node = default_node_config();
  auto welcome = encode_welcome_frame(session);
  if (!welcome.ok()) die(welcome.status(), "encode welcome");
  if (Status s = send_frame(socket.get(), *welcome, channel.memfd()); !s.ok()) die(s, "welcome");

  std::vector<std::byte> device(kMaxCopyBytes);  // the "GPU": copies land here
  std::memset(device.data(), 1, device.size());  // fault it in before anything is timed
  const std::span<std::byte> arena = channel.arena();
  uint64_t calls_seen = 0;
  std::vector<uint64_t> replies;
  for (;;) {
    const Status status = channel.receive(message, 50ms);
    if (status.code() == ErrorCode::kTimeout) {
      if (hung_up(socket.get())) _exit(0);
      continue;
    }
    if (!status.ok()) die(status, "receive");
    replies.clear();
    uint64_t released = 0;
    const Status read =
        read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) {
          const auto calls = batch.getCalls();
          for (uint32_t i = 0; i < calls.size(); ++i) {
            const auto call = calls[i];
            ++calls_seen;
            switch (call.which()) {
              case proto::Call::MEMCPY_HTO_D: {
                const auto copy = call.getMemcpyHtoD();
                const uint64_t src = copy.getSrcOffset(), bytes = copy.getBytes(),
                               dst = copy.getDst();
                if (!arena_range_ok(src, bytes, arena.size()) ||
                    !arena_range_ok(dst, bytes, device.size())) {
                  return Status(ErrorCode::kInvalidValue, "copy out of range");
                }
                std::memcpy(device.data() + dst, arena.data() + src, bytes);
                released = std::max(released, copy.getStagingEnd());
                break;
              }
              default: benchmark::DoNotOptimize(call.which()); break;
            }
            if (call.getReply()) replies.push_back(batch.getFirstSeq() + i);
          }
          return Status();
        });
    if (!read.ok()) die(read, "batch");
    if (released != 0) channel.release_staging(released);
    if (replies.empty()) continue;
    capnp::MallocMessageBuilder reply(64);
    auto completions = reply.initRoot<proto::ServerMessage>().initCompletions(replies.size());
    for (size_t i = 0; i < replies.size(); ++i) {
      completions[i].setSeq(replies[i]);
      completions[i].initResult().setPing(calls_seen);
    }
    if (Status s = channel.send(reply); !s.ok()) die(s, "send");
  }
}

// The baseline's peer: echoes 8-byte messages until the socket closes.
[[noreturn]] void echo(int socket) {
  uint64_t value;
  while (::read(socket, &value, sizeof(value)) == sizeof(value)) {
    if (::write(socket, &value, sizeof(value)) != sizeof(value)) break;
  }
  _exit(0);
}

// --- The client side (this process) -------------------------------------------------------

struct Fixture {
  std::unique_ptr<ClientChannel> client;
  pid_t server = -1;
  UniqueFd echo_socket;
  pid_t echo = -1;
  uint64_t seq = 1;
  uint64_t staging = 0;  // the client's staging position (bytes ever staged)
  std::vector<std::byte> user_data;
};
Fixture* fixture = nullptr;

void start(Fixture& f) {
  // Children are forked before any thread exists in this process.
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) _exit(1);
  f.echo = ::fork();
  if (f.echo == 0) {
    ::close(pair[0]);
    echo(pair[1]);
  }
  ::close(pair[1]);
  f.echo_socket.reset(pair[0]);

  const std::string path = "/tmp/hiber-wire-bench-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener.get(), 1) != 0) {
    perror("wire_bench: listen");
    _exit(1);
  }
  f.server = ::fork();
  if (f.server == 0) serve(listener.get());
  auto client = ClientChannel::connect(ClientOptions{.socket_path = path, .function_id = "bench"});
  ::unlink(path.c_str());
  if (!client.ok()) die(client.status(), "connect");
  f.client = std::move(client).value();
  f.user_data.resize(kMaxCopyBytes);
  for (size_t i = 0; i < f.user_data.size(); ++i) f.user_data[i] = static_cast<std::byte>(i * 131);
}

void stop(Fixture& f) {
  f.client.reset();  // the server sees its socket close and exits
  f.echo_socket.reset();
  ::waitpid(f.server, nullptr, 0);
  ::waitpid(f.echo, nullptr, 0);
}

// One ping with reply = true; returns the server's count of calls seen.
uint64_t sync_ping(BatchBuilder& builder) {
  Fixture& f = *fixture;
  builder.reset(f.seq++);
  auto call = builder.add_call();
  call.setReply(true);
  call.initPing().setValue(f.seq);
  if (Status s = f.client->send_pieces(builder.finish()); !s.ok()) die(s, "send");
  Message message;
  if (Status s = f.client->receive(message, 10s); !s.ok()) die(s, "receive");
  uint64_t seen = 0;
  const Status read = read_message<proto::ServerMessage>(
      message, "completion", [&](proto::ServerMessage::Reader m) {
        const auto completions = m.getCompletions();
        if (completions.size() != 1 || completions[0].getSeq() != f.seq - 1) {
          return Status(ErrorCode::kInvalidValue, "unexpected completion");
        }
        seen = completions[0].getResult().getPing();
        return Status();
      });
  if (!read.ok()) die(read, "completion");
  return seen;
}

// Round trips, each timed alone. Arg: microseconds of idleness before each one. Back to back
// (0) both sides find each other spinning; after a pause both have gone to sleep, which is what
// a synchronisation after GPU work looks like.
template <typename RoundTrip>
void time_round_trips(benchmark::State& state, RoundTrip&& round_trip) {
  const auto idle = std::chrono::microseconds(state.range(0));
  std::vector<int64_t> ns;
  ns.reserve(std::min<uint64_t>(state.max_iterations, 20'000'000));
  for (auto _ : state) {
    if (idle.count() > 0) std::this_thread::sleep_for(idle);
    const auto start = Clock::now();
    if (!round_trip()) {
      state.SkipWithError("round trip failed");
      break;
    }
    const auto took = Clock::now() - start;
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
    state.SetIterationTime(std::chrono::duration<double>(took).count());
  }
  if (ns.empty()) return;
  std::sort(ns.begin(), ns.end());
  state.counters["p50_ns"] = static_cast<double>(ns[ns.size() / 2]);
  state.counters["p99_ns"] = static_cast<double>(ns[ns.size() * 99 / 100]);
}

void BM_ChannelRoundTrip(benchmark::State& state) {
  // As large as the shim's: a synchronising call usually goes in a nearly empty batch.
  BatchBuilder builder(kMaxCallsPerBatch);
  time_round_trips(state, [&] {
    benchmark::DoNotOptimize(sync_ping(builder));
    return true;
  });
}

void BM_SocketRoundTrip(benchmark::State& state) {
  const int socket = fixture->echo_socket.get();
  uint64_t value = 0;
  time_round_trips(state, [&] {
    ++value;
    return ::write(socket, &value, sizeof(value)) == sizeof(value) &&
           ::read(socket, &value, sizeof(value)) == sizeof(value);
  });
}

// Fire-and-forget kernel launches, encoding included; one sync ping at the end drains the
// pipeline and checks that the server walked every call. Args: calls per batch, bytes of kernel
// parameters per launch (0: none; otherwise they go to the batch's second segment).
void BM_AsyncCalls(benchmark::State& state) {
  const auto calls_per_batch = static_cast<uint32_t>(state.range(0));
  const std::vector<capnp::byte> params(static_cast<size_t>(state.range(1)), 7);
  BatchBuilder builder(calls_per_batch);
  BatchBuilder ping(1);
  const uint64_t seen_before = sync_ping(ping);
  uint64_t calls = 0;
  for (auto _ : state) {
    builder.reset(fixture->seq);
    for (uint32_t i = 0; i < calls_per_batch; ++i) {
      auto launch = builder.add_call().initLaunchKernel();
      launch.setFunction(i + 1);
      launch.setGridX(128);
      launch.setBlockX(256);
      launch.setStream(1);
      if (!params.empty()) launch.setParams(capnp::Data::Reader(params.data(), params.size()));
    }
    fixture->seq += calls_per_batch;
    calls += calls_per_batch;
    if (Status s = fixture->client->send_pieces(builder.finish()); !s.ok()) die(s, "send");
  }
  const uint64_t seen = sync_ping(ping) - seen_before - 1;
  if (seen != calls) state.SkipWithError("the server did not see every call");
  state.SetItemsProcessed(static_cast<int64_t>(calls));
  state.counters["ns_per_call"] = benchmark::Counter(
      static_cast<double>(calls), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Pipelined host-to-device copies through the arena: the client stages chunks of user data in
// a window at the start of the arena, used as a ring, and sends one memcpyHtoD per chunk; the
// server copies each out and releases it. Args: MiB copied, chunk KiB, staging window MiB.
void BM_ArenaCopy(benchmark::State& state) {
  Fixture& f = *fixture;
  const uint64_t total = static_cast<uint64_t>(state.range(0)) << 20;
  const uint64_t chunk = static_cast<uint64_t>(state.range(1)) << 10;
  const auto window = f.client->arena().first(static_cast<uint64_t>(state.range(2)) << 20);
  BatchBuilder builder(1);
  // Staging positions count every byte ever staged; this run's window starts empty at `base`
  // (the previous run waited for everything to be released).
  const uint64_t base = f.staging;
  for (auto _ : state) {
    for (uint64_t done = 0; done < total; done += chunk) {
      // The window is a ring: wait until the server released this chunk's previous use.
      if (f.staging + chunk > base + window.size()) {
        const Status s = f.client->wait_staging_released(f.staging + chunk - window.size(), 10s);
        if (!s.ok()) die(s, "staging");
      }
      const uint64_t offset = (f.staging - base) % window.size();
      std::memcpy(window.data() + offset, f.user_data.data() + done, chunk);
      f.staging += chunk;
      builder.reset(f.seq++);
      auto copy = builder.add_call().initMemcpyHtoD();
      copy.setDst(done);
      copy.setSrcOffset(offset);
      copy.setBytes(chunk);
      copy.setStagingEnd(f.staging);
      if (Status s = f.client->send_pieces(builder.finish()); !s.ok()) die(s, "send");
    }
    // The copy is done when the server has released all of it.
    if (Status s = f.client->wait_staging_released(f.staging, 10s); !s.ok()) die(s, "drain");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total));
}

void BM_Memcpy(benchmark::State& state) {
  const uint64_t total = static_cast<uint64_t>(state.range(0)) << 20;
  std::vector<std::byte> destination(total);
  std::memset(destination.data(), 1, total);
  for (auto _ : state) {
    std::memcpy(destination.data(), fixture->user_data.data(), total);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total));
}

BENCHMARK(BM_SocketRoundTrip)->Arg(0)->Arg(200)->UseManualTime();
BENCHMARK(BM_ChannelRoundTrip)->Arg(0)->Arg(200)->UseManualTime();
BENCHMARK(BM_AsyncCalls)
    ->ArgsProduct({{64, 256}, {0, 32}})
    ->ArgNames({"calls", "param_bytes"})
    ->UseRealTime();
BENCHMARK(BM_Memcpy)->Arg(16)->Arg(256)->ArgName("MiB")->UseRealTime();
BENCHMARK(BM_ArenaCopy)
    ->ArgsProduct({{16, 256}, {256, 1024}, {4, 64}})
    ->ArgNames({"MiB", "chunk_KiB", "window_MiB"})
    ->UseRealTime();

}  // namespace
}  // namespace hiber::wire

int main(int argc, char** argv) {
  hiber::wire::Fixture fixture;
  hiber::wire::fixture = &fixture;
  hiber::wire::start(fixture);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  hiber::wire::stop(fixture);
  return 0;
}
