// Graphs: a CUDA graph the client captured or built arrives as the calls it stands for, between
// graphBegin and graphEnd; the session keeps them (checked again at each launch, by the same
// handlers as any call) and graphLaunch runs them in order on the launch's stream. Replaying the
// calls keeps everything that holds for a call true of a graph: its pointers are checked against
// the session's blocks, a kernel waits for the swap groups its arguments point into, and the
// graph runs on whichever GPU the function is bound to when it is launched.
#include <capnp/serialize.h>

#include "server/session.h"
#include "wire/call_codec.h"

namespace hiber::server {
namespace proto = wire::proto;

namespace {

// Bounds on what one session's graphs may hold, so a client cannot exhaust the server's memory.
constexpr size_t kMaxGraphs = 4096;
constexpr uint64_t kMaxGraphBytes = uint64_t{256} << 20;

bool keepable(proto::Call::Reader call) {
  switch (call.which()) {
    case proto::Call::MEMCPY_HTO_D:
    case proto::Call::MEMCPY_DTO_H:
      // Pinned memory only: staged bytes are the client's for one call, not for every launch.
      return wire::staging_end(call) == 0;
    case proto::Call::MEMCPY_DTO_D:
    case proto::Call::MEMSET:
    case proto::Call::LAUNCH_KERNEL:
    case proto::Call::LIBRARY_CALL: return !call.getReply();
    default: return false;
  }
}

}  // namespace

Status Session::keep_for_graph(proto::Call::Reader call) {
  Status refused;
  if (!keepable(call)) {
    refused = error(ErrorCode::kInvalidValue, "graph ", defining_->value(), ": ",
                    wire::call_name(call.which()), " cannot be part of a graph");
  } else {
    auto kept = std::make_unique<capnp::MallocMessageBuilder>();
    kept->setRoot(call);
    const uint64_t bytes = capnp::computeSerializedSizeInWords(*kept) * sizeof(capnp::word);
    if (graph_bytes_ + bytes > kMaxGraphBytes) {
      refused = error(ErrorCode::kOutOfMemory, "graph ", defining_->value(), ": the session's ",
                      "graphs would hold more than ", kMaxGraphBytes, " bytes of calls");
    } else {
      graph_bytes_ += bytes;
      defined_.bytes += bytes;
      defined_.calls.push_back(std::move(kept));
    }
  }
  if (!refused.ok() && defining_error_.ok()) defining_error_ = refused;
  return refused;
}

Session::Outcome Session::graph_begin(const wire::calls::GraphBegin& c) {
  if (c.graph.is_zero() || graphs_.count(c.graph) != 0) {
    return {error(ErrorCode::kInvalidValue, "graphBegin: graph ", c.graph.value(),
                  c.graph.is_zero() ? " is 0" : " exists already")};
  }
  if (graphs_.size() >= kMaxGraphs) {
    return {error(ErrorCode::kOutOfMemory, "graphBegin: more than ", kMaxGraphs, " graphs")};
  }
  defining_ = c.graph;
  defined_ = Graph{};
  defining_error_ = Status();
  return {Status()};
}

Session::Outcome Session::graph_end(const wire::calls::GraphEnd& c) {
  if (!defining_ || *defining_ != c.graph) {
    return {error(ErrorCode::kInvalidValue, "graphEnd: graph ", c.graph.value(),
                  " is not being defined")};
  }
  defining_.reset();
  Status failed = std::move(defining_error_);
  defining_error_ = Status();
  if (!failed.ok()) {
    graph_bytes_ -= defined_.bytes;
    defined_ = Graph{};
    return {failed.with_context("graphEnd")};
  }
  graphs_.emplace(c.graph, std::move(defined_));
  defined_ = Graph{};
  return {Status()};
}

Session::Outcome Session::graph_destroy(const wire::calls::GraphDestroy& c) {
  auto it = graphs_.find(c.graph);
  if (it == graphs_.end()) {
    return {error(ErrorCode::kInvalidHandle, "graphDestroy: unknown graph ", c.graph.value())};
  }
  graph_bytes_ -= it->second.bytes;
  graphs_.erase(it);
  return {Status()};
}

Session::Outcome Session::graph_launch(const wire::calls::GraphLaunch& c) {
  auto it = graphs_.find(c.graph);
  if (it == graphs_.end()) {
    return {error(ErrorCode::kInvalidHandle, "graphLaunch: unknown graph ", c.graph.value(),
                  " (destroyed, or never defined)")};
  }
  Outcome last{Status()};
  const std::vector<std::unique_ptr<capnp::MallocMessageBuilder>>& calls = it->second.calls;
  for (size_t i = 0; i < calls.size(); ++i) {
    Outcome step = replay(calls[i]->getRoot<proto::Call>().asReader(), c.stream);
    if (!step.status.ok()) {
      step.status = step.status.with_context(
          str_cat("graph ", c.graph.value(), ", call ", i, " of ", calls.size()));
      return step;
    }
    if (step.completes_on) last.completes_on = step.completes_on;
  }
  if (!last.completes_on && calls.empty()) {
    // An empty graph still orders: its launch completes with the stream's earlier work.
    auto s = work_stream(c.stream);
    if (!s.ok()) return {s.status()};
    last.completes_on = *s;
  }
  return last;
}

Session::Outcome Session::replay(proto::Call::Reader call, wire::StreamHandle stream) {
  auto on = [stream](auto args) {
    args.stream = stream;
    return args;
  };
  switch (call.which()) {
    case proto::Call::MEMCPY_HTO_D:
      return memcpy_htod(on(wire::read_call<wire::calls::MemcpyHtoD>(call)));
    case proto::Call::MEMCPY_DTO_H:
      return memcpy_dtoh(on(wire::read_call<wire::calls::MemcpyDtoH>(call)));
    case proto::Call::MEMCPY_DTO_D:
      return memcpy_dtod(on(wire::read_call<wire::calls::MemcpyDtoD>(call)));
    case proto::Call::MEMSET: return memset(on(wire::read_call<wire::calls::Memset>(call)));
    case proto::Call::LAUNCH_KERNEL:
      return launch_kernel(on(wire::read_call<wire::calls::LaunchKernel>(call)));
    case proto::Call::LIBRARY_CALL:
      return library_call(on(wire::read_call<wire::calls::LibraryCall>(call)));
    default: break;
  }
  return {error(ErrorCode::kIllegalState, "a graph holds ", wire::call_name(call.which()))};
}

}  // namespace hiber::server
