// libhibercudnn.so: cuDNN's backend (graph) API, as the cudnn-frontend and PyTorch's Conv_v8 use
// it.
//
// Descriptors are proxies in the client: attribute bags (attribute name -> attribute type,
// elements), with descriptor-typed attributes holding references to the other proxies. What needs
// no GPU finalizes here, with cuDNN's checks (library_ops::dnn::check_finalizable): tensors,
// convolutions, matmuls, pointwise and reduction descriptors, their operations, norm forward
// operations and operation graphs, variant packs.
// What depends on the GPU asks hiberd once per operation graph (kDnnFinalize, a synchronous
// query whose answer lists every engine of the device: supported or why not, workspace, notes),
// cached by the encoded graph, so a second identical graph costs no round trip: engine
// heuristics, engines, engine configs and execution plans finalize from that answer.
// cudnnBackendExecute is one asynchronous library call naming the plan's graph id and carrying
// the values of its by-value tensors (a scale, an epsilon: host memory of this process); the plan's
// graph travels once, before its first execution (kDnnDefineGraph), and plans with the same
// encoded graph share one id.
//
// One mutex guards every proxy and cache: cuDNN's descriptors are not meant for concurrent
// mutation anyway, and the calls are short, except a first finalize, which waits for hiberd.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "client_shim/cudnn_common.h"
#include "library_ops/dnn_ops.h"

namespace {

namespace wdnn = hiber::library_ops::dnn;

// The wire's numbers are cuDNN's.
static_assert(int{wdnn::kKnobChoice} == int{CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR});
static_assert(int{wdnn::kKnobInfo} == int{CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR});
static_assert(int{wdnn::kKnobChoiceKnobType} == int{CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE});
static_assert(int{wdnn::kKnobChoiceKnobValue} == int{CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE});
static_assert(int{wdnn::kTypeKnobType} == int{CUDNN_TYPE_KNOB_TYPE});
using namespace hiber::shim::dnn;  // NOLINT
using hiber::ErrorCode;
using hiber::Status;

struct Desc;
using DescPtr = std::shared_ptr<Desc>;

struct Value {
  int32_t type = 0;  // cudnnBackendAttributeType_t
  int64_t count = 0;
  std::vector<std::byte> bytes;  // not for kTypeBackendDescriptor
  std::vector<DescPtr> refs;     // kTypeBackendDescriptor
};

// What hiberd said about an operation graph: every engine of its device, or why it refused the
// graph.
struct Support {
  Status status;
  std::vector<wdnn::EngineSupport> engines;
};

struct Desc {
  int32_t type = 0;
  std::map<int32_t, Value> attrs;
  bool finalized = false;
  // ENGINE, ENGINECFG, EXECUTION_PLAN: the engine, as hiberd described it.
  wdnn::EngineSupport engine;
  // EXECUTION_PLAN: its encoded graph, operations and (once defined) graph id.
  std::shared_ptr<const std::vector<std::byte>> plan_graph;
  std::shared_ptr<const wdnn::OpGraph> plan_ops;
  uint64_t graph_id = 0;
};

std::mutex mu;
// Live descriptors by the address the program holds (the Desc itself).
std::unordered_map<const void*, DescPtr>& live() {
  static auto* m = new std::unordered_map<const void*, DescPtr>();
  return *m;
}
// hiberd's answers by encoded operation graph; graph ids by encoded plan graph.
// (Keys are the bytes as a string: hashed, and free of GCC 12's false -Wstringop-overread on
// comparing vectors of bytes.)
std::unordered_map<std::string, std::shared_ptr<const Support>>& support_cache() {
  static auto* m = new std::unordered_map<std::string, std::shared_ptr<const Support>>();
  return *m;
}
std::unordered_map<std::string, uint64_t>& defined_graphs() {
  static auto* m = new std::unordered_map<std::string, uint64_t>();
  return *m;
}
std::string key_of(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}
uint64_t next_graph_id = 1;

DescPtr find(const void* p) {
  auto it = live().find(p);
  return it == live().end() ? nullptr : it->second;
}

bool supported_type(int32_t type) {
  switch (type) {
    case wdnn::kPointwise:
    case wdnn::kConvolution:
    case wdnn::kEngine:
    case wdnn::kEngineCfg:
    case wdnn::kEngineHeur:
    case wdnn::kExecutionPlan:
    case wdnn::kKnobChoice:
    case wdnn::kKnobInfo:
    case wdnn::kOpConvForward:
    case wdnn::kOpPointwise:
    case wdnn::kMatmul:
    case wdnn::kOpMatmul:
    case wdnn::kReduction:
    case wdnn::kOpReduction:
    case wdnn::kOpNormForward:
    case wdnn::kOperationGraph:
    case wdnn::kVariantPack:
    case wdnn::kTensor: return true;
  }
  return false;
}

const Value* attr(const Desc& d, int32_t name) {
  auto it = d.attrs.find(name);
  return it == d.attrs.end() ? nullptr : &it->second;
}

// The one descriptor an attribute references, if it is of `type`.
DescPtr ref(const Desc& d, int32_t name, int32_t type) {
  const Value* v = attr(d, name);
  if (v == nullptr || v->type != wdnn::kTypeBackendDescriptor || v->refs.size() != 1 ||
      v->refs[0]->type != type)
    return nullptr;
  return v->refs[0];
}

template <typename T>
bool scalar(const Desc& d, int32_t name, int32_t type, T* out) {
  const Value* v = attr(d, name);
  if (v == nullptr || v->type != type || v->count != 1 || v->bytes.size() != sizeof(T))
    return false;
  std::memcpy(out, v->bytes.data(), sizeof(T));
  return true;
}

// ---- Encoding a descriptor graph: post-order from the root, handles and pointers left out ----
void collect(const DescPtr& d, std::vector<const Desc*>& order,
             std::map<const Desc*, uint64_t>& position) {
  if (position.contains(d.get())) return;
  for (const auto& [name, v] : d->attrs)
    for (const DescPtr& r : v.refs) collect(r, order, position);
  position[d.get()] = order.size();
  order.push_back(d.get());
}

wdnn::Graph graph_of(const DescPtr& root) {
  std::vector<const Desc*> order;
  std::map<const Desc*, uint64_t> position;
  collect(root, order, position);
  wdnn::Graph g;
  for (const Desc* d : order) {
    wdnn::Node node;
    node.type = d->type;
    for (const auto& [name, v] : d->attrs) {
      if (v.type == wdnn::kTypeHandle || v.type == wdnn::kTypeVoidPtr) continue;
      wdnn::Attr a;
      a.name = name;
      a.type = v.type;
      if (v.type == wdnn::kTypeBackendDescriptor) {
        for (const DescPtr& r : v.refs) {
          const uint64_t at = position.at(r.get());
          const auto* p = reinterpret_cast<const std::byte*>(&at);
          a.bytes.insert(a.bytes.end(), p, p + sizeof(at));
        }
      } else {
        a.bytes = v.bytes;
      }
      node.attrs.push_back(std::move(a));
    }
    g.nodes.push_back(std::move(node));
  }
  return g;
}

// hiberd's answer for an operation graph (cached by its encoding).
std::shared_ptr<const Support> support_of(const DescPtr& op_graph) {
  const std::vector<std::byte> encoded = wdnn::encode_graph(graph_of(op_graph));
  std::string key = key_of(encoded);
  if (auto it = support_cache().find(key); it != support_cache().end()) return it->second;
  auto support = std::make_shared<Support>();
  void* handle = nullptr;
  if (const Value* h = attr(*op_graph, wdnn::kOperationGraphHandle);
      h != nullptr && h->bytes.size() == sizeof(void*))
    std::memcpy(&handle, h->bytes.data(), sizeof(void*));
  auto obj = hiber::shim::library_handle(handle, hiber::library_ops::Library::kDnn);
  if (!obj.ok()) {
    support->status =
        hiber::error(ErrorCode::kInvalidValue,
                     "the operation graph's CUDNN_ATTR_OPERATIONGRAPH_HANDLE is not a "
                     "live cuDNN handle");
    return support;  // not cached: the program may set a good handle on a new graph
  }
  auto answer =
      hiber::shim::library_query(*obj, hiber::library_ops::LibraryOp::kDnnFinalize, encoded);
  if (answer.ok()) {
    auto engines = wdnn::decode_finalize_answer(*answer);
    if (engines.ok()) {
      support->engines = std::move(engines).value();
    } else {
      support->status = engines.status();
    }
  } else {
    support->status = answer.status();
  }
  // Answers that depend on the graph only are kept; a lost session is not an answer.
  const ErrorCode code = support->status.code();
  if (code == ErrorCode::kSuccess || code == ErrorCode::kNotSupported ||
      code == ErrorCode::kInvalidValue)
    support_cache().emplace(std::move(key), support);
  return support;
}

std::string engine_why(const wdnn::EngineSupport& e) {
  return std::string(e.why, strnlen(e.why, sizeof(e.why)));
}

// ---- Finalizing ----
cudnnStatus_t finalize_locally(const DescPtr& d) {
  Status checked = wdnn::check_finalizable(graph_of(d));
  if (!checked.ok()) return fail("cudnnBackendFinalize", checked);
  if (d->type == wdnn::kOperationGraph) {
    void* handle = nullptr;
    const Value* h = attr(*d, wdnn::kOperationGraphHandle);
    if (h == nullptr || h->bytes.size() != sizeof(void*))
      return bad_param("cudnnBackendFinalize",
                       "operation graph: CUDNN_ATTR_OPERATIONGRAPH_HANDLE is not set");
    std::memcpy(&handle, h->bytes.data(), sizeof(void*));
    if (handle_of(static_cast<cudnnHandle_t>(handle), "cudnnBackendFinalize") == nullptr)
      return CUDNN_STATUS_BAD_PARAM;
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine(const DescPtr& d) {
  constexpr const char* kCall = "cudnnBackendFinalize(ENGINE)";
  DescPtr graph = ref(*d, wdnn::kEngineOperationGraph, wdnn::kOperationGraph);
  int64_t index = 0;
  if (graph == nullptr || !scalar(*d, wdnn::kEngineGlobalIndex, wdnn::kTypeInt64, &index))
    return bad_param(kCall,
                     "CUDNN_ATTR_ENGINE_OPERATION_GRAPH and CUDNN_ATTR_ENGINE_GLOBAL_INDEX "
                     "must be set");
  auto support = support_of(graph);
  if (!support->status.ok()) return fail(kCall, support->status);
  if (index < 0 || index >= static_cast<int64_t>(support->engines.size()))
    return not_supported(kCall, "engine " + std::to_string(index) +
                                    " does not exist: hiberd's "
                                    "device has " +
                                    std::to_string(support->engines.size()) + " engines");
  const wdnn::EngineSupport& e = support->engines[index];
  if (!e.supported)
    return not_supported(kCall, "engine " + std::to_string(index) +
                                    " does not run this operation graph: " + engine_why(e));
  d->engine = e;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize(const DescPtr& d) {
  switch (d->type) {
    case wdnn::kTensor:
    case wdnn::kConvolution:
    case wdnn::kPointwise:
    case wdnn::kOpConvForward:
    case wdnn::kOpPointwise:
    case wdnn::kMatmul:
    case wdnn::kOpMatmul:
    case wdnn::kReduction:
    case wdnn::kOpReduction:
    case wdnn::kOpNormForward:
    case wdnn::kOperationGraph: return finalize_locally(d);
    case wdnn::kEngine: return finalize_engine(d);
    case wdnn::kEngineCfg: {
      DescPtr engine = ref(*d, wdnn::kEngineCfgEngine, wdnn::kEngine);
      if (engine == nullptr)
        return bad_param("cudnnBackendFinalize(ENGINECFG)",
                         "CUDNN_ATTR_ENGINECFG_ENGINE is not set");
      if (const Value* knobs = attr(*d, wdnn::kEngineCfgKnobChoices);
          knobs != nullptr && knobs->count > 0)
        return not_supported("cudnnBackendFinalize(ENGINECFG)",
                             "knob choices: Hiber's engines have no knobs");
      d->engine = engine->engine;
      return CUDNN_STATUS_SUCCESS;
    }
    case wdnn::kEngineHeur: {
      constexpr const char* kCall = "cudnnBackendFinalize(ENGINEHEUR)";
      DescPtr graph = ref(*d, wdnn::kEngineHeurOperationGraph, wdnn::kOperationGraph);
      int32_t mode = 0;
      if (graph == nullptr || !scalar(*d, wdnn::kEngineHeurMode, wdnn::kTypeHeurMode, &mode))
        return bad_param(kCall,
                         "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH and "
                         "CUDNN_ATTR_ENGINEHEUR_MODE must be set");
      auto support = support_of(graph);
      if (!support->status.ok()) return fail(kCall, support->status);
      return CUDNN_STATUS_SUCCESS;
    }
    case wdnn::kExecutionPlan: {
      constexpr const char* kCall = "cudnnBackendFinalize(EXECUTION_PLAN)";
      // CUDNN_ATTR_EXECUTION_PLAN_HANDLE is deprecated in cuDNN 9 and cudnn-frontend 1.x (so
      // PyTorch) no longer sets it: hiberd builds the plan on its own handle either way.
      DescPtr cfg = ref(*d, wdnn::kPlanEngineConfig, wdnn::kEngineCfg);
      if (cfg == nullptr)
        return bad_param(kCall, "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG must be set");
      wdnn::Graph g = graph_of(d);
      auto plan = wdnn::interpret_plan(g);
      if (!plan.ok()) return fail(kCall, plan.status());
      d->engine = cfg->engine;
      d->plan_graph = std::make_shared<const std::vector<std::byte>>(wdnn::encode_graph(g));
      d->plan_ops = std::make_shared<const wdnn::OpGraph>(std::move(plan->graph));
      return CUDNN_STATUS_SUCCESS;
    }
    case wdnn::kKnobChoice: {
      // A choice is finalized on its own (cuDNN checks the value against the engine only when an
      // engine config holding it is finalized, and Hiber refuses every config with choices).
      // An empty one finalizes too, as in cuDNN 9.19 (seen on an H200); a half-set one does not.
      int32_t knob = 0;
      int64_t value = 0;
      const bool has_type = scalar(*d, wdnn::kKnobChoiceKnobType, wdnn::kTypeKnobType, &knob);
      const bool has_value = scalar(*d, wdnn::kKnobChoiceKnobValue, wdnn::kTypeInt64, &value);
      if (has_type != has_value)
        return bad_param("cudnnBackendFinalize(KNOB_CHOICE)",
                         "CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE (KNOB_TYPE) and "
                         "CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE (INT64) are set together, or neither");
      return CUDNN_STATUS_SUCCESS;
    }
    case wdnn::kKnobInfo:
      // Knob infos are read-only: CUDNN_ATTR_ENGINE_KNOB_INFO fills them, and Hiber's engines
      // have none, so a program never gets a filled one.
      return bad_param("cudnnBackendFinalize(KNOB_INFO)",
                       "a knob info descriptor is read-only (filled by "
                       "CUDNN_ATTR_ENGINE_KNOB_INFO), not finalized by the program");
    case wdnn::kVariantPack: {
      const Value* uids = attr(*d, wdnn::kVariantPackUniqueIds);
      const Value* ptrs = attr(*d, wdnn::kVariantPackDataPointers);
      if (uids == nullptr || ptrs == nullptr || uids->type != wdnn::kTypeInt64 ||
          ptrs->type != wdnn::kTypeVoidPtr || uids->count != ptrs->count)
        return bad_param("cudnnBackendFinalize(VARIANT_PACK)",
                         "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS (INT64) and "
                         "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS (VOID_PTR) must be set, as many "
                         "of each");
      return CUDNN_STATUS_SUCCESS;
    }
  }
  return not_supported("cudnnBackendFinalize",
                       wdnn::descriptor_type_name(d->type) + " is not supported by Hiber");
}

// ---- Getting attributes ----
// Copies `values` (of `type`) out as cudnnBackendGetAttribute does.
cudnnStatus_t give(int32_t type, const void* values, int64_t count, int64_t requested,
                   int64_t* count_out, void* out) {
  if (count_out != nullptr) *count_out = count;
  const size_t each = wdnn::attr_element_bytes(type);
  if (out != nullptr && requested > 0 && count > 0)
    std::memcpy(out, values, each * static_cast<size_t>(std::min(count, requested)));
  return CUDNN_STATUS_SUCCESS;
}

// Fills the program's descriptor `target` with a copy of `source`.
cudnnStatus_t fill(void* target, const Desc& source, const char* what) {
  DescPtr t = find(target);
  if (t == nullptr)
    return bad_param("cudnnBackendGetAttribute", std::string(what) +
                                                     ": the array holds a descriptor this library "
                                                     "did not create");
  if (t->type != source.type)
    return bad_param("cudnnBackendGetAttribute",
                     std::string(what) + ": the array's descriptor is a " +
                         wdnn::descriptor_type_name(t->type) + ", not a " +
                         wdnn::descriptor_type_name(source.type));
  *t = source;
  return CUDNN_STATUS_SUCCESS;
}

std::vector<int32_t> notes(uint32_t mask) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < 32; ++i)
    if (mask & (1u << i)) out.push_back(i);
  return out;
}

cudnnStatus_t get_attribute(const DescPtr& d, int32_t name, int32_t type, int64_t requested,
                            int64_t* count, void* out) {
  constexpr const char* kCall = "cudnnBackendGetAttribute";
  auto want = [&](int32_t t) { return type == t; };
  // Computed attributes first.
  switch (name) {
    case wdnn::kOperationGraphEngineGlobalCount: {
      if (d->type != wdnn::kOperationGraph || !want(wdnn::kTypeInt64)) break;
      if (!d->finalized) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
      auto support = support_of(d);
      if (!support->status.ok()) return fail(kCall, support->status);
      const int64_t n = static_cast<int64_t>(support->engines.size());
      return give(type, &n, 1, requested, count, out);
    }
    case wdnn::kEngineHeurResults: {
      if (d->type != wdnn::kEngineHeur || !want(wdnn::kTypeBackendDescriptor)) break;
      if (!d->finalized) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
      DescPtr graph = ref(*d, wdnn::kEngineHeurOperationGraph, wdnn::kOperationGraph);
      auto support = support_of(graph);
      if (!support->status.ok()) return fail(kCall, support->status);
      // cuDNN's own heuristic order (hiberd ran it on the real graph), then the engines it did
      // not return in index order. One ranking serves every mode: hiberd runs INSTANT.
      const std::vector<const wdnn::EngineSupport*> results =
          wdnn::heuristic_results(support->engines);
      if (count != nullptr) *count = static_cast<int64_t>(results.size());
      auto** targets = static_cast<void**>(out);
      for (int64_t i = 0; out != nullptr && i < std::min<int64_t>(requested, results.size()); ++i) {
        // The engine config the program created receives an engine of its own.
        auto engine = std::make_shared<Desc>();
        engine->type = wdnn::kEngine;
        engine->attrs[wdnn::kEngineOperationGraph] = {wdnn::kTypeBackendDescriptor, 1, {}, {graph}};
        Value index{wdnn::kTypeInt64, 1, std::vector<std::byte>(8), {}};
        std::memcpy(index.bytes.data(), &results[i]->global_index, 8);
        engine->attrs[wdnn::kEngineGlobalIndex] = index;
        engine->engine = *results[i];
        engine->finalized = true;
        Desc cfg;
        cfg.type = wdnn::kEngineCfg;
        cfg.attrs[wdnn::kEngineCfgEngine] = {wdnn::kTypeBackendDescriptor, 1, {}, {engine}};
        cfg.engine = *results[i];
        cfg.finalized = true;
        if (cudnnStatus_t s = fill(targets[i], cfg, "CUDNN_ATTR_ENGINEHEUR_RESULTS");
            s != CUDNN_STATUS_SUCCESS)
          return s;
      }
      return CUDNN_STATUS_SUCCESS;
    }
    case wdnn::kEngineNumericalNote:
    case wdnn::kEngineBehaviorNote: {
      if (d->type != wdnn::kEngine) break;
      if (!d->finalized) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
      const bool numerical = name == wdnn::kEngineNumericalNote;
      if (!want(numerical ? wdnn::kTypeNumericalNote : wdnn::kTypeBehaviorNote)) break;
      auto list = notes(numerical ? d->engine.numerical_notes : d->engine.behavior_notes);
      return give(type, list.data(), static_cast<int64_t>(list.size()), requested, count, out);
    }
    case wdnn::kEngineKnobInfo:
    case wdnn::kEngineLayoutInfo:
      if (d->type != wdnn::kEngine) break;
      // Hiber's engines have no knobs and no layout requirements.
      return give(type, nullptr, 0, requested, count, out);
    case wdnn::kEngineCfgWorkspaceSize:
    case wdnn::kPlanWorkspaceSize: {
      if ((d->type != wdnn::kEngineCfg && d->type != wdnn::kExecutionPlan) ||
          !want(wdnn::kTypeInt64))
        break;
      if (!d->finalized) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
      const int64_t bytes = static_cast<int64_t>(d->engine.workspace_bytes);
      return give(type, &bytes, 1, requested, count, out);
    }
    case wdnn::kEngineCfgKnobChoices:
      if (d->type != wdnn::kEngineCfg || attr(*d, name) != nullptr) break;
      return give(type, nullptr, 0, requested, count, out);
    case wdnn::kPlanComputedIntermediateUids:
    case wdnn::kPlanRunOnlyIntermediateUids:
      if (d->type != wdnn::kExecutionPlan || attr(*d, name) != nullptr) break;
      return give(type, nullptr, 0, requested, count, out);
    case wdnn::kPlanJson: {
      if (d->type != wdnn::kExecutionPlan || !want(wdnn::kTypeChar)) break;
      if (!d->finalized) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
      // The plan's name comes from the engine's global index, as cuDNN's does.
      const std::string json =
          "{\"engine\":" + std::to_string(d->engine.global_index) + ",\"knobs\":[],\"hiber\":true}";
      return give(type, json.c_str(), static_cast<int64_t>(json.size() + 1), requested, count, out);
    }
    default: break;
  }
  const Value* v = attr(*d, name);
  if (v == nullptr)
    return bad_param(kCall, wdnn::descriptor_type_name(d->type) + ": attribute " +
                                std::to_string(name) + " is not set");
  if (v->type != type)
    return fail(
        kCall, hiber::error(ErrorCode::kInvalidValue, wdnn::descriptor_type_name(d->type),
                            ": attribute ", name, " has attribute type ", v->type, ", not ", type));
  if (type != wdnn::kTypeBackendDescriptor)
    return give(type, v->bytes.data(), v->count, requested, count, out);
  if (count != nullptr) *count = v->count;
  auto** targets = static_cast<void**>(out);
  for (int64_t i = 0; out != nullptr && i < std::min(requested, v->count); ++i)
    if (cudnnStatus_t s = fill(targets[i], *v->refs[i], "a descriptor attribute");
        s != CUDNN_STATUS_SUCCESS)
      return s;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t hiber_entry::cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                                        cudnnBackendDescriptor_t* descriptor) {
  if (descriptor == nullptr) return bad_param("cudnnBackendCreateDescriptor", "descriptor is NULL");
  if (!supported_type(type))
    return not_supported("cudnnBackendCreateDescriptor", wdnn::descriptor_type_name(type) +
                                                             " (type " + std::to_string(type) +
                                                             ") is not supported by Hiber");
  auto d = std::make_shared<Desc>();
  d->type = type;
  std::lock_guard lock(mu);
  live().emplace(d.get(), d);
  *descriptor = reinterpret_cast<cudnnBackendDescriptor_t>(d.get());
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard lock(mu);
  // Other descriptors may still reference it: they keep their copy alive.
  if (live().erase(descriptor) == 0)
    return bad_param("cudnnBackendDestroyDescriptor", "not a live backend descriptor");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard lock(mu);
  DescPtr d = find(descriptor);
  if (d == nullptr) return bad_param("cudnnBackendInitialize", "not a live backend descriptor");
  const int32_t type = d->type;
  *d = Desc();
  d->type = type;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                                    cudnnBackendAttributeName_t name,
                                                    cudnnBackendAttributeType_t type, int64_t count,
                                                    const void* elements) {
  constexpr const char* kCall = "cudnnBackendSetAttribute";
  std::lock_guard lock(mu);
  DescPtr d = find(descriptor);
  if (d == nullptr) return bad_param(kCall, "not a live backend descriptor");
  if (d->finalized)
    return bad_param(kCall, wdnn::descriptor_type_name(d->type) + " is already finalized");
  const size_t each = wdnn::attr_element_bytes(type);
  if (each == 0)
    return not_supported(
        kCall, "attribute type " + std::to_string(type) + " of attribute " + std::to_string(name));
  if (count < 0 || count > static_cast<int64_t>(wdnn::kMaxAttrElements) ||
      (count > 0 && elements == nullptr))
    return bad_param(kCall, "attribute " + std::to_string(name) + ": " + std::to_string(count) +
                                " elements at " +
                                std::to_string(reinterpret_cast<uintptr_t>(elements)));
  Value v;
  v.type = type;
  v.count = count;
  if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    const auto* ds = static_cast<const cudnnBackendDescriptor_t*>(elements);
    for (int64_t i = 0; i < count; ++i) {
      DescPtr r = find(ds[i]);
      if (r == nullptr)
        return bad_param(kCall, "attribute " + std::to_string(name) + ": element " +
                                    std::to_string(i) + " is not a live backend descriptor");
      if (!r->finalized)
        return fail(
            kCall, hiber::error(ErrorCode::kInvalidValue, "attribute ", name, ": element ", i,
                                " (a ", wdnn::descriptor_type_name(r->type), ") is not finalized"));
      v.refs.push_back(std::move(r));
    }
  } else {
    const auto* p = static_cast<const std::byte*>(elements);
    v.bytes.assign(p, p + each * static_cast<size_t>(count));
  }
  d->attrs[name] = std::move(v);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  std::lock_guard lock(mu);
  DescPtr d = find(descriptor);
  if (d == nullptr) return bad_param("cudnnBackendFinalize", "not a live backend descriptor");
  if (d->finalized) return CUDNN_STATUS_SUCCESS;
  // An SM-count target (cudnn-frontend's setSMCount) asks heuristics and engines to leave SMs
  // free; hiberd runs the graph on all the SMs of a GPU it shares anyway. The result is the same,
  // so the hint is dropped, and said so once.
  for (int32_t hint : {int32_t{CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET},
                       int32_t{CUDNN_ATTR_ENGINE_SM_COUNT_TARGET}}) {
    if (attr(*d, hint) != nullptr)
      hiber::shim::library_log_once(
          "cuDNN",
          "cudnnBackendFinalize: " + wdnn::descriptor_type_name(d->type) +
              ": the SM count target (attribute " + std::to_string(hint) +
              ") is ignored by Hiber (the graph may use every SM; its result is the same)");
  }
  const cudnnStatus_t s = finalize(d);
  if (s == CUDNN_STATUS_SUCCESS) d->finalized = true;
  return s;
}

cudnnStatus_t hiber_entry::cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                                    cudnnBackendAttributeName_t name,
                                                    cudnnBackendAttributeType_t type,
                                                    int64_t requested, int64_t* count,
                                                    void* elements) {
  std::lock_guard lock(mu);
  DescPtr d = find(descriptor);
  if (d == nullptr) return bad_param("cudnnBackendGetAttribute", "not a live backend descriptor");
  if (requested < 0) return bad_param("cudnnBackendGetAttribute", "requestedElementCount < 0");
  return get_attribute(d, name, type, requested, count, elements);
}

cudnnStatus_t hiber_entry::cudnnBackendExecute(cudnnHandle_t handle,
                                               cudnnBackendDescriptor_t execution_plan,
                                               cudnnBackendDescriptor_t variant_pack) {
  constexpr const char* kCall = "cudnnBackendExecute";
  auto* h = handle_of(handle, kCall);
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  std::lock_guard lock(mu);
  DescPtr plan = find(execution_plan);
  DescPtr pack = find(variant_pack);
  if (plan == nullptr || plan->type != wdnn::kExecutionPlan || !plan->finalized)
    return bad_param(kCall, "executionPlan is not a live, finalized execution plan");
  if (pack == nullptr || pack->type != wdnn::kVariantPack || !pack->finalized)
    return bad_param(kCall, "variantPack is not a live, finalized variant pack");
  wdnn::Execute e;
  const Value& uids = *attr(*pack, wdnn::kVariantPackUniqueIds);
  const Value& ptrs = *attr(*pack, wdnn::kVariantPackDataPointers);
  const wdnn::OpGraph& ops = *plan->plan_ops;
  for (int64_t i = 0; i < uids.count; ++i) {
    wdnn::VariantEntry v;
    std::memcpy(&v.uid, uids.bytes.data() + 8 * i, 8);
    std::memcpy(&v.ptr, ptrs.bytes.data() + 8 * i, 8);
    const int t = ops.find(v.uid);
    if (t < 0 || !ops.tensors[t].by_value) {
      e.entries.push_back(v);
      continue;
    }
    // A by-value tensor's pointer is this process's host memory: its element travels.
    auto each = wdnn::data_type_bytes(ops.tensors[t].data_type);
    if (!each.ok() || *each > wdnn::kMaxByValueBytes)
      return fail(kCall, hiber::error(ErrorCode::kNotSupported, "by-value tensor ", v.uid,
                                      ": its data type is not one Hiber carries by value"));
    if (v.ptr == 0)
      return bad_param(kCall, "by-value tensor " + std::to_string(v.uid) +
                                  " has a NULL pointer in the variant pack");
    wdnn::ByValueEntry value;
    value.uid = v.uid;
    std::memcpy(value.value, reinterpret_cast<const void*>(v.ptr), *each);
    e.by_value.push_back(value);
  }
  if (const Value* w = attr(*pack, wdnn::kVariantPackWorkspace);
      w != nullptr && w->bytes.size() == 8)
    std::memcpy(&e.header.workspace, w->bytes.data(), 8);
  e.header.workspace_bytes = plan->engine.workspace_bytes;
  if (e.header.workspace_bytes > 0 && e.header.workspace == 0)
    return bad_param(kCall, "the plan needs " + std::to_string(e.header.workspace_bytes) +
                                " bytes of workspace and the variant pack has none");
  if (auto bound = wdnn::bind_variant_pack(*plan->plan_ops, e); !bound.ok())
    return fail(kCall, bound.status());
  if (plan->graph_id == 0) {
    auto& defined = defined_graphs();
    const std::string key = key_of(*plan->plan_graph);
    auto it = defined.find(key);
    if (it == defined.end()) {
      const uint64_t id = next_graph_id++;
      Status sent = hiber::shim::library_call(h, hiber::library_ops::LibraryOp::kDnnDefineGraph,
                                              wdnn::encode_define_graph(id, *plan->plan_graph));
      if (!sent.ok()) return fail(kCall, sent);
      it = defined.emplace(key, id).first;
    }
    plan->graph_id = it->second;
  }
  e.header.graph_id = plan->graph_id;
  return fail(kCall, hiber::shim::library_call(h, hiber::library_ops::LibraryOp::kDnnExecute,
                                               wdnn::encode_execute(e)));
}
