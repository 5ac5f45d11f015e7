// The entry points of CUDA graphs and stream capture (runtime, and the driver's capture calls),
// on the client core (client_graphs.cc): capture state is answered here with no round trip, a
// graph is defined in hiberd when it is instantiated, and a launch is asynchronous and batched.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "client_shim/api_support.h"
#include "client_shim/cuda_entry_decls.h"
#include "client_shim/cudart_entry_decls.h"

using hiber::ErrorCode;
using hiber::Status;
using hiber::shim::Client;
using hiber::shim::GraphExecObj;
using hiber::shim::GraphNodeObj;
using hiber::shim::GraphObj;
using hiber::shim::KernelObj;

namespace {

constexpr auto& fail = hiber::shim::fail<cudaError_t>;
constexpr auto& done = hiber::shim::done<cudaError_t>;
constexpr auto& invalid = hiber::shim::invalid<cudaError_t>;

hiber::Result<GraphObj*> graph_of(cudaGraph_t graph) { return Client::get().graph(graph); }

// The nodes a new node follows.
hiber::Result<std::vector<GraphNodeObj*>> dependencies(const cudaGraphNode_t* nodes, size_t count) {
  if (count != 0 && nodes == nullptr) {
    return Status(ErrorCode::kInvalidValue, "null dependencies");
  }
  std::vector<GraphNodeObj*> out;
  for (size_t i = 0; i < count; ++i) {
    HIBER_ASSIGN_OR_RETURN(GraphNodeObj * node, Client::get().graph_node(nodes[i]));
    out.push_back(node);
  }
  return out;
}

// A kernel node's kernel: a host stub (the runtime's way) or a cudaKernel_t.
hiber::Result<KernelObj*> node_kernel(const cudaKernelNodeParams* params) {
  if (params == nullptr || params->func == nullptr) {
    return Status(ErrorCode::kInvalidValue, "null kernel node parameters");
  }
  if (params->extra != nullptr) {
    return Status(ErrorCode::kNotSupported, "kernel node parameters through `extra`");
  }
  auto kernel = Client::get().kernel_for_host_function(params->func);
  if (kernel.ok()) return kernel;
  auto by_handle = Client::get().kernel(params->func);
  if (by_handle.ok()) return by_handle;
  return Status(static_cast<ErrorCode>(cudaErrorInvalidDeviceFunction), kernel.status().message());
}

hiber::shim::Dim3 dims(dim3 d) { return {d.x, d.y, d.z}; }

template <typename Add>
cudaError_t add_node(const char* name, cudaGraphNode_t* out, cudaGraph_t graph,
                     const cudaGraphNode_t* after, size_t count, Add add) {
  if (out == nullptr) return invalid(name, "null node");
  auto g = graph_of(graph);
  if (!g.ok()) return fail(name, g.status());
  auto deps = dependencies(after, count);
  if (!deps.ok()) return fail(name, deps.status());
  hiber::Result<GraphNodeObj*> node = add(*g, std::span<GraphNodeObj* const>(*deps));
  if (!node.ok()) return fail(name, node.status());
  *out = reinterpret_cast<cudaGraphNode_t>(*node);
  return cudaSuccess;
}

}  // namespace

// ---- Capture ----

cudaError_t hiber_entry::cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamBeginCapture", s.status());
  return done("cudaStreamBeginCapture", Client::get().begin_capture(*s, mode));
}
cudaError_t hiber_entry::cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                     cudaStreamCaptureMode mode) {
  return hiber_entry::cudaStreamBeginCapture(stream, mode);
}

cudaError_t hiber_entry::cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return invalid("cudaStreamEndCapture", "null graph");
  *graph = nullptr;
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamEndCapture", s.status());
  auto captured = Client::get().end_capture(*s);
  if (!captured.ok()) return fail("cudaStreamEndCapture", captured.status());
  *graph = reinterpret_cast<cudaGraph_t>(*captured);
  return cudaSuccess;
}
cudaError_t hiber_entry::cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* graph) {
  return hiber_entry::cudaStreamEndCapture(stream, graph);
}

cudaError_t hiber_entry::cudaStreamIsCapturing(cudaStream_t stream,
                                               cudaStreamCaptureStatus* status) {
  if (status == nullptr) return invalid("cudaStreamIsCapturing", "null pointer");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamIsCapturing", s.status());
  auto state = Client::get().capture_state(*s);
  *status = static_cast<cudaStreamCaptureStatus>(state->status);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                  cudaStreamCaptureStatus* status,
                                                  unsigned long long* id, cudaGraph_t* graph,
                                                  const cudaGraphNode_t** dependencies_out,
                                                  const cudaGraphEdgeData** edge_data,
                                                  size_t* count) {
  if (status == nullptr) return invalid("cudaStreamGetCaptureInfo", "null pointer");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamGetCaptureInfo", s.status());
  auto state = Client::get().capture_state(*s);
  *status = static_cast<cudaStreamCaptureStatus>(state->status);
  // The node the stream's next captured work follows: the capture's last (valid until the
  // next call of the calling thread, as CUDA's array is until the stream's next capture call).
  thread_local cudaGraphNode_t last[1];
  last[0] = reinterpret_cast<cudaGraphNode_t>(state->last);
  const bool active = state->status != 0;
  if (id) *id = active ? state->id : 0;
  if (graph) *graph = active ? reinterpret_cast<cudaGraph_t>(state->graph) : nullptr;
  if (dependencies_out) *dependencies_out = active && state->last ? last : nullptr;
  if (edge_data) *edge_data = nullptr;
  if (count) *count = active && state->last ? 1 : 0;
  return cudaSuccess;
}
cudaError_t hiber_entry::cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                                       cudaStreamCaptureStatus* status,
                                                       unsigned long long* id, cudaGraph_t* graph,
                                                       const cudaGraphNode_t** dependencies_out,
                                                       const cudaGraphEdgeData** edge_data,
                                                       size_t* count) {
  return hiber_entry::cudaStreamGetCaptureInfo(stream, status, id, graph, dependencies_out,
                                               edge_data, count);
}

cudaError_t hiber_entry::cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return invalid("cudaThreadExchangeStreamCaptureMode", "null pointer");
  int& current = Client::thread_capture_mode();
  const int previous = current;
  current = *mode;
  *mode = static_cast<cudaStreamCaptureMode>(previous);
  return cudaSuccess;
}

// ---- Graphs ----

cudaError_t hiber_entry::cudaGraphCreate(cudaGraph_t* graph, unsigned int flags) {
  if (graph == nullptr || flags != 0) return invalid("cudaGraphCreate");
  *graph = reinterpret_cast<cudaGraph_t>(Client::get().create_graph());
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGraphDestroy(cudaGraph_t graph) {
  auto g = graph_of(graph);
  if (!g.ok()) return fail("cudaGraphDestroy", g.status());
  return done("cudaGraphDestroy", Client::get().destroy_graph(*g));
}

cudaError_t hiber_entry::cudaGraphAddKernelNode(cudaGraphNode_t* node, cudaGraph_t graph,
                                                const cudaGraphNode_t* after, size_t count,
                                                const cudaKernelNodeParams* params) {
  return add_node(
      "cudaGraphAddKernelNode", node, graph, after, count,
      [&](GraphObj* g, std::span<GraphNodeObj* const> deps) -> hiber::Result<GraphNodeObj*> {
        HIBER_ASSIGN_OR_RETURN(KernelObj * kernel, node_kernel(params));
        return Client::get().add_kernel_node(g, deps, kernel, dims(params->gridDim),
                                             dims(params->blockDim), params->sharedMemBytes,
                                             params->kernelParams);
      });
}

cudaError_t hiber_entry::cudaGraphAddMemcpyNode1D(cudaGraphNode_t* node, cudaGraph_t graph,
                                                  const cudaGraphNode_t* after, size_t count,
                                                  void* dst, const void* src, size_t bytes,
                                                  cudaMemcpyKind kind) {
  return add_node("cudaGraphAddMemcpyNode1D", node, graph, after, count,
                  [&](GraphObj* g, std::span<GraphNodeObj* const> deps) {
                    return Client::get().add_memcpy_node(g, deps, dst, src, bytes,
                                                         hiber::shim::CopyKind::kDefault);
                  });
  (void)kind;
}

cudaError_t hiber_entry::cudaGraphAddMemsetNode(cudaGraphNode_t* node, cudaGraph_t graph,
                                                const cudaGraphNode_t* after, size_t count,
                                                const cudaMemsetParams* params) {
  return add_node(
      "cudaGraphAddMemsetNode", node, graph, after, count,
      [&](GraphObj* g, std::span<GraphNodeObj* const> deps) -> hiber::Result<GraphNodeObj*> {
        if (params == nullptr || params->height != 1 ||
            (params->elementSize != 1 && params->elementSize != 2 && params->elementSize != 4)) {
          return Status(ErrorCode::kInvalidValue,
                        "memset node: one row (height 1) of 1-, 2- or 4-byte elements");
        }
        return Client::get().add_memset_node(g, deps, reinterpret_cast<uint64_t>(params->dst),
                                             params->value, static_cast<int>(params->elementSize),
                                             params->width);
      });
}

cudaError_t hiber_entry::cudaGraphAddHostNode(cudaGraphNode_t* node, cudaGraph_t graph,
                                              const cudaGraphNode_t* after, size_t count,
                                              const cudaHostNodeParams* params) {
  return add_node(
      "cudaGraphAddHostNode", node, graph, after, count,
      [&](GraphObj* g, std::span<GraphNodeObj* const> deps) -> hiber::Result<GraphNodeObj*> {
        if (params == nullptr || params->fn == nullptr) {
          return Status(ErrorCode::kInvalidValue, "host node: null function");
        }
        cudaHostFn_t fn = params->fn;
        void* data = params->userData;
        // As a host function in a stream: not called once earlier work failed.
        return Client::get().add_host_node(g, deps, [fn, data](const Status& s) {
          if (s.ok()) fn(data);
        });
      });
}

cudaError_t hiber_entry::cudaGraphAddEmptyNode(cudaGraphNode_t* node, cudaGraph_t graph,
                                               const cudaGraphNode_t* after, size_t count) {
  return add_node("cudaGraphAddEmptyNode", node, graph, after, count,
                  [&](GraphObj* g, std::span<GraphNodeObj* const> deps) {
                    return Client::get().add_empty_node(g, deps);
                  });
}

cudaError_t hiber_entry::cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes,
                                           size_t* count) {
  if (count == nullptr) return invalid("cudaGraphGetNodes", "null count");
  auto g = graph_of(graph);
  if (!g.ok()) return fail("cudaGraphGetNodes", g.status());
  const size_t have = (*g)->nodes.size();
  if (nodes != nullptr) {
    for (size_t i = 0; i < std::min(have, *count); ++i) {
      nodes[i] = reinterpret_cast<cudaGraphNode_t>((*g)->nodes[i].get());
    }
    for (size_t i = have; i < *count; ++i) nodes[i] = nullptr;
  }
  *count = have;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGraphKernelNodeSetParams(cudaGraphNode_t node,
                                                      const cudaKernelNodeParams* params) {
  auto n = Client::get().graph_node(node);
  if (!n.ok()) return fail("cudaGraphKernelNodeSetParams", n.status());
  auto kernel = node_kernel(params);
  if (!kernel.ok()) return fail("cudaGraphKernelNodeSetParams", kernel.status());
  return done(
      "cudaGraphKernelNodeSetParams",
      Client::get().set_kernel_params(*n, *kernel, dims(params->gridDim), dims(params->blockDim),
                                      params->sharedMemBytes, params->kernelParams));
}

// ---- Executable graphs ----

cudaError_t hiber_entry::cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                              unsigned long long flags) {
  if (exec == nullptr) return invalid("cudaGraphInstantiate", "null pointer");
  *exec = nullptr;
  // Device launch needs graphs on the GPU, which hiberd does not make. Auto-free-on-launch has
  // nothing to free (the shim makes no memory nodes); upload and node priority change nothing.
  if ((flags & cudaGraphInstantiateFlagDeviceLaunch) != 0) {
    return fail("cudaGraphInstantiate",
                hiber::error(ErrorCode::kNotSupported, "cudaGraphInstantiateFlagDeviceLaunch is ",
                             "not supported: graphs are launched from the host"));
  }
  auto g = graph_of(graph);
  if (!g.ok()) return fail("cudaGraphInstantiate", g.status());
  auto made = Client::get().instantiate(*g);
  if (!made.ok()) return fail("cudaGraphInstantiate", made.status());
  *exec = reinterpret_cast<cudaGraphExec_t>(*made);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                                       unsigned long long flags) {
  return hiber_entry::cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t hiber_entry::cudaGraphExecDestroy(cudaGraphExec_t exec) {
  auto e = Client::get().graph_exec(exec);
  if (!e.ok()) return fail("cudaGraphExecDestroy", e.status());
  return done("cudaGraphExecDestroy", Client::get().destroy_graph_exec(*e));
}

cudaError_t hiber_entry::cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  auto e = Client::get().graph_exec(exec);
  if (!e.ok()) return fail("cudaGraphLaunch", e.status());
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaGraphLaunch", s.status());
  return done("cudaGraphLaunch", Client::get().launch_graph(*e, *s));
}
cudaError_t hiber_entry::cudaGraphLaunch_ptsz(cudaGraphExec_t exec, cudaStream_t stream) {
  return hiber_entry::cudaGraphLaunch(exec, stream);
}

cudaError_t hiber_entry::cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream) {
  // hiberd holds the graph from its instantiation on: nothing is left to upload.
  auto e = Client::get().graph_exec(exec);
  if (!e.ok()) return fail("cudaGraphUpload", e.status());
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaGraphUpload", s.status());
  return cudaSuccess;
}
cudaError_t hiber_entry::cudaGraphUpload_ptsz(cudaGraphExec_t exec, cudaStream_t stream) {
  return hiber_entry::cudaGraphUpload(exec, stream);
}

cudaError_t hiber_entry::cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec,
                                                          cudaGraphNode_t node,
                                                          const cudaKernelNodeParams* params) {
  auto e = Client::get().graph_exec(exec);
  if (!e.ok()) return fail("cudaGraphExecKernelNodeSetParams", e.status());
  auto n = Client::get().graph_node(node);
  if (!n.ok()) return fail("cudaGraphExecKernelNodeSetParams", n.status());
  auto kernel = node_kernel(params);
  if (!kernel.ok()) return fail("cudaGraphExecKernelNodeSetParams", kernel.status());
  return done("cudaGraphExecKernelNodeSetParams",
              Client::get().set_exec_kernel_params(*e, *n, *kernel, dims(params->gridDim),
                                                   dims(params->blockDim), params->sharedMemBytes,
                                                   params->kernelParams));
}

cudaError_t hiber_entry::cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                             cudaGraphExecUpdateResultInfo* info) {
  auto e = Client::get().graph_exec(exec);
  if (!e.ok()) return fail("cudaGraphExecUpdate", e.status());
  auto g = graph_of(graph);
  if (!g.ok()) return fail("cudaGraphExecUpdate", g.status());
  const Status updated = Client::get().update_exec(*e, *g);
  if (info != nullptr) {
    *info = cudaGraphExecUpdateResultInfo{};
    info->result =
        updated.ok() ? cudaGraphExecUpdateSuccess : cudaGraphExecUpdateErrorTopologyChanged;
  }
  return done("cudaGraphExecUpdate", updated);
}

// ---- The driver's capture state ----

CUresult hiber_entry::cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto s = Client::get().stream(stream);
  if (!s.ok()) return static_cast<CUresult>(hiber::shim::failed("cuStreamIsCapturing", s.status()));
  *status = static_cast<CUstreamCaptureStatus>(Client::get().capture_state(*s)->status);
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  return hiber_entry::cuStreamIsCapturing(stream, status);
}
CUresult hiber_entry::cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int& current = Client::thread_capture_mode();
  const int previous = current;
  current = *mode;
  *mode = static_cast<CUstreamCaptureMode>(previous);
  return CUDA_SUCCESS;
}

// ---- The driver's graphs: the same objects as the runtime's ----

namespace {

CUresult driver_result(const char* name, const Status& status) {
  return status.ok() ? CUDA_SUCCESS : static_cast<CUresult>(hiber::shim::failed(name, status));
}

}  // namespace

CUresult hiber_entry::cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return driver_result("cuStreamBeginCapture", s.status());
  return driver_result("cuStreamBeginCapture", Client::get().begin_capture(*s, mode));
}

CUresult hiber_entry::cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *graph = nullptr;
  auto s = Client::get().stream(stream);
  if (!s.ok()) return driver_result("cuStreamEndCapture", s.status());
  auto captured = Client::get().end_capture(*s);
  if (!captured.ok()) return driver_result("cuStreamEndCapture", captured.status());
  *graph = reinterpret_cast<CUgraph>(*captured);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                                  unsigned long long flags) {
  return static_cast<CUresult>(hiber_entry::cudaGraphInstantiate(
      reinterpret_cast<cudaGraphExec_t*>(exec), reinterpret_cast<cudaGraph_t>(graph), flags));
}

CUresult hiber_entry::cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return static_cast<CUresult>(hiber_entry::cudaGraphLaunch(
      reinterpret_cast<cudaGraphExec_t>(exec), reinterpret_cast<cudaStream_t>(stream)));
}

CUresult hiber_entry::cuGraphExecDestroy(CUgraphExec exec) {
  return static_cast<CUresult>(
      hiber_entry::cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec)));
}

CUresult hiber_entry::cuGraphDestroy(CUgraph graph) {
  return static_cast<CUresult>(hiber_entry::cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(graph)));
}
