// hiber-probe: connects to hiberd as a function would, and reports what it sees: the session's
// grant, the devices and the node topology, the round-trip time of the call channel, and a
// data round trip (host -> device, memset, device -> host) checked against the host's own copy.
// Exit status 0 only if everything checked out.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "common/device_attributes.h"
#include "common/node_config.h"
#include "common/paths.h"
#include "wire/call_client.h"

DEFINE_string(run_dir, "",
              "hiberd's run directory (default: $HIBER_RUN_DIR, /run/hiber as root, "
              "else /tmp/hiber-<uid>)");
DEFINE_string(socket, "", "hiberd's function socket (default: <run_dir>/hiberd.sock)");
DEFINE_string(auth_token_file, "",
              "Token file (default: <run_dir>/auth-token; "
              "$HIBER_AUTH_TOKEN wins)");
DEFINE_string(function_id, "hiber-probe", "Function identity to present");
DEFINE_uint64(quota_mib, 0, "Device memory to ask for (0: hiberd's default)");
DEFINE_int32(pings, 2000, "Synchronous round trips to time");
DEFINE_double(stay_s, 0,
              "After the probe, stay connected this many seconds: an instance of --function_id "
              "that hiberd can schedule requests for (hiberctl node-invoke)");
DEFINE_uint64(copy_mib, 32,
              "Bytes to send through the data round trip, MiB (32 wraps the default 64 MiB "
              "arena, so the second pass shows warm pages)");

namespace hiber {
namespace {

namespace proto = wire::proto;
using Clock = std::chrono::steady_clock;

void print_session(const wire::SessionInfo& s) {
  std::printf("session %" PRIu64 " with hiberd (protocol %u.%u)\n", s.session_id,
              s.server_version.major, s.server_version.minor);
  std::printf("  grant: addresses [0x%" PRIx64 ", 0x%" PRIx64 "), quota %" PRIu64
              " MiB, granularity %" PRIu64 " KiB\n",
              s.grant.va_base, s.grant.va_base + s.grant.va_bytes, s.grant.quota_bytes >> 20,
              s.grant.allocation_granularity >> 10);
  std::printf("  channel: request ring %" PRIu64 " KiB, completion ring %" PRIu64
              " KiB, arena %" PRIu64 " MiB\n",
              s.layout.request_ring_bytes >> 10, s.layout.completion_ring_bytes >> 10,
              s.layout.arena_bytes >> 20);
  for (const wire::DeviceInfo& d : s.devices) {
    auto attr = [&](int i) {
      return i < static_cast<int>(d.attributes.size()) ? d.attributes[i] : 0;
    };
    std::printf("  device %u: %s, %" PRIu64 " MiB, compute capability %d.%d, %d SMs, bus %s\n",
                d.ordinal, d.name.c_str(), d.total_memory_bytes >> 20,
                attr(kAttrComputeCapabilityMajor), attr(kAttrComputeCapabilityMinor),
                attr(kAttrMultiprocessorCount), d.pci_bus_id.c_str());
  }
  std::printf("%s", describe(s.node).c_str());
}

Status time_round_trips(wire::CallClient& client, int count) {
  if (count <= 0) return Status();
  std::vector<double> us;
  us.reserve(count);
  for (int i = 0; i < count; ++i) {
    auto start = Clock::now();
    HIBER_RETURN_IF_ERROR(client.ping());
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) {
    return us[std::min(us.size() - 1, static_cast<size_t>(p * us.size()))];
  };
  std::printf(
      "round trip over %d synchronous calls: min %.1f us, p50 %.1f us, p99 %.1f us, "
      "max %.1f us\n",
      count, us.front(), pct(0.50), pct(0.99), us.back());
  return Status();
}

// host -> device, a memset over the middle, device -> host, twice over one allocation; each
// result must equal the same operations done on a host copy. The first pass touches fresh pages
// (new device memory, the arena) and pays their page faults; the second shows the steady state.
Status data_round_trip(wire::CallClient& client, uint64_t bytes) {
  const wire::Grant& grant = client.session().grant;
  const uint64_t g = grant.allocation_granularity;
  const uint64_t va = grant.va_base;
  const uint64_t chunk = std::min<uint64_t>(bytes, client.channel().arena().size() / 4);
  HIBER_RETURN_IF_ERROR(client.enqueue([&](proto::Call::Builder c) {
    auto a = c.initMemAllocate();
    a.setVa(va);
    a.setBytes((bytes + g - 1) / g * g);
  }));

  std::vector<uint8_t> expected(bytes), back(bytes);
  for (const char* pass : {"cold", "warm"}) {
    const uint8_t salt = pass[0];
    for (uint64_t i = 0; i < bytes; ++i)
      expected[i] = static_cast<uint8_t>(i * 131 + (i >> 12) + salt);
    const auto start = Clock::now();
    for (uint64_t done = 0; done < bytes; done += chunk) {
      const uint64_t n = std::min(chunk, bytes - done);
      auto staged = client.stage(n);
      if (!staged.ok()) return staged.status();
      std::memcpy(staged->bytes.data(), expected.data() + done, n);
      HIBER_RETURN_IF_ERROR(client.enqueue([&](proto::Call::Builder c) {
        auto m = c.initMemcpyHtoD();
        m.setDst(va + done);
        m.setSrcOffset(staged->offset);
        m.setBytes(n);
        m.setStagingEnd(staged->staging_end);
      }));
    }
    const uint64_t set_from = bytes / 4, set_count = bytes / 2;
    HIBER_RETURN_IF_ERROR(client.enqueue([&](proto::Call::Builder c) {
      auto m = c.initMemset();
      m.setDst(va + set_from);
      m.setValue(0xA5);
      m.setElementBytes(1);
      m.setCount(set_count);
    }));
    std::memset(expected.data() + set_from, 0xA5, set_count);
    for (uint64_t done = 0; done < bytes; done += chunk) {
      const uint64_t n = std::min(chunk, bytes - done);
      auto staged = client.stage(n);
      if (!staged.ok()) return staged.status();
      auto reply = client.call([&](proto::Call::Builder c) {
        auto m = c.initMemcpyDtoH();
        m.setDstOffset(staged->offset);
        m.setSrc(va + done);
        m.setBytes(n);
        m.setStagingEnd(staged->staging_end);
      });
      if (!reply.ok()) return reply.status();
      std::memcpy(back.data() + done, staged->bytes.data(), n);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    HIBER_RETURN_IF_ERROR(client.take_error());
    auto mismatch = std::mismatch(back.begin(), back.end(), expected.begin());
    if (mismatch.first != back.end()) {
      return error(ErrorCode::kUnknown, "data round trip: byte ", mismatch.first - back.begin(),
                   " is ", static_cast<int>(*mismatch.first), ", expected ",
                   static_cast<int>(*mismatch.second));
    }
    std::printf("data round trip (%s): %" PRIu64
                " KiB host->device, memset, device->host in "
                "%.2f ms (%.2f GB/s each way): matches the host reference\n",
                pass, bytes >> 10, seconds * 1e3, bytes / seconds / 1e9);
  }
  HIBER_RETURN_IF_ERROR(client.enqueue([&](proto::Call::Builder c) { c.initMemFree().setVa(va); }));
  HIBER_RETURN_IF_ERROR(client.ping());
  return client.take_error();
}

int run() {
  const std::string run_dir = FLAGS_run_dir.empty() ? default_run_dir() : FLAGS_run_dir;
  auto token = client_auth_token(FLAGS_auth_token_file.empty() ? client_auth_token_file(run_dir)
                                                               : FLAGS_auth_token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "hiber-probe: %s\n", token.status().to_string().c_str());
    return 1;
  }
  wire::ClientOptions options;
  options.socket_path = FLAGS_socket.empty() ? function_socket_path(run_dir) : FLAGS_socket;
  options.function_id = FLAGS_function_id;
  options.auth_token = *token;
  options.requested_quota_bytes = FLAGS_quota_mib << 20;
  auto client = wire::CallClient::connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "hiber-probe: %s\n", client.status().to_string().c_str());
    return 1;
  }
  print_session((*client)->session());
  Status status = time_round_trips(**client, FLAGS_pings);
  const uint64_t bytes = std::max<uint64_t>(FLAGS_copy_mib, 1) << 20;
  if (status.ok()) status = data_round_trip(**client, bytes);
  if (!status.ok()) {
    std::fprintf(stderr, "hiber-probe: FAILED: %s\n", status.to_string().c_str());
    return 1;
  }
  std::printf("hiber-probe: OK\n");
  if (FLAGS_stay_s > 0) {
    std::printf("hiber-probe: staying connected as '%s' for %.1f s\n", FLAGS_function_id.c_str(),
                FLAGS_stay_s);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_stay_s));
  }
  return 0;
}

}  // namespace
}  // namespace hiber

int main(int argc, char** argv) {
  hiber::init_program(
      &argc, &argv,
      "hiber-probe: connects to hiberd as a function and reports what it sees: devices, "
      "topology, round-trip time and a checked data round trip.",
      __FILE__);
  return hiber::run();
}
