// Writes the seed corpora of the Cap'n Proto harnesses (handshake, call_batch, control_request)
// with the production encoders, one file per seed: hiber_fuzz_seeds <corpus dir>.
// tests/fuzz/make_seeds.sh runs it and adds the node-config and fatbin seeds.
#include <capnp/message.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "library_ops/blas_ops.h"
#include "library_ops/dnn_ops.h"
#include "wire/call_codec.h"
#include "wire/control_codec.h"
#include "wire/handshake.h"
#include "wire/library.h"
#include "wire/socket_frame.h"

namespace hiber {
namespace {

namespace fs = std::filesystem;
namespace proto = wire::proto;
namespace calls = wire::calls;

void save(const fs::path& dir, const std::string& name, std::span<const std::byte> bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "hiber_fuzz_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

void save_encoded(const fs::path& dir, const std::string& name,
                  const Result<std::vector<std::byte>>& r) {
  if (!r.ok()) {
    std::fprintf(stderr, "hiber_fuzz_seeds: %s: %s\n", name.c_str(), r.status().message().c_str());
    std::exit(1);
  }
  save(dir, name, *r);
}

template <typename T>
std::span<const std::byte> bytes_of(const T& value) {
  return std::as_bytes(std::span(&value, 1));
}

// ---- handshake ----

void handshake(const fs::path& dir) {
  const wire::ProtocolVersion ours = wire::current_protocol_version();
  save_encoded(dir, "hello", wire::encode_hello_frame({ours, "resnet50", "", 1 << 30}));
  save_encoded(dir, "hello_token", wire::encode_hello_frame({ours, "bert-large.v2", "s3cret", 0}));
  save_encoded(
      dir, "hello_long_id",
      wire::encode_hello_frame({ours, std::string(wire::kMaxFunctionIdBytes, 'f'),
                                std::string(wire::kMaxAuthTokenBytes, 't'), ~uint64_t{0}}));
  save_encoded(dir, "hello_old_version", wire::encode_hello_frame({{0, 1}, "f", "", 4096}));

  wire::SessionInfo session;
  session.session_id = 7;
  session.server_version = ours;
  session.grant = {0x7f0000000000, 1ull << 34, 1ull << 33, 2 << 20};
  session.layout = {.memfd_bytes = 1 << 24,
                    .request_ring_offset = 4096,
                    .request_ring_bytes = 1 << 20,
                    .completion_ring_offset = 4096 + (1 << 20),
                    .completion_ring_bytes = 1 << 16,
                    .arena_offset = 1 << 22,
                    .arena_bytes = 1 << 23,
                    .max_message_bytes = 1 << 19};
  session.node = paper_node_config();
  save_encoded(dir, "welcome_no_devices", wire::encode_welcome_frame(session));
  for (int i = 0; i < 2; ++i) {
    wire::DeviceInfo device;
    device.ordinal = static_cast<uint32_t>(i);
    device.name = "Tesla V100-SXM2-16GB";
    device.uuid.assign(16, static_cast<uint8_t>(0xa0 + i));
    device.pci_bus_id = "0000:3b:00." + std::to_string(i);
    device.total_memory_bytes = 16ull << 30;
    device.attributes = {1024, 1024, 64, 49152, 65536, 32, 2147483647, 65535, 65535};
    session.devices.push_back(device);
  }
  save_encoded(dir, "welcome_two_devices", wire::encode_welcome_frame(session));
  session.node = default_node_config();
  save_encoded(dir, "welcome_default_node", wire::encode_welcome_frame(session));
  save_encoded(dir, "rejected_token",
               wire::encode_rejection_frame(Status(ErrorCode::kNotPermitted, "wrong auth token")));
  save_encoded(
      dir, "rejected_full",
      wire::encode_rejection_frame(Status(ErrorCode::kDeviceUnavailable, "hiberd is full")));
}

// ---- control requests and replies ----

Result<std::vector<std::byte>> request_frame(wire::control::RequestBody body, std::string token) {
  capnp::MallocMessageBuilder message;
  wire::control::Request request{wire::current_protocol_version(), std::move(body),
                                 std::move(token)};
  wire::write_control_request(message.initRoot<proto::ControlRequest>(), request);
  return wire::encode_frame(message);
}

Result<std::vector<std::byte>> reply_frame(const wire::control::Reply& reply) {
  capnp::MallocMessageBuilder message;
  wire::write_control_reply(message.initRoot<proto::ControlReply>(), reply);
  return wire::encode_frame(message);
}

void control(const fs::path& dir) {
  namespace control = wire::control;
  save_encoded(dir, "status", request_frame(control::StatusQuery{}, ""));
  save_encoded(dir, "ping_token", request_frame(control::Ping{}, "node-token"));
  save_encoded(dir, "register",
               request_frame(wire::FunctionRegistration{.function_id = "resnet50",
                                                        .slo_ms = 100,
                                                        .tail_percentile = 0.98,
                                                        .quota_bytes = 2ull << 30,
                                                        .stateful = false,
                                                        .heavy = true,
                                                        .exec_ms_hint = 12.5},
                             ""));
  save_encoded(
      dir, "register_light",
      request_frame(wire::FunctionRegistration{.function_id = "tiny", .slo_ms = 5, .heavy = false},
                    "t"));
  save_encoded(dir, "unregister", request_frame(control::UnregisterFunction{"resnet50"}, ""));
  save_encoded(dir, "arrived", request_frame(control::RequestArrived{"bert"}, ""));
  save_encoded(dir, "start", request_frame(control::RequestStart{42}, ""));
  save_encoded(dir, "done", request_frame(wire::RequestDone{42, true}, ""));
  save_encoded(dir, "drain", request_frame(wire::Drain{3, false}, ""));
  save_encoded(dir, "drain_node_resume", request_frame(wire::Drain{-1, true}, ""));
  save_encoded(dir, "reply_pong", reply_frame(control::Pong{}));
  save_encoded(dir, "reply_ok", reply_frame(control::Ok{}));
  save_encoded(dir, "reply_accepted", reply_frame(control::Accepted{9}));
  save_encoded(dir, "reply_started",
               reply_frame(wire::Started{2, "peer", 1, "nvlink-peer", 3.5, "nvlink"}));
  save_encoded(dir, "reply_error", reply_frame(Status(ErrorCode::kNotFound, "no function 'x'")));
}

// ---- call batches ----

struct Batch {
  capnp::MallocMessageBuilder message;
  std::vector<std::function<void(proto::Call::Builder)>> fills;

  template <typename T>
  Batch& add(const T& args, bool reply = false) {
    fills.push_back([args, reply](proto::Call::Builder call) {
      wire::write_call(call, args);
      call.setReply(reply);
    });
    return *this;
  }
  std::vector<std::byte> bytes(uint64_t first_seq = 1) {
    auto batch = message.initRoot<proto::Batch>();
    batch.setFirstSeq(first_seq);
    auto list = batch.initCalls(static_cast<unsigned>(fills.size()));
    for (size_t i = 0; i < fills.size(); ++i) fills[i](list[static_cast<unsigned>(i)]);
    return wire::frame_bytes(message);
  }
};

std::vector<std::byte> gemm_args() {
  library_ops::blas::Gemm gemm;
  gemm.a = 0x7f0000000000;
  gemm.b = gemm.a + 4096;
  gemm.c = gemm.b + 4096;
  gemm.lda = gemm.ldb = gemm.ldc = 16;
  gemm.m = gemm.n = gemm.k = 16;
  gemm.batch_count = 1;  // CUDA_R_32F, CUBLAS_COMPUTE_32F
  gemm.compute_type = 68;
  const float one = 1.0f;
  std::memcpy(gemm.alpha.bytes, &one, sizeof(one));
  const auto b = bytes_of(gemm);
  return {b.begin(), b.end()};
}

std::vector<std::byte> dnn_define_args() {
  library_ops::dnn::Graph graph;
  library_ops::dnn::Node tensor;
  tensor.type = 4;  // a tensor descriptor
  library_ops::dnn::Attr dims{.name = 1, .type = 4, .bytes = {}};
  const int64_t shape[4] = {1, 3, 8, 8};
  const auto s = std::as_bytes(std::span(shape));
  dims.bytes.assign(s.begin(), s.end());
  tensor.attrs.push_back(dims);
  graph.nodes.push_back(tensor);
  const library_ops::dnn::DefineGraphHeader header{1};
  std::vector<std::byte> out;
  const auto h = bytes_of(header);
  out.assign(h.begin(), h.end());
  const auto g = library_ops::dnn::encode_graph(graph);
  out.insert(out.end(), g.begin(), g.end());
  return out;
}

void call_batch(const fs::path& dir) {
  const uint64_t va = 0x7f0000000000;
  const wire::StreamHandle s1(1);
  const wire::EventHandle e1(1), e2(2);
  const wire::ModuleHandle m1(1);
  const wire::FunctionHandle f1(1);
  const wire::LibraryHandle blas(1), dnn(2);
  const std::byte params[16] = {};
  const std::byte sha[32] = {};
  const std::vector<std::byte> gemm = gemm_args();
  const std::vector<std::byte> define = dnn_define_args();

  save(dir, "ping", Batch().add(calls::Ping{42}, true).bytes());
  save(dir, "alloc_free",
       Batch().add(calls::MemAllocate{va, 1 << 20}).add(calls::MemFree{va}, true).bytes());
  save(dir, "copies",
       Batch()
           .add(calls::MemAllocate{va, 1 << 20})
           .add(calls::StreamCreate{s1, 0})
           .add(calls::MemcpyHtoD{s1, va, 0, 4096, 4096})
           .add(calls::MemcpyDtoD{s1, va + 8192, va, 4096})
           .add(calls::Memset{s1, va, 7, 4, 1024})
           .add(calls::MemcpyDtoH{s1, 8192, va, 4096, 12288}, true)
           .add(calls::StreamSynchronize{s1}, true)
           .add(calls::StreamQuery{s1}, true)
           .add(calls::StreamDestroy{s1})
           .bytes());
  save(dir, "events",
       Batch()
           .add(calls::EventCreate{e1, false})
           .add(calls::EventCreate{e2, true})
           .add(calls::EventRecord{s1, e1})
           .add(calls::StreamWaitEvent{s1, e1})
           .add(calls::EventRecord{s1, e2})
           .add(calls::EventSynchronize{e2}, true)
           .add(calls::EventQuery{e1}, true)
           .add(calls::EventElapsedTime{e1, e2}, true)
           .add(calls::EventDestroy{e1})
           .add(calls::DeviceSynchronize{}, true)
           .bytes(17));
  save(dir, "modules",
       Batch()
           .add(calls::ModuleLoad{m1, 0, 8192, 8192})
           .add(calls::FunctionGet{f1, m1, "_Z6vecAddPKfS0_Pfi"}, true)
           .add(calls::LaunchKernel{s1, f1, 4, 1, 1, 256, 1, 1, 0, params})
           .add(calls::ModuleLoadCached{wire::ModuleHandle(2), sha}, true)
           .add(calls::ModuleUnload{m1})
           .bytes());
  save(dir, "blas",
       Batch()
           .add(calls::LibraryHandleCreate{blas, 1})
           .add(calls::LibraryCall{s1, blas, 1, gemm})
           .add(calls::LibraryQuery{blas, 1, gemm}, true)
           .add(calls::LibraryHandleDestroy{blas})
           .bytes());
  save(dir, "dnn",
       Batch()
           .add(calls::LibraryHandleCreate{dnn, 2})
           .add(calls::LibraryCall{s1, dnn, 200, define})
           .add(calls::LibraryQuery{dnn, 201, define}, true)
           .add(calls::LibraryHandleDestroy{dnn})
           .bytes());
}

}  // namespace
}  // namespace hiber

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hiber_fuzz_seeds <corpus dir>\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  hiber::handshake(root / "handshake");
  hiber::control(root / "control_request");
  hiber::call_batch(root / "call_batch");
  return 0;
}
