#include "server/control_service.h"

#include <capnp/message.h>

#include <algorithm>
#include <string>
#include <variant>

#include "common/overloaded.h"
#include "scheduler/scheduler.h"
#include "server/auth.h"
#include "wire/control_codec.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::server {
namespace proto = wire::proto;
namespace control = wire::control;

namespace {

// What requestArrived and requestBegin name: a function and one of its instances ("": any).
Status check_arrival(const std::string& function_id, const std::string& instance,
                     const char* call) {
  HIBER_RETURN_IF_ERROR(wire::check_function_id(function_id, call));
  return wire::check_instance_key(instance, call);
}

void write_histogram(const Histogram& in, proto::Histogram::Builder out) {
  auto bounds = out.initUpperBounds(static_cast<unsigned>(in.upper_bounds.size()));
  for (size_t i = 0; i < in.upper_bounds.size(); ++i) {
    bounds.set(static_cast<unsigned>(i), in.upper_bounds[i]);
  }
  auto counts = out.initCounts(static_cast<unsigned>(in.counts.size()));
  for (size_t i = 0; i < in.counts.size(); ++i) counts.set(static_cast<unsigned>(i), in.counts[i]);
  out.setSum(in.sum);
  out.setCount(in.count);
}

// A control reply frame built by `fill`.
Result<std::vector<std::byte>> reply_frame(
    const std::function<void(proto::ControlReply::Builder)>& fill) {
  capnp::MallocMessageBuilder reply;
  fill(reply.initRoot<proto::ControlReply>());
  auto frame = wire::encode_frame(reply, wire::kMaxControlReplyBytes);
  if (!frame.ok()) {
    return Status(ErrorCode::kUnknown,
                  "hiberd cannot encode its reply: " + frame.status().message());
  }
  return frame;
}

Result<std::vector<std::byte>> reply_frame(const control::Reply& reply) {
  return reply_frame(
      [&](proto::ControlReply::Builder root) { wire::write_control_reply(root, reply); });
}

// The controller's registration from the router's, or why it is refused.
Result<Registration> registration_of(const wire::FunctionRegistration& f) {
  HIBER_RETURN_IF_ERROR(wire::check_function_id(f.function_id, "registerFunction"));
  if (!(f.slo_ms > 0) || f.slo_ms > 1e9) {
    return error(ErrorCode::kInvalidValue, "registerFunction '", f.function_id, "': sloMs ",
                 f.slo_ms, " must be in (0, 1e9]");
  }
  // Each check is written so that NaN fails too (every comparison with NaN is false): sloMs and
  // execMsHint are converted to integers below, where NaN, an infinity or an out-of-range value
  // is undefined behaviour.
  if (!(f.exec_ms_hint >= 0 && f.exec_ms_hint <= 1e9)) {
    return error(ErrorCode::kInvalidValue, "registerFunction '", f.function_id, "': execMsHint ",
                 f.exec_ms_hint, " must be in [0, 1e9]");
  }
  if (!(f.tail_percentile == 0 || (f.tail_percentile > 0 && f.tail_percentile < 1))) {
    return error(ErrorCode::kInvalidValue, "registerFunction '", f.function_id,
                 "': tailPercentile ", f.tail_percentile, " must be in (0, 1), or 0 for 0.98");
  }
  Registration registration;
  registration.function_id = f.function_id;
  registration.slo = static_cast<scheduler::Duration>(f.slo_ms * 1e6);
  registration.tail_percentile = f.tail_percentile;
  registration.quota_bytes = f.quota_bytes;
  registration.stateful = f.stateful;
  registration.heavy_hint = f.heavy;
  registration.exec_hint = static_cast<scheduler::Duration>(f.exec_ms_hint * 1e6);
  return registration;
}

}  // namespace

ControlService::ControlService(device::Device& device, Controller& controller,
                               const ModuleCache& modules,
                               std::function<DaemonReport()> daemon_report)
    : device_(device),
      controller_(controller),
      modules_(modules),
      daemon_report_(std::move(daemon_report)) {}

Result<std::vector<std::byte>> ControlService::error_frame(const Status& why) {
  return reply_frame(control::Reply(why));
}

Status ControlService::check_token(const wire::Message& request, std::string_view token) {
  std::string presented;
  HIBER_RETURN_IF_ERROR(wire::read_message<proto::ControlRequest>(
      request, "control request", [&](proto::ControlRequest::Reader r) -> Status {
        presented = r.getToken().cStr();
        return Status();
      }));
  if (presented.empty()) {
    return Status(ErrorCode::kNotPermitted,
                  "a control request must carry the node's control token (hiberd's "
                  "--control_token_file; by default the control-token file beside the control "
                  "socket)");
  }
  if (!tokens_equal(presented, token)) {
    return Status(ErrorCode::kNotPermitted, "wrong control token");
  }
  return Status();
}

Status ControlService::answer(const wire::Message& message, ReplySender send) {
  Result<control::Request> request = Status(ErrorCode::kInvalidValue, "no control request");
  HIBER_RETURN_IF_ERROR(wire::read_message<proto::ControlRequest>(
      message, "control request", [&](proto::ControlRequest::Reader r) -> Status {
        request = wire::read_control_request(r);
        return Status();
      }));
  // A request kind this hiberd does not know is answered, not a malformed message.
  if (!request.ok()) {
    send(error_frame(request.status()));
    return Status();
  }
  const wire::ProtocolVersion ours = wire::current_protocol_version();
  if (request->version.major != ours.major) {
    send(error_frame(error(ErrorCode::kNotSupported, "protocol ", request->version.major,
                           " is not supported; this hiberd speaks ", ours.major, ".", ours.minor)));
    return Status();
  }
  // Replies to the controller's calls come back on its thread.
  auto reply_ok = [send](Result<Controller::Ok> done) {
    send(reply_frame(done.ok() ? control::Reply(control::Ok{}) : control::Reply(done.status())));
  };
  std::visit(Overloaded{
                 [&](const control::StatusQuery& q) { answer_status(send, q); },
                 [&](const control::Ping&) { send(reply_frame(control::Reply(control::Pong{}))); },
                 [&](const wire::FunctionRegistration& f) {
                   auto registration = registration_of(f);
                   if (!registration.ok()) return send(error_frame(registration.status()));
                   controller_.register_function(*registration, reply_ok);
                 },
                 [&](const control::UnregisterFunction& u) {
                   Status valid = wire::check_function_id(u.function_id, "unregisterFunction");
                   if (!valid.ok()) return send(error_frame(valid));
                   controller_.unregister_function(u.function_id, reply_ok);
                 },
                 [&](const control::RequestArrived& a) {
                   Status valid = check_arrival(a.function_id, a.instance, "requestArrived");
                   if (!valid.ok()) return send(error_frame(valid));
                   controller_.request_arrived(
                       a.function_id, a.instance, [send](Result<uint64_t> id) {
                         if (!id.ok()) return send(error_frame(id.status()));
                         send(reply_frame(control::Reply(control::Accepted{*id})));
                       });
                 },
                 [&](const control::RequestBegin& b) {
                   Status valid = check_arrival(b.function_id, b.instance, "requestBegin");
                   if (!valid.ok()) return send(error_frame(valid));
                   controller_.request_begin(
                       b.function_id, b.instance, [send](Result<wire::Started> started) {
                         if (!started.ok()) return send(error_frame(started.status()));
                         send(reply_frame(control::Reply(*started)));
                       });
                 },
                 [&](const control::RequestStart& s) {
                   controller_.request_start(s.request_id, [send](Result<wire::Started> started) {
                     if (!started.ok()) return send(error_frame(started.status()));
                     send(reply_frame(control::Reply(*started)));
                   });
                 },
                 [&](const wire::RequestDone& d) {
                   controller_.request_done(d.request_id, d.failed, reply_ok);
                 },
                 [&](const wire::Drain& d) { controller_.drain(d.gpu, d.resume, reply_ok); },
             },
             request->body);
  return Status();
}

void ControlService::answer_status(ReplySender send, control::StatusQuery page) {
  // The daemon's part now; the controller's when its thread gets to it.
  DaemonReport report = daemon_report_();
  const ModuleCacheStats cache = modules_.stats();
  controller_.status(
      [this, send, report = std::move(report), cache, page](Result<ControllerStatus> controller) {
        if (!controller.ok()) return send(error_frame(controller.status()));
        const std::vector<SessionSnapshot>& sessions = report.sessions;
        const DaemonReport& counters = report;
        const uint64_t malformed = report.malformed_messages;
        const double uptime = report.uptime_seconds;
        send(reply_frame([&](proto::ControlReply::Builder root) {
          auto status = root.initStatus();
          const wire::ProtocolVersion ours = wire::current_protocol_version();
          auto version = status.initServerVersion();
          version.setMajor(ours.major);
          version.setMinor(ours.minor);
          status.setBackend(device_.backend_name());
          status.setNodeName(device_.topology().name);
          status.setUptimeSeconds(uptime);
          status.setIncarnation(report.incarnation);
          auto refused = status.initRefusedResumes(
              static_cast<unsigned>(report.refused_resumes.size()));
          for (size_t i = 0; i < report.refused_resumes.size(); ++i) {
            refused.set(static_cast<unsigned>(i), report.refused_resumes[i]);
          }
          std::vector<uint64_t> session_bytes(device_.gpu_count(), 0);
          for (int g = 0; g < device_.gpu_count(); ++g) {
            session_bytes[g] = controller->gpus[g].pool.allocated_bytes;
          }
          auto devices = status.initDevices(static_cast<unsigned>(device_.gpu_count()));
          for (int g = 0; g < device_.gpu_count(); ++g) {
            const ControllerStatus::Gpu& gpu = controller->gpus[g];
            auto d = devices[static_cast<unsigned>(g)];
            d.setOrdinal(static_cast<uint32_t>(g));
            d.setName(device_.properties(g).name);
            d.setTotalBytes(device_.properties(g).total_memory_bytes);
            d.setSessionBytes(session_bytes[g]);
            d.setHealthy(gpu.healthy);
            d.setDrained(gpu.drained);
            d.setRunningFunction(gpu.running);
            d.setPoolBytes(gpu.pool_bytes);
            d.setPoolAllocatedBytes(gpu.pool.allocated_bytes);
            d.setPoolLargestFreeBytes(gpu.pool.largest_free_bytes);
            d.setPoolFragmentation(gpu.pool.fragmentation());
            d.setSwapsIn(gpu.swaps_in);
            d.setSwapInBytes(gpu.swap_in_bytes);
            d.setSwapInSeconds(gpu.swap_in_seconds);
            d.setEvictions(gpu.evictions);
            auto reasons = d.initEvictionsByReason(node::kEvictionReasons);
            for (size_t r = 0; r < node::kEvictionReasons; ++r) {
              reasons[static_cast<unsigned>(r)].setReason(
                  node::eviction_reason_name(static_cast<node::EvictionReason>(r)));
              reasons[static_cast<unsigned>(r)].setCount(gpu.evictions_by_reason[r]);
            }
          }
          auto links = status.initSwapsByLink(node::kSwapLinks);
          for (size_t l = 0; l < node::kSwapLinks; ++l) {
            auto out = links[static_cast<unsigned>(l)];
            out.setLink(node::swap_link_name(static_cast<node::SwapLink>(l)));
            out.setSwaps(controller->swaps_by_link[l].swaps);
            out.setBytes(controller->swaps_by_link[l].bytes);
          }
          write_histogram(controller->swap_seconds, status.initSwapDuration());
          auto list = status.initSessions(static_cast<unsigned>(sessions.size()));
          for (size_t i = 0; i < sessions.size(); ++i) {
            const SessionSnapshot& s = sessions[i];
            auto out = list[static_cast<unsigned>(i)];
            out.setId(s.identity.id.value());
            out.setFunctionId(s.identity.function_id);
            out.setPid(s.identity.peer.pid);
            out.setUid(s.identity.peer.uid);
            // The wire's "between requests" is -1 (and 0 in the pre-1.2 field).
            out.setGpu(s.gpu ? static_cast<uint32_t>(s.gpu->value()) : 0);
            out.setBoundGpu(s.gpu ? s.gpu->value() : -1);
            out.setAllocatedBytes(s.allocated_bytes);
            out.setQuotaBytes(s.quota_bytes);
            out.setBatches(s.batches);
            out.setCalls(s.calls);
            out.setFailedCalls(s.failed_calls);
            out.setConnectedSeconds(s.connected_seconds);
            out.setInstance(s.identity.instance);
          }
          // The page asked for: [first, end) of every function.
          const uint64_t count = controller->functions.size();
          const uint64_t first = std::min(page.function_offset, count);
          const uint64_t end =
              page.function_limit == 0 ? count : std::min(count, first + page.function_limit);
          status.setFunctionCount(count);
          status.setFunctionOffset(first);
          auto functions = status.initFunctions(static_cast<unsigned>(end - first));
          for (uint64_t i = first; i < end; ++i) {
            const ControllerStatus::Function& f = controller->functions[i];
            auto out = functions[static_cast<unsigned>(i - first)];
            out.setFunctionId(f.function_id);
            out.setRegistered(f.registered);
            out.setStateful(f.stateful);
            out.setHeavy(f.heavy);
            out.setModelBytes(f.model_bytes);
            out.setHostCopyBytes(f.host_copy_bytes);
            auto gpus = out.initResidentGpus(static_cast<unsigned>(f.resident_gpus.size()));
            for (size_t g = 0; g < f.resident_gpus.size(); ++g) {
              gpus.set(static_cast<unsigned>(g), static_cast<uint32_t>(f.resident_gpus[g]));
            }
            out.setRequests(f.requests);
            out.setOnTime(f.on_time);
            out.setRrc(f.rrc);
            out.setInstances(f.instances);
          }
          auto sched = status.initScheduler();
          sched.setPlacement(controller->placement);
          sched.setEviction(controller->eviction);
          sched.setQueue(controller->queue);
          sched.setQueued(controller->queued);
          sched.setArrivals(controller->counters.arrivals);
          sched.setBackground(controller->counters.background);
          sched.setCompleted(controller->counters.completed);
          sched.setOnTime(controller->counters.on_time);
          sched.setResidentStarts(controller->counters.resident_starts);
          sched.setPeerSwaps(controller->counters.peer_swaps);
          sched.setHostSwaps(controller->counters.host_swaps);
          sched.setEvictions(controller->counters.evictions);
          sched.setShed(controller->counters.rejected);
          sched.setPreemptions(controller->preemptions);
          sched.setSwapGroupBytes(controller->swap_group_bytes);
          sched.setHostPoolBytes(controller->host_pool.capacity_bytes);
          sched.setHostPoolUsedBytes(controller->host_pool.model_bytes +
                                     controller->host_pool.staging_bytes);
          sched.setDrainingNode(controller->draining);
          auto out = status.initCounters();
          out.setSessionsOpened(counters.sessions_opened);
          out.setSessionsClosed(counters.sessions_closed);
          out.setHandshakesRejected(counters.handshakes_rejected);
          out.setMalformedMessages(malformed);
          out.setControlRequests(counters.control_requests);
          out.setCachedModules(cache.entries);
          out.setCachedModuleBytes(cache.image_bytes);
          out.setModuleCacheHits(cache.hits);
          out.setModuleCacheMisses(cache.misses);
          out.setModuleCacheUnknownHashes(cache.unknown_hashes);
          out.setRemotedCalls(counters.remoted_calls);
          out.setRemotedBatches(counters.remoted_batches);
          write_histogram(counters.batch_sizes, out.initBatchSize());
        }));
      });
}

}  // namespace hiber::server
