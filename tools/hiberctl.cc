// hiberctl: asks hiberd over its control socket how the node is doing.
//   hiberctl status     devices, sessions and counters
//   hiberctl ping       is hiberd answering?
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>

#include <capnp/message.h>
#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "common/paths.h"
#include "wire/handshake.h"
#include "wire/message.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"

DEFINE_string(run_dir, "", "hiberd's run directory (default: $HIBER_RUN_DIR, /run/hiber as root, "
                           "else /tmp/hiber-<uid>)");
DEFINE_string(control_socket, "", "hiberd's control socket (default: <run_dir>/control.sock)");
DEFINE_int32(timeout_ms, 5000, "How long to wait for hiberd's answer");

namespace hiber {
namespace {

namespace proto = wire::proto;

void print_status(proto::NodeStatus::Reader s) {
  std::printf("hiberd %u.%u on node %s (%s device), up %.1f s\n", s.getServerVersion().getMajor(),
              s.getServerVersion().getMinor(), s.getNodeName().cStr(), s.getBackend().cStr(),
              s.getUptimeSeconds());
  for (auto d : s.getDevices()) {
    std::printf("  GPU %u %s: %" PRIu64 " of %" PRIu64 " MiB backing sessions\n", d.getOrdinal(),
                d.getName().cStr(), d.getSessionBytes() >> 20, d.getTotalBytes() >> 20);
  }
  std::printf("  %u sessions\n", s.getSessions().size());
  for (auto x : s.getSessions()) {
    std::printf("    session %" PRIu64 " '%s' pid %d uid %u GPU %u: %" PRIu64 " of %" PRIu64
                " MiB, %" PRIu64 " batches, %" PRIu64 " calls (%" PRIu64 " failed), %.1f s\n",
                x.getId(), x.getFunctionId().cStr(), x.getPid(), x.getUid(), x.getGpu(),
                x.getAllocatedBytes() >> 20, x.getQuotaBytes() >> 20, x.getBatches(),
                x.getCalls(), x.getFailedCalls(), x.getConnectedSeconds());
  }
  auto c = s.getCounters();
  std::printf("  counters: sessions opened %" PRIu64 ", closed %" PRIu64
              ", handshakes rejected %" PRIu64 ", malformed messages %" PRIu64
              ", control requests %" PRIu64 "\n",
              c.getSessionsOpened(), c.getSessionsClosed(), c.getHandshakesRejected(),
              c.getMalformedMessages(), c.getControlRequests());
  std::printf("  module cache: %" PRIu64 " images (%" PRIu64 " MiB), %" PRIu64 " hits, %" PRIu64
              " misses, %" PRIu64 " unknown hashes\n",
              c.getCachedModules(), c.getCachedModuleBytes() >> 20, c.getModuleCacheHits(),
              c.getModuleCacheMisses(), c.getModuleCacheUnknownHashes());
}

int run(const std::string& command) {
  capnp::MallocMessageBuilder request;
  auto root = request.initRoot<proto::ControlRequest>();
  const wire::ProtocolVersion version = wire::current_protocol_version();
  root.initVersion().setMajor(version.major);
  root.getVersion().setMinor(version.minor);
  if (command == "status") {
    root.setStatus();
  } else if (command == "ping") {
    root.setPing();
  } else {
    std::fprintf(stderr, "hiberctl: unknown command '%s' (try status or ping)\n", command.c_str());
    return 2;
  }
  const std::string run_dir = FLAGS_run_dir.empty() ? default_run_dir() : FLAGS_run_dir;
  const std::string path =
      FLAGS_control_socket.empty() ? control_socket_path(run_dir) : FLAGS_control_socket;
  const auto timeout = std::chrono::milliseconds(FLAGS_timeout_ms);

  auto fail = [](const Status& s) {
    std::fprintf(stderr, "hiberctl: %s\n", s.to_string().c_str());
    return 1;
  };
  auto socket = wire::connect_unix(path);
  if (!socket.ok()) return fail(socket.status());
  auto frame = wire::encode_frame(request);
  if (!frame.ok()) return fail(frame.status());
  if (Status s = wire::send_frame(socket->get(), *frame); !s.ok()) return fail(s);
  wire::Message reply;
  Status received =
      wire::receive_frame(socket->get(), reply, nullptr, timeout, wire::kMaxControlReplyBytes);
  if (!received.ok()) {
    return fail(received);
  }
  int rc = 0;
  Status read = wire::read_message<proto::ControlReply>(
      reply, "control reply", [&](proto::ControlReply::Reader r) -> Status {
        switch (r.which()) {
          case proto::ControlReply::STATUS:
            print_status(r.getStatus());
            return Status();
          case proto::ControlReply::PONG:
            std::printf("hiberd is answering on %s\n", path.c_str());
            return Status();
          case proto::ControlReply::ERROR:
            rc = 1;
            return Status(static_cast<ErrorCode>(r.getError().getCode()),
                          r.getError().getMessage());
        }
        return Status(ErrorCode::kNotSupported, "unknown reply from hiberd");
      });
  if (!read.ok()) return fail(read);
  return rc;
}

}  // namespace
}  // namespace hiber

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv,
                      "hiberctl: talks to hiberd's control socket.\n  hiberctl status\n  hiberctl ping",
                      __FILE__);
  if (argc != 2) {
    std::fprintf(stderr, "usage: hiberctl [flags] status|ping\n");
    return 2;
  }
  return hiber::run(argv[1]);
}
