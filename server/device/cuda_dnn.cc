// The real cuDNN behind the remoted cuDNN calls (wire/dnn_ops.h) on the CUDA backend. Loading and
// the real handles per (owner, client handle, GPU) are cuda_libraries.h's; this file adds what
// cuDNN's calls need on top.
//
// Descriptor graphs. The client sends its backend descriptors as an encoded graph (post-order,
// references as positions of earlier nodes, handles and host pointers left out). hiberd rebuilds
// them as real descriptors in that order: each node is created, its attributes are set exactly as
// the program set them (a descriptor-typed attribute's positions become the real descriptors made
// for those nodes; an empty attribute is left unset, which is cuDNN's default), the handle
// attribute that cuDNN requires of OPERATIONGRAPH and EXECUTION_PLAN descriptors is set to the
// real handle of (owner, client handle, GPU), and the node is finalized, so cuDNN checks every
// descriptor as it would have in the client. Handle and pointer attributes never travel: a graph
// carrying one is refused before cuDNN sees it (hiberd would otherwise hand cuDNN a client's
// number as an address in its own process).
//
// kDnnFinalize (a query) rebuilds the operation graph and answers for every engine of the device
// (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT), in global-index order as the client indexes
// them, each with its rank in cuDNN's own heuristic (an ENGINEHEUR of mode INSTANT on the real
// graph; the client orders CUDNN_ATTR_ENGINEHEUR_RESULTS by it, engines the heuristic did not
// return last, and falls back to index order if the heuristic failed, logged once): an engine is
// supported when an ENGINE, an ENGINECFG without knob choices (the client's engine configs have
// none) and an EXECUTION_PLAN all finalize, which is exactly what the client's plan will be rebuilt
// as; its workspace is that plan's, its notes the engine's. Building the plans is what makes the
// answer truthful (an engine can finalize and its plan still fail), at the cost of one plan build
// per engine, once per distinct graph (the client caches answers).
//
// kDnnDefineGraph keeps the encoded plan per (owner, graph id). The real plan is built at its
// first execution on a GPU, with the executing client handle's real handle, and kept per
// (owner, graph id, client handle, GPU): a function moved to another GPU gets a fresh plan there,
// and a warm execution is cudnnSetStream (only when the stream changed) plus a variant pack
// created, finalized, executed and destroyed. The plan's workspace on this GPU is checked against
// what the client brought, so a plan that needs more than the client was told is refused rather
// than let write past the workspace.
//
// The legacy calls rebuild their tensor, pooling and activation descriptors from the call's
// struct each time (a host allocation each: cheaper than a cache keyed by their contents).
//
// release() destroys the plans (after cuCtxSynchronize on their GPU: work enqueued with them must
// finish first) and then the handles, each with its GPU's context current.
#include <cudnn_graph.h>
#include <cudnn_ops.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <compare>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "common/cuda_abi.h"
#include "common/mutex.h"
#include "library_ops/dnn_ops.h"
#include "server/device/cuda_libraries.h"
#include "server/device/cuda_library_support.h"

namespace hiber::device {
namespace {

namespace dnn = library_ops::dnn;
using cuda_lib::HandleKey;
using cuda_lib::HandleTable;
using cuda_lib::LazyLibrary;
using cuda_lib::OpenedLibrary;
using cuda_lib::resolve;

// ---- Entry points ----

// (name, type): one row per entry point used, resolved by name into pfn_<name>; the type is the
// header's declaration, so a prototype that changes fails to compile here.
// clang-format off
#define HIBER_CUDNN_ENTRY_POINTS(X)                                                       \
  X(cudnnGetVersion, decltype(&cudnnGetVersion))                                          \
  X(cudnnGetErrorString, decltype(&cudnnGetErrorString))                                  \
  X(cudnnGetLastErrorString, decltype(&cudnnGetLastErrorString))                          \
  X(cudnnCreate, decltype(&cudnnCreate))                                                  \
  X(cudnnDestroy, decltype(&cudnnDestroy))                                                \
  X(cudnnSetStream, decltype(&cudnnSetStream))                                            \
  /* the backend (graph) API */                                                           \
  X(cudnnBackendCreateDescriptor, decltype(&cudnnBackendCreateDescriptor))                \
  X(cudnnBackendDestroyDescriptor, decltype(&cudnnBackendDestroyDescriptor))              \
  X(cudnnBackendSetAttribute, decltype(&cudnnBackendSetAttribute))                        \
  X(cudnnBackendGetAttribute, decltype(&cudnnBackendGetAttribute))                        \
  X(cudnnBackendFinalize, decltype(&cudnnBackendFinalize))                                \
  X(cudnnBackendExecute, decltype(&cudnnBackendExecute))                                  \
  /* the legacy calls */                                                                  \
  X(cudnnCreateTensorDescriptor, decltype(&cudnnCreateTensorDescriptor))                  \
  X(cudnnSetTensorNdDescriptor, decltype(&cudnnSetTensorNdDescriptor))                    \
  X(cudnnDestroyTensorDescriptor, decltype(&cudnnDestroyTensorDescriptor))                \
  X(cudnnCreatePoolingDescriptor, decltype(&cudnnCreatePoolingDescriptor))                \
  X(cudnnSetPoolingNdDescriptor, decltype(&cudnnSetPoolingNdDescriptor))                  \
  X(cudnnDestroyPoolingDescriptor, decltype(&cudnnDestroyPoolingDescriptor))              \
  X(cudnnCreateActivationDescriptor, decltype(&cudnnCreateActivationDescriptor))          \
  X(cudnnSetActivationDescriptor, decltype(&cudnnSetActivationDescriptor))                \
  X(cudnnDestroyActivationDescriptor, decltype(&cudnnDestroyActivationDescriptor))        \
  X(cudnnBatchNormalizationForwardInference,                                              \
    decltype(&cudnnBatchNormalizationForwardInference))                                   \
  X(cudnnPoolingForward, decltype(&cudnnPoolingForward))                                  \
  X(cudnnActivationForward, decltype(&cudnnActivationForward))                            \
  X(cudnnSoftmaxForward, decltype(&cudnnSoftmaxForward))                                  \
  X(cudnnAddTensor, decltype(&cudnnAddTensor))
// clang-format on

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

struct CudnnApi {
#define HIBER_MEMBER_(name, type) type pfn_##name = nullptr;
  HIBER_CUDNN_ENTRY_POINTS(HIBER_MEMBER_)
#undef HIBER_MEMBER_

  Status resolve_all(const OpenedLibrary& library) {
#define HIBER_RESOLVE_(name, type) \
  HIBER_RETURN_IF_ERROR(resolve(library, #name, reinterpret_cast<void**>(&pfn_##name)));
    HIBER_CUDNN_ENTRY_POINTS(HIBER_RESOLVE_)
#undef HIBER_RESOLVE_
    // cuDNN's major version is its ABI: a libcudnn of another minor release is fine, but say
    // which one serves, since engines and numerics differ between releases.
    LOG(INFO) << "cuDNN " << pfn_cudnnGetVersion() << " (hiberd built with " << CUDNN_VERSION
              << ")";
    return Status();
  }

  // "cudnnBackendExecute: CUDNN_STATUS_EXECUTION_FAILED (5000): <cuDNN's last error message>",
  // with a code the client turns back into a cudnnStatus_t of the same family. Must be called on
  // the thread that made the failing call: cuDNN keeps the message per thread.
  Status check(cudnnStatus_t status, std::string_view call) const {
    if (status == CUDNN_STATUS_SUCCESS) return Status();
    const int value = static_cast<int>(status);
    ErrorCode code = ErrorCode::kUnknown;
    if (value / 1000 == CUDNN_STATUS_BAD_PARAM / 1000) {
      code = ErrorCode::kInvalidValue;
    } else if (value / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) {
      code = ErrorCode::kNotSupported;
    } else if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
               status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
      code = ErrorCode::kOutOfMemory;
    } else if (value / 1000 == CUDNN_STATUS_EXECUTION_FAILED / 1000) {
      code = ErrorCode::kLaunchFailed;
    } else if (status == CUDNN_STATUS_NOT_INITIALIZED) {
      code = ErrorCode::kNotInitialized;
    }
    const char* name = pfn_cudnnGetErrorString(status);
    char last[512] = {};
    pfn_cudnnGetLastErrorString(last, sizeof last);
    last[sizeof last - 1] = '\0';
    const std::string message = one_line(last);
    return error(code, call, ": ", name != nullptr ? name : "cuDNN status", " (", value, ")",
                 message.empty() ? "" : ": ", message);
  }
};

// ---- Handles ----

struct CudnnTraits {
  using Raw = cudnnHandle_t;
  static constexpr const char* kName = "cuDNN";
  struct Settings {
    CUstream stream = nullptr;
    bool stream_set = false;
  };
  static Status create(const CudnnApi& api, Raw* raw) {
    return api.check(api.pfn_cudnnCreate(raw), "cudnnCreate");
  }
  // cudnnDestroy synchronises the device first, so work enqueued with the handle finishes before
  // its resources are freed.
  static Status destroy(const CudnnApi& api, Raw raw) {
    return api.check(api.pfn_cudnnDestroy(raw), "cudnnDestroy");
  }
};

Status use_stream_on(const CudnnApi& api, cudnnHandle_t h, CudnnTraits::Settings& now,
                     CUstream stream) {
  if (now.stream_set && now.stream == stream) return Status();
  HIBER_RETURN_IF_ERROR(api.check(api.pfn_cudnnSetStream(h, reinterpret_cast<cudaStream_t>(stream)),
                                  "cudnnSetStream"));
  now.stream = stream;
  now.stream_set = true;
  return Status();
}

// ---- Backend descriptors ----

// Real backend descriptors made for one purpose, destroyed together (newest first: a plan before
// the configuration and graph it was made from).
class Descriptors {
 public:
  explicit Descriptors(const CudnnApi& api) : api_(&api) {}
  Descriptors(Descriptors&& other) noexcept
      : api_(other.api_), made_(std::exchange(other.made_, {})) {}
  Descriptors& operator=(Descriptors&&) = delete;
  Descriptors(const Descriptors&) = delete;
  ~Descriptors() { destroy(); }

  Result<cudnnBackendDescriptor_t> create(int32_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    HIBER_RETURN_IF_ERROR(api_->check(
        api_->pfn_cudnnBackendCreateDescriptor(static_cast<cudnnBackendDescriptorType_t>(type), &d),
        str_cat("cudnnBackendCreateDescriptor(", dnn::descriptor_type_name(type), ")")));
    made_.push_back(d);
    return d;
  }
  void destroy() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      Status s = api_->check(api_->pfn_cudnnBackendDestroyDescriptor(*it),
                             "cudnnBackendDestroyDescriptor");
      LOG_IF(WARNING, !s.ok()) << s;
    }
    made_.clear();
  }
  // Forgets the descriptors without destroying them: they were made in a context that was
  // reset, and destroying a plan of it could touch what the reset freed.
  void abandon() { made_.clear(); }
  cudnnBackendDescriptor_t at(size_t i) const { return made_.at(i); }
  cudnnBackendDescriptor_t back() const { return made_.back(); }
  size_t size() const { return made_.size(); }

 private:
  const CudnnApi* api_;
  std::vector<cudnnBackendDescriptor_t> made_;
};

Status set_attr(const CudnnApi& api, cudnnBackendDescriptor_t d, int32_t name, int32_t type,
                int64_t count, const void* values, std::string_view what) {
  return api.check(api.pfn_cudnnBackendSetAttribute(
                       d, static_cast<cudnnBackendAttributeName_t>(name),
                       static_cast<cudnnBackendAttributeType_t>(type), count, values),
                   str_cat("cudnnBackendSetAttribute(", what, ", attribute ", name, ")"));
}

Status finalize(const CudnnApi& api, cudnnBackendDescriptor_t d, std::string_view what) {
  return api.check(api.pfn_cudnnBackendFinalize(d), str_cat("cudnnBackendFinalize(", what, ")"));
}

Result<int64_t> get_int64(const CudnnApi& api, cudnnBackendDescriptor_t d, int32_t name,
                          std::string_view what) {
  int64_t value = 0, count = 0;
  HIBER_RETURN_IF_ERROR(
      api.check(api.pfn_cudnnBackendGetAttribute(d, static_cast<cudnnBackendAttributeName_t>(name),
                                                 CUDNN_TYPE_INT64, 1, &count, &value),
                str_cat("cudnnBackendGetAttribute(", what, ")")));
  if (count != 1)
    return error(ErrorCode::kUnknown, "cudnnBackendGetAttribute(", what, ") gave ", count,
                 " values, 1 expected");
  return value;
}

// The descriptor types the client proxies (client_shim/cudnn_backend.cc), less the variant pack,
// which is hiberd's own: what a graph may hold.
bool rebuilt_type(int32_t type) {
  switch (type) {
    case dnn::kPointwise:
    case dnn::kConvolution:
    case dnn::kEngine:
    case dnn::kEngineCfg:
    case dnn::kExecutionPlan:
    case dnn::kOpConvForward:
    case dnn::kOpPointwise:
    case dnn::kMatmul:
    case dnn::kOpMatmul:
    case dnn::kReduction:
    case dnn::kOpReduction:
    case dnn::kOpNormForward:
    case dnn::kOperationGraph:
    case dnn::kTensor: return true;
  }
  return false;
}

// What must hold before any of `g` reaches cuDNN (decode_graph checked its shape already).
Status check_rebuildable(const dnn::Graph& g, int32_t root_type) {
  if (g.nodes.empty() || g.nodes.back().type != root_type)
    return error(ErrorCode::kInvalidValue, "cuDNN graph: the root is not a ",
                 dnn::descriptor_type_name(root_type));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const dnn::Node& node = g.nodes[i];
    if (!rebuilt_type(node.type))
      return error(ErrorCode::kNotSupported, "cuDNN graph: node ", i, " is a ",
                   dnn::descriptor_type_name(node.type),
                   ", which hiberd's CUDA backend does not rebuild");
    for (const dnn::Attr& a : node.attrs) {
      if (a.type == dnn::kTypeHandle || a.type == dnn::kTypeVoidPtr)
        return error(ErrorCode::kInvalidValue, "cuDNN graph: node ", i, " (",
                     dnn::descriptor_type_name(node.type), ") carries attribute ", a.name,
                     " of attribute type ", a.type,
                     ": handles and pointers never travel in a graph");
    }
  }
  return Status();
}

// Rebuilds every node of `g` as a real descriptor, finalized, in the graph's order; `handle` is
// set as the handle attribute of operation graphs and execution plans.
Result<Descriptors> rebuild(const CudnnApi& api, const dnn::Graph& g, cudnnHandle_t handle) {
  Descriptors made(api);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const dnn::Node& node = g.nodes[i];
    const std::string what = str_cat("node ", i, ", ", dnn::descriptor_type_name(node.type));
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t d, made.create(node.type));
    for (const dnn::Attr& a : node.attrs) {
      const size_t count = a.count();
      // An empty attribute is what the program set with no elements: cuDNN's default.
      if (count == 0) continue;
      if (a.type == dnn::kTypeBackendDescriptor) {
        std::vector<cudnnBackendDescriptor_t> refs(count);
        for (size_t k = 0; k < count; ++k) {
          uint64_t at = 0;
          std::memcpy(&at, a.bytes.data() + k * sizeof at, sizeof at);
          if (at >= i)  // decode_graph guarantees this; a reference forward would be unbuilt
            return error(ErrorCode::kInvalidValue, "cuDNN graph: ", what, " references node ", at);
          refs[k] = made.at(at);
        }
        HIBER_RETURN_IF_ERROR(
            set_attr(api, d, a.name, a.type, static_cast<int64_t>(count), refs.data(), what));
      } else {
        HIBER_RETURN_IF_ERROR(
            set_attr(api, d, a.name, a.type, static_cast<int64_t>(count), a.bytes.data(), what));
      }
    }
    if (node.type == dnn::kOperationGraph || node.type == dnn::kExecutionPlan) {
      const int32_t name =
          node.type == dnn::kOperationGraph ? dnn::kOperationGraphHandle : dnn::kPlanHandle;
      HIBER_RETURN_IF_ERROR(set_attr(api, d, name, dnn::kTypeHandle, 1, &handle, what));
    }
    HIBER_RETURN_IF_ERROR(finalize(api, d, what));
  }
  return made;
}

// A note list as the answer's bit mask; kNotSupported for a note the mask cannot carry (the
// client filters on notes, so one cannot be dropped).
template <typename Note>
Result<uint32_t> note_mask(const CudnnApi& api, cudnnBackendDescriptor_t engine, int32_t name,
                           int32_t type, const char* what) {
  std::array<Note, 64> notes{};
  int64_t count = 0;
  HIBER_RETURN_IF_ERROR(api.check(
      api.pfn_cudnnBackendGetAttribute(engine, static_cast<cudnnBackendAttributeName_t>(name),
                                       static_cast<cudnnBackendAttributeType_t>(type),
                                       static_cast<int64_t>(notes.size()), &count, notes.data()),
      str_cat("cudnnBackendGetAttribute(ENGINE, ", what, ")")));
  uint32_t mask = 0;
  for (int64_t i = 0; i < std::min<int64_t>(count, notes.size()); ++i) {
    const int note = static_cast<int>(notes[i]);
    if (note < 0 || note >= 32)
      return error(ErrorCode::kNotSupported, what, " ", note, " cannot be reported to the client");
    mask |= 1u << note;
  }
  return mask;
}

// What the client's plan for engine `index` of `op_graph` would be: supported, workspace, notes.
dnn::EngineSupport describe_engine(const CudnnApi& api, cudnnHandle_t handle,
                                   cudnnBackendDescriptor_t op_graph, int64_t index) {
  dnn::EngineSupport e;
  e.global_index = index;
  Descriptors made(api);
  Status status = [&]() -> Status {
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t engine, made.create(dnn::kEngine));
    HIBER_RETURN_IF_ERROR(set_attr(api, engine, dnn::kEngineOperationGraph,
                                   dnn::kTypeBackendDescriptor, 1, &op_graph, "ENGINE"));
    HIBER_RETURN_IF_ERROR(
        set_attr(api, engine, dnn::kEngineGlobalIndex, dnn::kTypeInt64, 1, &index, "ENGINE"));
    HIBER_RETURN_IF_ERROR(finalize(api, engine, "ENGINE"));
    HIBER_ASSIGN_OR_RETURN(e.numerical_notes, note_mask<cudnnBackendNumericalNote_t>(
                                                  api, engine, dnn::kEngineNumericalNote,
                                                  dnn::kTypeNumericalNote, "numerical note"));
    HIBER_ASSIGN_OR_RETURN(e.behavior_notes, note_mask<cudnnBackendBehaviorNote_t>(
                                                 api, engine, dnn::kEngineBehaviorNote,
                                                 dnn::kTypeBehaviorNote, "behaviour note"));
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t cfg, made.create(dnn::kEngineCfg));
    HIBER_RETURN_IF_ERROR(set_attr(api, cfg, dnn::kEngineCfgEngine, dnn::kTypeBackendDescriptor, 1,
                                   &engine, "ENGINECFG"));
    HIBER_RETURN_IF_ERROR(finalize(api, cfg, "ENGINECFG"));
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t plan, made.create(dnn::kExecutionPlan));
    HIBER_RETURN_IF_ERROR(
        set_attr(api, plan, dnn::kPlanHandle, dnn::kTypeHandle, 1, &handle, "EXECUTION_PLAN"));
    HIBER_RETURN_IF_ERROR(set_attr(api, plan, dnn::kPlanEngineConfig, dnn::kTypeBackendDescriptor,
                                   1, &cfg, "EXECUTION_PLAN"));
    HIBER_RETURN_IF_ERROR(finalize(api, plan, "EXECUTION_PLAN"));
    HIBER_ASSIGN_OR_RETURN(int64_t workspace, get_int64(api, plan, dnn::kPlanWorkspaceSize,
                                                        "EXECUTION_PLAN_WORKSPACE_SIZE"));
    if (workspace < 0)
      return error(ErrorCode::kUnknown, "the plan's workspace size is ", workspace);
    e.workspace_bytes = static_cast<uint64_t>(workspace);
    return Status();
  }();
  if (status.ok()) {
    e.supported = 1;
  } else {
    e.supported = 0;
    e.workspace_bytes = 0;
    e.numerical_notes = e.behavior_notes = 0;
    std::snprintf(e.why, sizeof e.why, "%s", status.message().c_str());
  }
  return e;
}

// cuDNN's heuristic ranking of `op_graph`'s engines (CUDNN_HEUR_MODE_INSTANT: the encoded graph
// carries no heuristic, and the client's mode is its own descriptor's): the global index of each
// engine config in CUDNN_ATTR_ENGINEHEUR_RESULTS, best first.
Result<std::vector<int64_t>> heuristic_order(const CudnnApi& api,
                                             cudnnBackendDescriptor_t op_graph) {
  Descriptors made(api);
  HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t heur, made.create(dnn::kEngineHeur));
  HIBER_RETURN_IF_ERROR(set_attr(api, heur, dnn::kEngineHeurOperationGraph,
                                 dnn::kTypeBackendDescriptor, 1, &op_graph, "ENGINEHEUR"));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_INSTANT;
  HIBER_RETURN_IF_ERROR(
      set_attr(api, heur, dnn::kEngineHeurMode, dnn::kTypeHeurMode, 1, &mode, "ENGINEHEUR"));
  HIBER_RETURN_IF_ERROR(finalize(api, heur, "ENGINEHEUR"));
  int64_t count = 0;
  HIBER_RETURN_IF_ERROR(
      api.check(api.pfn_cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS, count)"));
  if (count < 0 || count > 1024)
    return error(ErrorCode::kUnknown, "cuDNN's heuristic gave ", count, " results");
  std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
  for (auto& cfg : cfgs) {
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t made_cfg, made.create(dnn::kEngineCfg));
    cfg = made_cfg;
  }
  int64_t filled = 0;
  if (count > 0)
    HIBER_RETURN_IF_ERROR(api.check(api.pfn_cudnnBackendGetAttribute(
                                        heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &filled, cfgs.data()),
                                    "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)"));
  std::vector<int64_t> order;
  for (int64_t i = 0; i < std::min(filled, count); ++i) {
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t engine, made.create(dnn::kEngine));
    int64_t one = 0;
    HIBER_RETURN_IF_ERROR(api.check(
        api.pfn_cudnnBackendGetAttribute(cfgs[static_cast<size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one, &engine),
        "cudnnBackendGetAttribute(ENGINECFG_ENGINE)"));
    HIBER_ASSIGN_OR_RETURN(int64_t index,
                           get_int64(api, engine, dnn::kEngineGlobalIndex, "ENGINE_GLOBAL_INDEX"));
    order.push_back(index);
  }
  return order;
}

// Sets each engine's heuristic_rank from `order` (1 + its first position; 0 if absent).
void rank_engines(std::vector<dnn::EngineSupport>& engines, const std::vector<int64_t>& order) {
  uint32_t rank = 0;
  for (int64_t index : order) {
    ++rank;
    if (index < 0 || index >= static_cast<int64_t>(engines.size())) continue;
    dnn::EngineSupport& e = engines[static_cast<size_t>(index)];
    if (e.heuristic_rank == 0) e.heuristic_rank = rank;
  }
}

// ---- Legacy descriptors ----

// One legacy descriptor, destroyed with its scope.
template <typename T, auto CudnnApi::*kDestroy>
class Legacy {
 public:
  explicit Legacy(const CudnnApi& api) : api_(api) {}
  Legacy(const Legacy&) = delete;
  ~Legacy() {
    if (d_ != nullptr) {
      Status s = api_.check((api_.*kDestroy)(d_), "destroying a legacy cuDNN descriptor");
      LOG_IF(WARNING, !s.ok()) << s;
    }
  }
  T* out() { return &d_; }
  T get() const { return d_; }

 private:
  const CudnnApi& api_;
  T d_ = nullptr;
};
using TensorDesc = Legacy<cudnnTensorDescriptor_t, &CudnnApi::pfn_cudnnDestroyTensorDescriptor>;
using PoolingDesc = Legacy<cudnnPoolingDescriptor_t, &CudnnApi::pfn_cudnnDestroyPoolingDescriptor>;
using ActivationDesc =
    Legacy<cudnnActivationDescriptor_t, &CudnnApi::pfn_cudnnDestroyActivationDescriptor>;

Result<int> as_int(int64_t value, std::string_view what) {
  if (value < INT_MIN || value > INT_MAX)
    return error(ErrorCode::kNotSupported, "cuDNN: ", what, " ", value,
                 " does not fit the legacy API's int");
  return static_cast<int>(value);
}

Status make_tensor(const CudnnApi& api, const dnn::TensorShape& shape, TensorDesc& out,
                   std::string_view what) {
  int dims[dnn::kMaxDims] = {}, strides[dnn::kMaxDims] = {};
  for (int i = 0; i < shape.rank && i < dnn::kMaxDims; ++i) {
    HIBER_ASSIGN_OR_RETURN(dims[i], as_int(shape.dims[i], str_cat(what, " dimension")));
    HIBER_ASSIGN_OR_RETURN(strides[i], as_int(shape.strides[i], str_cat(what, " stride")));
  }
  HIBER_RETURN_IF_ERROR(
      api.check(api.pfn_cudnnCreateTensorDescriptor(out.out()), "cudnnCreateTensorDescriptor"));
  return api.check(
      api.pfn_cudnnSetTensorNdDescriptor(out.get(), static_cast<cudnnDataType_t>(shape.data_type),
                                         shape.rank, dims, strides),
      str_cat("cudnnSetTensorNdDescriptor(", what, ")"));
}

// alpha and beta as cuDNN reads them: double for double data, float otherwise.
struct Scaling {
  Scaling(double a, double b, int32_t data_type) : as_double(data_type == dnn::kDouble) {
    f[0] = static_cast<float>(a);
    f[1] = static_cast<float>(b);
    d[0] = a;
    d[1] = b;
  }
  const void* alpha() const { return as_double ? static_cast<const void*>(&d[0]) : &f[0]; }
  const void* beta() const { return as_double ? static_cast<const void*>(&d[1]) : &f[1]; }
  bool as_double;
  float f[2];
  double d[2];
};

template <typename T = void>
T* device(uint64_t address) {
  return reinterpret_cast<T*>(address);
}

Status batch_norm(const CudnnApi& api, cudnnHandle_t h, const dnn::BatchNormInference& op) {
  TensorDesc x(api), y(api), bn(api);
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.x, x, "x"));
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.y, y, "y"));
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.bn, bn, "bnScaleBiasMeanVar"));
  const Scaling s(op.alpha, op.beta, op.x.data_type);
  return api.check(api.pfn_cudnnBatchNormalizationForwardInference(
                       h, static_cast<cudnnBatchNormMode_t>(op.mode), s.alpha(), s.beta(), x.get(),
                       device(op.x_ptr), y.get(), device(op.y_ptr), bn.get(), device(op.scale),
                       device(op.bias), device(op.mean), device(op.variance), op.epsilon),
                   "cudnnBatchNormalizationForwardInference");
}

Status pooling(const CudnnApi& api, cudnnHandle_t h, const dnn::Pooling& op) {
  TensorDesc x(api), y(api);
  PoolingDesc p(api);
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.x, x, "x"));
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.y, y, "y"));
  int window[dnn::kMaxSpatial] = {}, pad[dnn::kMaxSpatial] = {}, stride[dnn::kMaxSpatial] = {};
  for (int i = 0; i < op.spatial && i < dnn::kMaxSpatial; ++i) {
    HIBER_ASSIGN_OR_RETURN(window[i], as_int(op.window[i], "pooling window"));
    HIBER_ASSIGN_OR_RETURN(pad[i], as_int(op.pad[i], "pooling padding"));
    HIBER_ASSIGN_OR_RETURN(stride[i], as_int(op.stride[i], "pooling stride"));
  }
  HIBER_RETURN_IF_ERROR(
      api.check(api.pfn_cudnnCreatePoolingDescriptor(p.out()), "cudnnCreatePoolingDescriptor"));
  HIBER_RETURN_IF_ERROR(api.check(
      api.pfn_cudnnSetPoolingNdDescriptor(p.get(), static_cast<cudnnPoolingMode_t>(op.mode),
                                          static_cast<cudnnNanPropagation_t>(op.nan_propagation),
                                          op.spatial, window, pad, stride),
      "cudnnSetPoolingNdDescriptor"));
  const Scaling s(op.alpha, op.beta, op.x.data_type);
  return api.check(api.pfn_cudnnPoolingForward(h, p.get(), s.alpha(), x.get(), device(op.x_ptr),
                                               s.beta(), y.get(), device(op.y_ptr)),
                   "cudnnPoolingForward");
}

Status activation(const CudnnApi& api, cudnnHandle_t h, const dnn::Activation& op) {
  TensorDesc x(api), y(api);
  ActivationDesc a(api);
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.x, x, "x"));
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.y, y, "y"));
  HIBER_RETURN_IF_ERROR(api.check(api.pfn_cudnnCreateActivationDescriptor(a.out()),
                                  "cudnnCreateActivationDescriptor"));
  HIBER_RETURN_IF_ERROR(api.check(
      api.pfn_cudnnSetActivationDescriptor(a.get(), static_cast<cudnnActivationMode_t>(op.mode),
                                           static_cast<cudnnNanPropagation_t>(op.nan_propagation),
                                           op.coef),
      "cudnnSetActivationDescriptor"));
  const Scaling s(op.alpha, op.beta, op.x.data_type);
  return api.check(api.pfn_cudnnActivationForward(h, a.get(), s.alpha(), x.get(), device(op.x_ptr),
                                                  s.beta(), y.get(), device(op.y_ptr)),
                   "cudnnActivationForward");
}

Status softmax(const CudnnApi& api, cudnnHandle_t h, const dnn::Softmax& op) {
  TensorDesc x(api), y(api);
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.x, x, "x"));
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.y, y, "y"));
  const Scaling s(op.alpha, op.beta, op.x.data_type);
  return api.check(
      api.pfn_cudnnSoftmaxForward(h, static_cast<cudnnSoftmaxAlgorithm_t>(op.algorithm),
                                  static_cast<cudnnSoftmaxMode_t>(op.mode), s.alpha(), x.get(),
                                  device(op.x_ptr), s.beta(), y.get(), device(op.y_ptr)),
      "cudnnSoftmaxForward");
}

Status add_tensor(const CudnnApi& api, cudnnHandle_t h, const dnn::AddTensor& op) {
  TensorDesc a(api), c(api);
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.a, a, "A"));
  HIBER_RETURN_IF_ERROR(make_tensor(api, op.c, c, "C"));
  const Scaling s(op.alpha, op.beta, op.c.data_type);
  return api.check(api.pfn_cudnnAddTensor(h, s.alpha(), a.get(), device(op.a_ptr), s.beta(),
                                          c.get(), device(op.c_ptr)),
                   "cudnnAddTensor");
}

// ---- The backend ----

// A real execution plan and every descriptor it was built from, on one GPU.
struct RealPlan {
  explicit RealPlan(Descriptors d) : descriptors(std::move(d)) {}
  Descriptors descriptors;  // the plan is the last
  uint64_t workspace_bytes = 0;
};

struct PlanKey {
  uint64_t owner = 0;
  uint64_t graph_id = 0;
  uint64_t handle = 0;
  Context context;  // of the handle the plan was built with
  friend auto operator<=>(const PlanKey&, const PlanKey&) = default;
};

class CudaDnnBackend final : public LibraryBackend {
 public:
  CudaDnnBackend(const CudaContexts& contexts, const CudaLibraryOptions& options)
      : contexts_(contexts), cudnn_(options, cuda_abi::kCudnnSoname), handles_(contexts) {}

  ~CudaDnnBackend() override {
    // The plans go before the handles they were built with (handles_ is destroyed after this).
    destroy_plans([](const PlanKey&) { return true; });
  }

  Status check_available() override {
    Result<const CudnnApi*> api = cudnn_.get();
    if (!api.ok()) return api.status();
    handles_.set_api(*api);
    api_.store(*api);
    return Status();
  }

  Status run(Stream stream, const LibraryCall& call) override {
    HIBER_RETURN_IF_ERROR(check_available());
    const CudnnApi& api = *api_.load();
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    using Bytes = std::span<const std::byte>;
    return library_ops::dispatch<Status, library_ops::Library::kDnn, library_ops::Kind::kCall>(
        call.op, call.args, "hiberd's CUDA backend",
        library_ops::Handlers{
            [&](OpTag<LibraryOp::kDnnDefineGraph>, Bytes) { return define_graph(call); },
            [&](OpTag<LibraryOp::kDnnExecute>, Bytes) { return execute(api, stream, call); },
            [&](OpTag<LibraryOp::kDnnBatchNormInference>, const dnn::BatchNormInference& op) {
              return legacy(api, stream, call, op, batch_norm);
            },
            [&](OpTag<LibraryOp::kDnnPooling>, const dnn::Pooling& op) {
              return legacy(api, stream, call, op, pooling);
            },
            [&](OpTag<LibraryOp::kDnnActivation>, const dnn::Activation& op) {
              return legacy(api, stream, call, op, activation);
            },
            [&](OpTag<LibraryOp::kDnnSoftmax>, const dnn::Softmax& op) {
              return legacy(api, stream, call, op, softmax);
            },
            [&](OpTag<LibraryOp::kDnnAddTensor>, const dnn::AddTensor& op) {
              return legacy(api, stream, call, op, add_tensor);
            }});
  }

  Result<std::vector<std::byte>> answer(Context context, const LibraryCall& call) override {
    HIBER_RETURN_IF_ERROR(check_available());
    const CudnnApi& api = *api_.load();
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    return library_ops::dispatch<Result<std::vector<std::byte>>, library_ops::Library::kDnn,
                                 library_ops::Kind::kQuery>(
        call.op, call.args, "hiberd's CUDA backend",
        library_ops::Handlers{
            [&](OpTag<LibraryOp::kDnnFinalize>, std::span<const std::byte> bytes) {
              return engines_of(api, context, call, bytes);
            }});
  }

  // kDnnFinalize: every engine of the operation graph, with its support, notes and workspace.
  Result<std::vector<std::byte>> engines_of(const CudnnApi& api, Context context,
                                            const LibraryCall& call,
                                            std::span<const std::byte> bytes) {
    HIBER_ASSIGN_OR_RETURN(dnn::Graph graph, dnn::decode_graph(bytes));
    HIBER_RETURN_IF_ERROR(check_rebuildable(graph, dnn::kOperationGraph));
    HIBER_RETURN_IF_ERROR(contexts_.use_context(context));
    HIBER_ASSIGN_OR_RETURN(auto entry,
                           handles_.get(api, {call.owner, call.handle.value(), context}));
    MutexLock lock(entry->mutex);
    HIBER_ASSIGN_OR_RETURN(Descriptors made, rebuild(api, graph, entry->raw));
    HIBER_ASSIGN_OR_RETURN(int64_t count,
                           get_int64(api, made.back(), dnn::kOperationGraphEngineGlobalCount,
                                     "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT"));
    // decode_finalize_answer takes at most 1024; no cuDNN release has come near.
    if (count < 0 || count > 1024)
      return error(ErrorCode::kNotSupported, "cuDNN reports ", count,
                   " engines for an operation graph; the answer carries at most 1024");
    std::vector<dnn::EngineSupport> engines;
    engines.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      engines.push_back(describe_engine(api, entry->raw, made.back(), i));
    // The heuristic's order travels as ranks: the entries stay in index order, which is how the
    // client finds an engine. Without it the client's order is index order.
    Result<std::vector<int64_t>> order = heuristic_order(api, made.back());
    if (order.ok()) {
      rank_engines(engines, *order);
    } else if (!heuristic_failure_logged_.exchange(true)) {
      LOG(WARNING) << "cuDNN's engine heuristic failed, so engine heuristics through hiberd "
                      "answer in global-index order (logged once): "
                   << order.status();
    }
    return dnn::encode_finalize_answer(engines);
  }

  void release(uint64_t owner, std::optional<library_ops::LibraryHandle> handle) override {
    destroy_plans([&](const PlanKey& key) {
      return key.owner == owner && (!handle.has_value() || key.handle == handle->value());
    });
    if (!handle.has_value()) {
      // Graphs belong to the session, not to a handle: they go when the session does.
      MutexLock lock(mu_);
      graphs_.erase(graphs_.lower_bound({owner, 0}), graphs_.upper_bound({owner, UINT64_MAX}));
    }
    handles_.release_if([&](const HandleKey& key) {
      return key.owner == owner && (!handle.has_value() || key.handle == handle->value());
    });
  }

  void forget_context(Context context) override {
    {
      MutexLock lock(mu_);
      std::erase_if(plans_, [&](auto& entry) {
        if (entry.first.context != context) return false;
        entry.second->descriptors.abandon();
        return true;
      });
    }
    handles_.forget_if([&](const HandleKey& key) { return key.context == context; });
  }

 private:
  template <typename Op, typename Run>
  Status legacy(const CudnnApi& api, Stream stream, const LibraryCall& call, const Op& op,
                Run run) {
    HIBER_RETURN_IF_ERROR(dnn::check_op(op));
    HIBER_ASSIGN_OR_RETURN(CUstream s, contexts_.use_stream(stream));
    HIBER_ASSIGN_OR_RETURN(
        auto entry,
        handles_.get(api, cuda_lib::handle_key(call.owner, call.handle.value(), stream)));
    MutexLock lock(entry->mutex);
    HIBER_RETURN_IF_ERROR(use_stream_on(api, entry->raw, entry->settings, s));
    return run(api, entry->raw, op);
  }

  Status define_graph(const LibraryCall& call) {
    HIBER_ASSIGN_OR_RETURN(auto defined, dnn::decode_define_graph(call.args));
    auto& [id, graph] = defined;
    HIBER_RETURN_IF_ERROR(check_rebuildable(graph, dnn::kExecutionPlan));
    // Only plans whose operations Hiber interprets run: the session's checks bound their
    // operands by the same reading.
    HIBER_RETURN_IF_ERROR(dnn::interpret_plan(graph).status());
    MutexLock lock(mu_);
    auto [it, inserted] = graphs_.emplace(std::pair{call.owner, id},
                                          std::make_shared<const dnn::Graph>(std::move(graph)));
    if (!inserted)
      return error(ErrorCode::kInvalidValue, "cuDNN define graph: graph id ", id,
                   " is already defined in this session");
    return Status();
  }

  Status execute(const CudnnApi& api, Stream stream, const LibraryCall& call) {
    HIBER_ASSIGN_OR_RETURN(dnn::Execute e, dnn::decode_execute(call.args));
    std::shared_ptr<const dnn::Graph> graph;
    {
      MutexLock lock(mu_);
      if (auto it = graphs_.find({call.owner, e.header.graph_id}); it != graphs_.end())
        graph = it->second;
    }
    if (graph == nullptr)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: graph ", e.header.graph_id,
                   " was not defined by this session");
    HIBER_ASSIGN_OR_RETURN(CUstream s, contexts_.use_stream(stream));
    HIBER_ASSIGN_OR_RETURN(
        auto entry,
        handles_.get(api, cuda_lib::handle_key(call.owner, call.handle.value(), stream)));
    MutexLock lock(entry->mutex);
    const PlanKey key{call.owner, e.header.graph_id, call.handle.value(),
                      Context{stream.context, stream.gpu}};
    HIBER_ASSIGN_OR_RETURN(std::shared_ptr<RealPlan> plan, plan_for(api, key, entry->raw, *graph));
    if (plan->workspace_bytes > e.header.workspace_bytes)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: graph ", e.header.graph_id,
                   "'s plan needs ", plan->workspace_bytes, " bytes of workspace on GPU ",
                   stream.gpu, ", the call brought ", e.header.workspace_bytes);
    HIBER_RETURN_IF_ERROR(use_stream_on(api, entry->raw, entry->settings, s));

    std::vector<int64_t> uids;
    std::vector<void*> pointers;
    uids.reserve(e.entries.size());
    pointers.reserve(e.entries.size());
    for (const dnn::VariantEntry& v : e.entries) {
      uids.push_back(v.uid);
      pointers.push_back(device(v.ptr));
    }
    // A by-value tensor's pointer is a host address, read by cudnnBackendExecute: the value the
    // client sent, alive in `e` until the call returns.
    for (dnn::ByValueEntry& v : e.by_value) {
      uids.push_back(v.uid);
      pointers.push_back(v.value);
    }
    void* workspace = device(e.header.workspace);
    const auto n = static_cast<int64_t>(uids.size());
    Descriptors pack(api);
    HIBER_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t vp, pack.create(dnn::kVariantPack));
    HIBER_RETURN_IF_ERROR(set_attr(api, vp, dnn::kVariantPackUniqueIds, dnn::kTypeInt64, n,
                                   uids.data(), "VARIANT_PACK"));
    HIBER_RETURN_IF_ERROR(set_attr(api, vp, dnn::kVariantPackDataPointers, dnn::kTypeVoidPtr, n,
                                   pointers.data(), "VARIANT_PACK"));
    HIBER_RETURN_IF_ERROR(set_attr(api, vp, dnn::kVariantPackWorkspace, dnn::kTypeVoidPtr, 1,
                                   &workspace, "VARIANT_PACK"));
    HIBER_RETURN_IF_ERROR(finalize(api, vp, "VARIANT_PACK"));
    return api.check(api.pfn_cudnnBackendExecute(entry->raw, plan->descriptors.back(), vp),
                     "cudnnBackendExecute");
  }

  // The real plan for `key`, built on first use with the GPU's context current and `handle`
  // (the caller holds the handle's mutex, so two threads never build the same plan).
  Result<std::shared_ptr<RealPlan>> plan_for(const CudnnApi& api, const PlanKey& key,
                                             cudnnHandle_t handle, const dnn::Graph& graph) {
    {
      MutexLock lock(mu_);
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    Result<Descriptors> made = rebuild(api, graph, handle);
    if (!made.ok())
      return made.status().with_context(
          str_cat("building graph ", key.graph_id, "'s execution plan on GPU ", key.context.gpu));
    auto plan = std::make_shared<RealPlan>(std::move(made).value());
    HIBER_ASSIGN_OR_RETURN(int64_t workspace,
                           get_int64(api, plan->descriptors.back(), dnn::kPlanWorkspaceSize,
                                     "EXECUTION_PLAN_WORKSPACE_SIZE"));
    plan->workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(workspace, 0));
    VLOG(1) << "cuDNN plan for session " << key.owner << " graph " << key.graph_id
            << " built on GPU " << key.context.gpu << " (workspace " << plan->workspace_bytes
            << " bytes)";
    MutexLock lock(mu_);
    plans_[key] = plan;
    return plan;
  }

  // Destroys the plans whose key matches, each in its context once the context's work is done.
  template <typename Match>
  void destroy_plans(Match&& match) {
    std::vector<std::pair<PlanKey, std::shared_ptr<RealPlan>>> gone;
    {
      MutexLock lock(mu_);
      for (auto it = plans_.begin(); it != plans_.end();) {
        if (match(it->first)) {
          gone.emplace_back(it->first, std::move(it->second));
          it = plans_.erase(it);
        } else {
          ++it;
        }
      }
    }
    std::set<Context> synchronized;
    for (auto& [key, plan] : gone) {
      // synchronize_context makes the context current too.
      Status status = synchronized.insert(key.context).second
                          ? contexts_.synchronize_context(key.context)
                          : contexts_.use_context(key.context);
      LOG_IF(WARNING, !status.ok()) << "before destroying cuDNN plans of session " << key.owner
                                    << " on GPU " << key.context.gpu << ": " << status;
      plan->descriptors.destroy();
    }
  }

  const CudaContexts& contexts_;
  LazyLibrary<CudnnApi> cudnn_;
  HandleTable<CudnnApi, CudnnTraits> handles_;
  std::atomic<const CudnnApi*> api_{nullptr};  // set once the library is loaded
  std::atomic<bool> heuristic_failure_logged_{false};
  Mutex mu_;
  // Defined graphs by (owner, graph id): the client's encoded plans, decoded.
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const dnn::Graph>> graphs_
      GUARDED_BY(mu_);
  // Real plans by (owner, graph id, client handle, GPU).
  std::map<PlanKey, std::shared_ptr<RealPlan>> plans_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<LibraryBackend> make_cuda_dnn_backend(const CudaContexts& contexts,
                                                      const CudaLibraryOptions& options) {
  return std::make_unique<CudaDnnBackend>(contexts, options);
}

}  // namespace hiber::device
