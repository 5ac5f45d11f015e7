// CUDA graphs in the client: stream capture records a capturing stream's calls as graph nodes
// instead of sending them; graphs are also built node by node. Instantiation orders the nodes
// (every dependency kept), cuts the order at host functions, and defines each run of calls in
// hiberd once (graphBegin, the calls, graphEnd); a launch is then one asynchronous call per run,
// batched like any other, and the host functions between runs run in the client in stream
// order. hiberd replays a run's calls on the launch's stream, through the same checks and swap
// waits as any call (server/session_graphs.cc). docs/shim.md, "Graphs", says what is refused.
#include <algorithm>
#include <cstring>

#include "client_shim/client.h"

namespace hiber::shim {
namespace {

constexpr ErrorCode kCaptureUnsupported =
    static_cast<ErrorCode>(900);  // ...StreamCaptureUnsupported
constexpr ErrorCode kCaptureInvalidated =
    static_cast<ErrorCode>(901);                                      // ...StreamCaptureInvalidated
constexpr ErrorCode kCaptureUnmatched = static_cast<ErrorCode>(903);  // ...StreamCaptureUnmatched
constexpr ErrorCode kIllegalState = static_cast<ErrorCode>(401);      // CUDA_ERROR_ILLEGAL_STATE
constexpr ErrorCode kExecUpdateFailure = static_cast<ErrorCode>(910);  // ...GraphExecUpdateFailure

const char* mode_name(int mode) {
  return mode == 0 ? "global" : mode == 1 ? "thread-local" : "relaxed";
}

}  // namespace

RecordedCall& RecordedCall::operator=(const RecordedCall& other) {
  if (this == &other) return *this;
  std::visit(
      [&](const auto& c) {
        using Call = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<Call, std::monostate>) {
          call = c;
          owned.clear();
        } else {
          set(c);
        }
      },
      other.call);
  return *this;
}

int& Client::thread_capture_mode() {
  thread_local int mode = 0;  // cudaStreamCaptureModeGlobal
  return mode;
}

// ---- Capture ----

Status Client::begin_capture(StreamObj* stream, int mode) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (mode < 0 || mode > 2) return error(ErrorCode::kInvalidValue, "capture mode ", mode);
  if (stream == nullptr) {
    return error(kCaptureUnsupported,
                 "cudaStreamBeginCapture: the legacy default stream cannot capture");
  }
  if (stream->capture != nullptr) {
    return error(kIllegalState, "cudaStreamBeginCapture: the stream is capturing already");
  }
  auto capture = std::make_unique<CaptureObj>();
  capture->id = ++next_capture_id_;
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->origin = stream;
  capture->streams.push_back(stream);
  capture->graph = std::make_unique<GraphObj>();
  stream->capture = capture.get();
  capturing_[stream->wire] = capture.get();
  captures_.emplace(capture->id, std::move(capture));
  return Status();
}

void Client::end_capture_of_streams_locked(CaptureObj& capture) {
  for (StreamObj* s : capture.streams) {
    s->capture = nullptr;
    capturing_.erase(s->wire);
  }
  for (auto& [key, event] : events_) {
    if (event->captured_in == capture.id) event->captured_in.reset();
  }
}

Result<GraphObj*> Client::end_capture(StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (stream == nullptr || stream->capture == nullptr) {
    return error(kIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  }
  CaptureObj& capture = *stream->capture;
  if (capture.origin != stream) {
    return error(kCaptureUnmatched, "cudaStreamEndCapture: the capture began on another stream");
  }
  end_capture_of_streams_locked(capture);
  auto owned = std::move(captures_.at(capture.id));
  captures_.erase(owned->id);
  if (!owned->invalidated.ok()) return owned->invalidated;
  GraphObj* graph = owned->graph.get();
  for (const auto& node : graph->nodes) graph_nodes_.emplace(node.get(), node.get());
  graphs_.emplace(graph, std::move(owned->graph));
  return graph;
}

Result<Client::CaptureState> Client::capture_state(StreamObj* stream) {
  std::lock_guard lock(mu_);
  CaptureState state;
  if (CaptureObj* capture = capture_of_locked(stream)) {
    state.status = capture->invalidated.ok() ? 1 : 2;
    state.id = capture->id;
    state.graph = capture->graph.get();
    state.last = capture->last;
  }
  return state;
}

Status Client::refuse_in_capture_locked(CaptureObj& capture, const char* what) {
  if (capture.invalidated.ok()) {
    capture.invalidated = error(kCaptureInvalidated, "the stream capture was invalidated: ", what,
                                " cannot be captured");
  }
  return error(kCaptureUnsupported, what, " cannot be captured (the stream is capturing; the ",
               "capture is invalidated)");
}

Status Client::check_unsafe_in_capture_locked(const char* what) {
  if (captures_.empty()) return Status();
  const auto self = std::this_thread::get_id();
  Status refused;
  for (auto& [id, capture] : captures_) {
    // CUDA's modes: a capture forbids its own thread's unsafe calls unless it is relaxed, and a
    // global one forbids every thread's whose own mode is global.
    const bool forbids = capture->thread == self ? capture->mode != 2
                                                 : capture->mode == 0 && thread_capture_mode() == 0;
    if (!forbids) continue;
    if (capture->invalidated.ok()) {
      capture->invalidated =
          error(kCaptureInvalidated, "the stream capture was invalidated: ", what,
                " was called during it");
    }
    refused = error(kCaptureUnsupported, what, " is not permitted while a stream captures in ",
                    mode_name(capture->mode), " mode (cudaStreamCaptureModeRelaxed permits it)");
  }
  return refused;
}

Status Client::add_captured_node_locked(CaptureObj& capture, std::unique_ptr<GraphNodeObj> node) {
  node->graph = capture.graph.get();
  if (capture.last != nullptr) node->dependencies.push_back(capture.last);
  capture.last = node.get();
  capture.graph->nodes.push_back(std::move(node));
  return Status();
}

// ---- Building graphs ----

GraphObj* Client::create_graph() {
  std::lock_guard lock(mu_);
  auto graph = std::make_unique<GraphObj>();
  GraphObj* made = graph.get();
  graphs_.emplace(made, std::move(graph));
  return made;
}

Result<GraphObj*> Client::graph(const void* handle) {
  std::lock_guard lock(mu_);
  auto it = graphs_.find(handle);
  if (it == graphs_.end()) return error(ErrorCode::kInvalidValue, "unknown graph ", handle);
  return it->second.get();
}

Status Client::destroy_graph(GraphObj* graph) {
  std::lock_guard lock(mu_);
  for (const auto& node : graph->nodes) graph_nodes_.erase(node.get());
  graphs_.erase(graph);
  return Status();
}

Result<GraphNodeObj*> Client::graph_node(const void* handle) {
  std::lock_guard lock(mu_);
  auto it = graph_nodes_.find(handle);
  if (it == graph_nodes_.end())
    return error(ErrorCode::kInvalidValue, "unknown graph node ", handle);
  return it->second;
}

GraphNodeObj* Client::new_node_locked(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                      GraphNodeObj::Kind kind) {
  auto node = std::make_unique<GraphNodeObj>();
  node->kind = kind;
  node->graph = graph;
  node->dependencies.assign(after.begin(), after.end());
  GraphNodeObj* made = node.get();
  graph->nodes.push_back(std::move(node));
  graph_nodes_.emplace(made, made);
  return made;
}

Result<RecordedCall> Client::kernel_call_locked(KernelObj* kernel, Dim3 grid, Dim3 block,
                                                uint32_t shared_bytes, void** args) {
  std::vector<std::byte> params;
  HIBER_RETURN_IF_ERROR(prepare_launch_locked(kernel, shared_bytes, args, &params));
  return RecordedCall(wire::calls::LaunchKernel{.stream = wire::StreamHandle(),
                                                .function = kernel->wire,
                                                .grid_x = grid.x,
                                                .grid_y = grid.y,
                                                .grid_z = grid.z,
                                                .block_x = block.x,
                                                .block_y = block.y,
                                                .block_z = block.z,
                                                .shared_mem_bytes = shared_bytes,
                                                .params = params});
}

Result<GraphNodeObj*> Client::add_kernel_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                              KernelObj* kernel, Dim3 grid, Dim3 block,
                                              uint32_t shared_bytes, void** args) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_ASSIGN_OR_RETURN(RecordedCall call,
                         kernel_call_locked(kernel, grid, block, shared_bytes, args));
  GraphNodeObj* node = new_node_locked(graph, after, GraphNodeObj::Kind::kCall);
  node->call = std::move(call);
  node->kernel = kernel;
  return node;
}

Result<GraphNodeObj*> Client::add_memcpy_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                              void* dst, const void* src, uint64_t bytes,
                                              CopyKind kind) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  const PointerInfo to = classify_locked(dst, bytes);
  const PointerInfo from = classify_locked(src, bytes);
  const auto dst_address = reinterpret_cast<uint64_t>(dst);
  const auto src_address = reinterpret_cast<uint64_t>(src);
  RecordedCall call;
  if (to.kind == PointerKind::kDevice && from.kind == PointerKind::kDevice) {
    HIBER_RETURN_IF_ERROR(check_device_range_locked(dst_address, bytes, "memcpy node destination"));
    HIBER_RETURN_IF_ERROR(check_device_range_locked(src_address, bytes, "memcpy node source"));
    call = RecordedCall(
        wire::calls::MemcpyDtoD{.dst = dst_address, .src = src_address, .bytes = bytes});
  } else if (to.kind == PointerKind::kDevice && from.kind == PointerKind::kArena) {
    HIBER_RETURN_IF_ERROR(check_device_range_locked(dst_address, bytes, "memcpy node destination"));
    call = RecordedCall(wire::calls::MemcpyHtoD{
        .dst = dst_address, .src_offset = from.arena_offset, .bytes = bytes});
  } else if (to.kind == PointerKind::kArena && from.kind == PointerKind::kDevice) {
    HIBER_RETURN_IF_ERROR(check_device_range_locked(src_address, bytes, "memcpy node source"));
    call = RecordedCall(
        wire::calls::MemcpyDtoH{.dst_offset = to.arena_offset, .src = src_address, .bytes = bytes});
  } else {
    return error(ErrorCode::kInvalidValue, "a graph's copy between ", src, " and ", dst,
                 ": host memory in a graph must be cudaMallocHost memory (hiberd reads and ",
                 "writes it at each launch); pageable and registered memory are not supported");
  }
  (void)kind;  // the pointers decide, as for cudaMemcpyDefault
  GraphNodeObj* node = new_node_locked(graph, after, GraphNodeObj::Kind::kCall);
  node->call = std::move(call);
  return node;
}

Result<GraphNodeObj*> Client::add_memset_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                              uint64_t dst, uint32_t value, int element_bytes,
                                              uint64_t count) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(check_device_range_locked(dst, count * element_bytes, "memset node"));
  GraphNodeObj* node = new_node_locked(graph, after, GraphNodeObj::Kind::kCall);
  node->call =
      RecordedCall(wire::calls::Memset{.dst = dst,
                                       .value = value,
                                       .element_bytes = static_cast<uint8_t>(element_bytes),
                                       .count = count});
  return node;
}

Result<GraphNodeObj*> Client::add_host_node(GraphObj* graph, std::span<GraphNodeObj* const> after,
                                            std::function<void(const Status&)> run) {
  std::lock_guard lock(mu_);
  GraphNodeObj* node = new_node_locked(graph, after, GraphNodeObj::Kind::kHost);
  node->host = std::move(run);
  return node;
}

Result<GraphNodeObj*> Client::add_empty_node(GraphObj* graph,
                                             std::span<GraphNodeObj* const> after) {
  std::lock_guard lock(mu_);
  return new_node_locked(graph, after, GraphNodeObj::Kind::kEmpty);
}

Status Client::set_kernel_params(GraphNodeObj* node, KernelObj* kernel, Dim3 grid, Dim3 block,
                                 uint32_t shared_bytes, void** args) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (node->kernel == nullptr) return error(ErrorCode::kInvalidValue, "not a kernel node");
  HIBER_ASSIGN_OR_RETURN(node->call, kernel_call_locked(kernel, grid, block, shared_bytes, args));
  node->kernel = kernel;
  return Status();
}

// ---- Executable graphs ----

namespace {

// The nodes in an order that keeps every dependency: Kahn's, ties in creation order.
Result<std::vector<const GraphNodeObj*>> launch_order(const GraphObj& graph) {
  std::unordered_map<const GraphNodeObj*, size_t> waiting;
  std::unordered_map<const GraphNodeObj*, std::vector<const GraphNodeObj*>> after;
  for (const auto& node : graph.nodes) {
    waiting[node.get()] = node->dependencies.size();
    for (const GraphNodeObj* dep : node->dependencies) {
      if (dep->graph != &graph) {
        return error(ErrorCode::kInvalidValue, "a graph node depends on a node of another graph");
      }
      after[dep].push_back(node.get());
    }
  }
  std::vector<const GraphNodeObj*> order;
  std::vector<const GraphNodeObj*> ready;
  for (const auto& node : graph.nodes) {
    if (waiting[node.get()] == 0) ready.push_back(node.get());
  }
  std::unordered_map<const GraphNodeObj*, size_t> index;
  for (size_t i = 0; i < graph.nodes.size(); ++i) index[graph.nodes[i].get()] = i;
  while (!ready.empty()) {
    auto next = std::min_element(ready.begin(), ready.end(),
                                 [&](auto a, auto b) { return index[a] < index[b]; });
    const GraphNodeObj* node = *next;
    ready.erase(next);
    order.push_back(node);
    for (const GraphNodeObj* child : after[node]) {
      if (--waiting[child] == 0) ready.push_back(child);
    }
  }
  if (order.size() != graph.nodes.size()) {
    return error(ErrorCode::kInvalidValue, "the graph's dependencies have a cycle");
  }
  return order;
}

}  // namespace

Status Client::define_piece_locked(GraphExecObj* exec, GraphExecObj::Piece& piece) {
  if (piece.graph) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::GraphDestroy{.graph = *piece.graph}));
  }
  piece.graph = new_handle_locked<wire::GraphHandle>();
  defining_graph_ = true;
  Status sent = enqueue_locked(wire::calls::GraphBegin{.graph = *piece.graph});
  for (size_t i = piece.first; sent.ok() && i < piece.first + piece.count; ++i) {
    std::visit(
        [&](const auto& c) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) {
            sent = enqueue_locked(c);
          }
        },
        exec->nodes[i].call.call);
  }
  if (sent.ok()) sent = enqueue_locked(wire::calls::GraphEnd{.graph = *piece.graph});
  defining_graph_ = false;
  return sent;
}

Status Client::define_pieces_locked(GraphExecObj* exec) {
  for (GraphExecObj::Piece& piece : exec->pieces) {
    if (!piece.host) HIBER_RETURN_IF_ERROR(define_piece_locked(exec, piece));
  }
  return Status();
}

Result<GraphExecObj*> Client::instantiate(GraphObj* graph) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_ASSIGN_OR_RETURN(std::vector<const GraphNodeObj*> order, launch_order(*graph));
  auto exec = std::make_unique<GraphExecObj>();
  for (const GraphNodeObj* node : order) {
    exec->at[node] = exec->nodes.size();
    exec->nodes.push_back(*node);
  }
  // Runs of calls between host functions; empty nodes are only dependencies.
  for (size_t i = 0; i < exec->nodes.size(); ++i) {
    const GraphNodeObj& node = exec->nodes[i];
    if (node.kind == GraphNodeObj::Kind::kHost) {
      exec->pieces.push_back({i, 1, std::nullopt, true});
    } else if (node.kind == GraphNodeObj::Kind::kCall) {
      if (exec->pieces.empty() || exec->pieces.back().host ||
          exec->pieces.back().first + exec->pieces.back().count != i) {
        exec->pieces.push_back({i, 0, std::nullopt, false});
      }
      ++exec->pieces.back().count;
    }
  }
  HIBER_RETURN_IF_ERROR(define_pieces_locked(exec.get()));
  GraphExecObj* made = exec.get();
  graph_execs_.emplace(made, std::move(exec));
  return made;
}

Result<GraphExecObj*> Client::graph_exec(const void* handle) {
  std::lock_guard lock(mu_);
  auto it = graph_execs_.find(handle);
  if (it == graph_execs_.end()) {
    return error(ErrorCode::kInvalidValue, "unknown executable graph ", handle,
                 " (destroyed, or never instantiated)");
  }
  return it->second.get();
}

Status Client::destroy_graph_exec(GraphExecObj* exec) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  for (const GraphExecObj::Piece& piece : exec->pieces) {
    if (piece.graph) {
      HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::GraphDestroy{.graph = *piece.graph}));
    }
  }
  graph_execs_.erase(exec);
  return Status();
}

Status Client::set_exec_kernel_params(GraphExecObj* exec, GraphNodeObj* node, KernelObj* kernel,
                                      Dim3 grid, Dim3 block, uint32_t shared_bytes, void** args) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto it = exec->at.find(node);
  if (it == exec->at.end() || exec->nodes[it->second].kernel == nullptr) {
    return error(ErrorCode::kInvalidValue, "the node is not a kernel node of this graph");
  }
  GraphNodeObj& copy = exec->nodes[it->second];
  HIBER_ASSIGN_OR_RETURN(copy.call, kernel_call_locked(kernel, grid, block, shared_bytes, args));
  copy.kernel = kernel;
  // Launches made before keep the parameters they had: the graph is defined anew.
  for (GraphExecObj::Piece& piece : exec->pieces) {
    if (!piece.host && it->second >= piece.first && it->second < piece.first + piece.count) {
      return define_piece_locked(exec, piece);
    }
  }
  return Status();
}

Status Client::update_exec(GraphExecObj* exec, GraphObj* graph) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_ASSIGN_OR_RETURN(std::vector<const GraphNodeObj*> order, launch_order(*graph));
  bool same = order.size() == exec->nodes.size();
  for (size_t i = 0; same && i < order.size(); ++i) {
    same = order[i]->kind == exec->nodes[i].kind &&
           order[i]->call.call.index() == exec->nodes[i].call.call.index();
  }
  if (!same) {
    return error(kExecUpdateFailure, "cudaGraphExecUpdate: the graph's nodes differ from those ",
                 "the executable graph was made from (only parameters may change)");
  }
  exec->at.clear();
  for (size_t i = 0; i < order.size(); ++i) {
    exec->at[order[i]] = i;
    exec->nodes[i] = *order[i];
  }
  return define_pieces_locked(exec);
}

Status Client::launch_graph(GraphExecObj* exec, StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (CaptureObj* capture = capture_of_locked(stream)) {
    return refuse_in_capture_locked(*capture, "cudaGraphLaunch (a graph in a graph)");
  }
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  for (const GraphExecObj::Piece& piece : exec->pieces) {
    if (piece.host) {
      HIBER_RETURN_IF_ERROR(launch_host_function_locked(stream, exec->nodes[piece.first].host));
    } else {
      HIBER_RETURN_IF_ERROR(enqueue_locked(
          wire::calls::GraphLaunch{.stream = stream_wire(stream), .graph = *piece.graph}));
    }
  }
  return Status();
}

}  // namespace hiber::shim
