// The CUDA backend's cuDNN calls (server/device/cuda_dnn.cc) against a fake libcuda.so.1
// (fake_cuda.h) and a fake libcudnn.so.9 (fake_cudnn.h), on any machine: the client's encoded
// descriptor graphs rebuilt as real descriptors with their references translated (an operation's
// X is the real tensor descriptor made for the encoded tensor) and the real per-GPU handle as
// their handle attribute; the finalize answer's engines, workspaces, notes and reasons; the plan
// built once per GPU and reused; executions on the mapped stream with the variant pack's unique
// ids, addresses and workspace; the legacy calls' descriptors and scalars; release destroying
// plans and handles in their GPU's context after synchronising it; cuDNN's errors as a Status
// naming the status and cuDNN's message. Whether the real cuDNN computes what it is asked is for
// the gpu tests (shim_programs_gpu_test runs library_cnn natively and through hiberd).
#include <cudnn_graph.h>
#include <cudnn_ops.h>
#include <dlfcn.h>

#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/cuda_abi.h"
#include "library_ops/dnn_ops.h"
#include "server/device/cuda_device.h"
#include "server/device/library.h"
#include "tests/gpu/fake_cuda.h"
#include "tests/gpu/fake_cudnn.h"
#include "tests/gpu/fake_libraries.h"

namespace hiber::device {
namespace {

namespace dnn = library_ops::dnn;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// The fake cuDNN the backend opened from the folder it was given (nullptr before it did).
FakeCudnn* fake_dnn() {
  return loaded_fake<FakeCudnn>(std::string(HIBER_FAKE_LIBCUDNN_DIR) + "/" + cuda_abi::kCudnnSoname,
                                "fake_cudnn");
}

// ---- Graphs as the client encodes them (client_shim/cudnn_backend.cc) ----
class Builder {
 public:
  template <typename T>
  void attr(dnn::Node& n, int32_t name, int32_t type, std::vector<T> values) {
    dnn::Attr a;
    a.name = name;
    a.type = type;
    a.bytes.resize(values.size() * sizeof(T));
    std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
    n.attrs.push_back(std::move(a));
  }
  uint64_t add(dnn::Node n) {
    g.nodes.push_back(std::move(n));
    return g.nodes.size() - 1;
  }
  uint64_t tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides) {
    dnn::Node n{dnn::kTensor, {}};
    attr<int32_t>(n, dnn::kTensorDataType, dnn::kTypeDataType, {dnn::kFloat});
    attr(n, dnn::kTensorDimensions, dnn::kTypeInt64, dims);
    attr(n, dnn::kTensorStrides, dnn::kTypeInt64, strides);
    attr<int64_t>(n, dnn::kTensorUniqueId, dnn::kTypeInt64, {uid});
    attr<int64_t>(n, dnn::kTensorByteAlignment, dnn::kTypeInt64, {16});
    return add(std::move(n));
  }
  // x 1x2x4x4 (uid 1), w 3x2x3x3 (uid 2), y 1x3x4x4 (uid 3), padding 1: the operation graph.
  uint64_t conv_graph() {
    x = tensor(1, {1, 2, 4, 4}, {32, 16, 4, 1});
    w = tensor(2, {3, 2, 3, 3}, {18, 9, 3, 1});
    y = tensor(3, {1, 3, 4, 4}, {48, 16, 4, 1});
    dnn::Node c{dnn::kConvolution, {}};
    attr<int64_t>(c, dnn::kConvSpatialDims, dnn::kTypeInt64, {2});
    attr<int32_t>(c, dnn::kConvCompType, dnn::kTypeDataType, {dnn::kFloat});
    attr<int32_t>(c, dnn::kConvMode, dnn::kTypeConvolutionMode, {dnn::kCrossCorrelationMode});
    attr<int64_t>(c, dnn::kConvPrePaddings, dnn::kTypeInt64, {1, 1});
    attr<int64_t>(c, dnn::kConvPostPaddings, dnn::kTypeInt64, {1, 1});
    attr<int64_t>(c, dnn::kConvFilterStrides, dnn::kTypeInt64, {1, 1});
    attr<int64_t>(c, dnn::kConvDilations, dnn::kTypeInt64, {1, 1});
    conv = add(std::move(c));
    dnn::Node op{dnn::kOpConvForward, {}};
    attr<uint64_t>(op, dnn::kConvFwdX, dnn::kTypeBackendDescriptor, {x});
    attr<uint64_t>(op, dnn::kConvFwdW, dnn::kTypeBackendDescriptor, {w});
    attr<uint64_t>(op, dnn::kConvFwdY, dnn::kTypeBackendDescriptor, {y});
    attr<uint64_t>(op, dnn::kConvFwdConvDesc, dnn::kTypeBackendDescriptor, {conv});
    attr<float>(op, dnn::kConvFwdAlpha, dnn::kTypeFloat, {1.0f});
    attr<float>(op, dnn::kConvFwdBeta, dnn::kTypeFloat, {0.0f});
    const uint64_t conv_op = add(std::move(op));
    dnn::Node graph{dnn::kOperationGraph, {}};
    attr<uint64_t>(graph, dnn::kOperationGraphOps, dnn::kTypeBackendDescriptor, {conv_op});
    return add(std::move(graph));
  }
  void plan(uint64_t graph, int64_t engine) {
    dnn::Node e{dnn::kEngine, {}};
    attr<uint64_t>(e, dnn::kEngineOperationGraph, dnn::kTypeBackendDescriptor, {graph});
    attr<int64_t>(e, dnn::kEngineGlobalIndex, dnn::kTypeInt64, {engine});
    const uint64_t eng = add(std::move(e));
    dnn::Node c{dnn::kEngineCfg, {}};
    attr<uint64_t>(c, dnn::kEngineCfgEngine, dnn::kTypeBackendDescriptor, {eng});
    const uint64_t cfg = add(std::move(c));
    dnn::Node p{dnn::kExecutionPlan, {}};
    attr<uint64_t>(p, dnn::kPlanEngineConfig, dnn::kTypeBackendDescriptor, {cfg});
    add(std::move(p));
  }
  dnn::Graph g;
  uint64_t x = 0, w = 0, y = 0, conv = 0;
};

dnn::Graph op_graph() {
  Builder b;
  b.conv_graph();
  return b.g;
}
dnn::Graph plan_graph(int64_t engine) {
  Builder b;
  b.plan(b.conv_graph(), engine);
  return b.g;
}

dnn::TensorShape shape(std::vector<int64_t> dims, int32_t type = dnn::kFloat) {
  dnn::TensorShape s;
  s.data_type = type;
  s.rank = static_cast<int32_t>(dims.size());
  int64_t stride = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    s.dims[i] = dims[i];
    s.strides[i] = stride;
    stride *= dims[i];
  }
  return s;
}

CUstream cu(Stream s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s.id)); }

constexpr uint64_t kOwner = 1;
constexpr uint64_t kHandle = 7;

class CudaDnnFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(load_fake_driver());
    CudaDeviceOptions options;
    // Only the fake's folder: the machine's own cuDNN must not be what the test talks to.
    options.libraries.search_default_path = false;
    options.libraries.folders = {HIBER_FAKE_LIBCUDNN_DIR};
    Result<std::unique_ptr<Device>> created = create_cuda_device(options);
    ASSERT_TRUE(created.ok()) << created.status();
    device_ = std::move(created).value();
    driver_ = fake_driver();
    ASSERT_NE(driver_, nullptr);
    dnn_ = device_->library(library_ops::Library::kDnn);
    ASSERT_NE(dnn_, nullptr);
    Status available = dnn_->check_available();
    ASSERT_TRUE(available.ok()) << available;
    cudnn_ = fake_dnn();
    ASSERT_NE(cudnn_, nullptr) << "the backend did not open the fake libcudnn.so.9";
    {
      std::lock_guard lock(cudnn_->mutex);
      cudnn_->reset();
      cudnn_->workspace[2] = 4096;
      cudnn_->unsupported_engines = {1};
      cudnn_->numerical_notes[2] = {CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
                                    CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS};
      cudnn_->behavior_notes[2] = {CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION};
    }
    {
      std::lock_guard lock(driver_->mutex);
      driver_->wrong_context_calls.clear();
      driver_->context_synchronizations.clear();
    }
    for (int gpu : {0, 1}) {
      Result<Stream> s = device_->create_stream(gpu, 0);
      ASSERT_TRUE(s.ok()) << s.status();
      streams_[gpu] = *s;
    }
  }

  void TearDown() override {
    if (device_ == nullptr) return;
    for (Stream s : streams_) EXPECT_TRUE(device_->destroy_stream(s).ok());
    device_.reset();  // destroys the plans and handles still kept
    std::lock_guard lock(cudnn_->mutex);
    EXPECT_THAT(cudnn_->wrong_context_calls, ElementsAre())
        << "cuDNN calls made without the handle's GPU's context current";
    EXPECT_THAT(cudnn_->misuses, ElementsAre());
    EXPECT_EQ(cudnn_->created.size(), cudnn_->destroyed.size()) << "handles leaked";
    for (const FakeCudnnDescriptor& d : cudnn_->descriptors)
      EXPECT_TRUE(d.destroyed) << "descriptor of type " << d.type << " leaked";
    EXPECT_EQ(cudnn_->legacy_descriptors_live, 0) << "legacy descriptors leaked";
  }

  Result<std::vector<dnn::EngineSupport>> finalize(int gpu, const dnn::Graph& g,
                                                   uint64_t owner = kOwner) {
    const std::vector<std::byte> bytes = dnn::encode_graph(g);
    const LibraryCall call{owner, library_ops::LibraryHandle(kHandle),
                           library_ops::LibraryOp::kDnnFinalize, bytes};
    HIBER_ASSIGN_OR_RETURN(std::vector<std::byte> answer,
                           dnn_->answer(device_->shared_context(gpu), call));
    return dnn::decode_finalize_answer(answer);
  }
  Status define(uint64_t id, const dnn::Graph& g, uint64_t owner = kOwner) {
    const std::vector<std::byte> bytes = dnn::encode_define_graph(id, dnn::encode_graph(g));
    const LibraryCall call{owner, library_ops::LibraryHandle(kHandle),
                           library_ops::LibraryOp::kDnnDefineGraph, bytes};
    return dnn_->run(streams_[0], call);
  }
  static dnn::Execute execution(uint64_t id, uint64_t workspace_bytes = 0) {
    dnn::Execute e;
    e.header.graph_id = id;
    e.header.workspace = workspace_bytes != 0 ? 0xF0000 : 0;
    e.header.workspace_bytes = workspace_bytes;
    e.entries = {{1, 0x10000}, {2, 0x20000}, {3, 0x30000}};
    e.header.count = 3;
    return e;
  }
  Status execute(Stream s, const dnn::Execute& e, uint64_t handle = kHandle) {
    const std::vector<std::byte> bytes = dnn::encode_execute(e);
    const LibraryCall call{kOwner, library_ops::LibraryHandle(handle),
                           library_ops::LibraryOp::kDnnExecute, bytes};
    return dnn_->run(s, call);
  }
  template <typename Op>
  Status legacy(Stream s, const Op& op) {
    const LibraryCall call{kOwner, library_ops::LibraryHandle(kHandle), library_ops::op_of<Op>,
                           library_ops::op_bytes(op)};
    return dnn_->run(s, call);
  }

  // A copy of the fake's records, taken under its lock.
  template <typename F>
  auto with_fake(F f) {
    std::lock_guard lock(cudnn_->mutex);
    return f(*cudnn_);
  }

  std::unique_ptr<Device> device_;
  FakeCuda* driver_ = nullptr;
  FakeCudnn* cudnn_ = nullptr;
  LibraryBackend* dnn_ = nullptr;
  Stream streams_[2];
};

// The real descriptor made for the encoded tensor with `uid` (the first, if several).
const FakeCudnnDescriptor* tensor_with_uid(const FakeCudnn& f, int64_t uid) {
  for (const FakeCudnnDescriptor& d : f.descriptors) {
    if (d.type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) continue;
    const FakeCudnnAttr* a = d.find(CUDNN_ATTR_TENSOR_UNIQUE_ID);
    if (a != nullptr && a->value<int64_t>() == uid) return &d;
  }
  return nullptr;
}
const FakeCudnnDescriptor* first_of(const FakeCudnn& f, int type) {
  for (const FakeCudnnDescriptor& d : f.descriptors)
    if (d.type == type) return &d;
  return nullptr;
}

TEST_F(CudaDnnFakeTest, FinalizeRebuildsTheGraphWithTranslatedReferencesAndTheRealHandle) {
  Result<std::vector<dnn::EngineSupport>> engines = finalize(0, op_graph());
  ASSERT_TRUE(engines.ok()) << engines.status();

  with_fake([&](const FakeCudnn& f) {
    ASSERT_EQ(f.created.size(), 1u);
    EXPECT_EQ(f.created[0].gpu, 0) << "the handle is made in GPU 0's context";
    const FakeCudnnDescriptor* x = tensor_with_uid(f, 1);
    const FakeCudnnDescriptor* w = tensor_with_uid(f, 2);
    const FakeCudnnDescriptor* y = tensor_with_uid(f, 3);
    const FakeCudnnDescriptor* conv = first_of(f, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const FakeCudnnDescriptor* op =
        first_of(f, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    const FakeCudnnDescriptor* graph = first_of(f, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    ASSERT_TRUE(x && w && y && conv && op && graph);
    // Every attribute as the program set it, references as the real descriptors.
    EXPECT_THAT(op->find(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X)->refs, ElementsAre(x->id));
    EXPECT_THAT(op->find(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W)->refs, ElementsAre(w->id));
    EXPECT_THAT(op->find(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y)->refs, ElementsAre(y->id));
    EXPECT_THAT(op->find(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC)->refs,
                ElementsAre(conv->id));
    EXPECT_EQ(op->find(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA)->value<float>(), 1.0f);
    EXPECT_THAT(graph->find(CUDNN_ATTR_OPERATIONGRAPH_OPS)->refs, ElementsAre(op->id));
    EXPECT_EQ(x->find(CUDNN_ATTR_TENSOR_DIMENSIONS)->count, 4);
    EXPECT_EQ(x->find(CUDNN_ATTR_TENSOR_STRIDES)->value<int64_t>(1), 16);
    EXPECT_EQ(x->find(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)->value<int64_t>(), 16);
    EXPECT_EQ(conv->find(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS)->count, 2);
    // The handle attribute is the real handle for (owner, client handle, GPU 0).
    const FakeCudnnAttr* h = graph->find(CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->type, CUDNN_TYPE_HANDLE);
    EXPECT_EQ(h->value<uintptr_t>(), f.created[0].handle);
    for (const FakeCudnnDescriptor& d : f.descriptors) {
      if (d.type == CUDNN_BACKEND_ENGINE_DESCRIPTOR &&
          d.find(CUDNN_ATTR_ENGINE_GLOBAL_INDEX)->value<int64_t>() == 1)
        continue;  // the unsupported engine's finalization failed
      if (d.type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && !d.finalized) continue;
      EXPECT_TRUE(d.finalized) << "descriptor type " << d.type;
      EXPECT_TRUE(d.destroyed) << "a finalize query keeps nothing";
    }
    // One ENGINE per global index, each on the rebuilt graph, plus one per heuristic result
    // (engines 0 and 2); plans for the supported ones.
    EXPECT_EQ(f.count_of(CUDNN_BACKEND_ENGINE_DESCRIPTOR), 3u + 2u);
    EXPECT_EQ(f.count_of(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR), 2u);
    const FakeCudnnDescriptor* engine = first_of(f, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    EXPECT_THAT(engine->find(CUDNN_ATTR_ENGINE_OPERATION_GRAPH)->refs, ElementsAre(graph->id));
    const FakeCudnnDescriptor* plan = first_of(f, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    EXPECT_EQ(plan->find(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)->value<uintptr_t>(),
              f.created[0].handle);
  });

  ASSERT_EQ(engines->size(), 3u);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ((*engines)[i].global_index, i);
  EXPECT_EQ((*engines)[0].supported, 1u);
  EXPECT_EQ((*engines)[0].workspace_bytes, 0u);
  EXPECT_EQ((*engines)[0].numerical_notes, 0u);
  EXPECT_EQ((*engines)[1].supported, 0u);
  EXPECT_THAT(std::string((*engines)[1].why), HasSubstr("CUDNN_STATUS_NOT_SUPPORTED"));
  EXPECT_THAT(std::string((*engines)[1].why),
              HasSubstr("fake: engine 1 does not support this graph"));
  EXPECT_EQ((*engines)[2].supported, 1u);
  EXPECT_EQ((*engines)[2].workspace_bytes, 4096u);
  EXPECT_EQ((*engines)[2].numerical_notes, (1u << CUDNN_NUMERICAL_NOTE_TENSOR_CORE) |
                                               (1u << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS));
  EXPECT_EQ((*engines)[2].behavior_notes, 1u << CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION);
}

TEST_F(CudaDnnFakeTest, TheAnswerRanksEnginesInCudnnsHeuristicOrder) {
  with_fake([](FakeCudnn& f) {
    f.engine_count = 5;
    f.heuristic_order = {3, 1, 0};  // engine 1 is ranked but unsupported
  });
  Result<std::vector<dnn::EngineSupport>> engines = finalize(0, op_graph());
  ASSERT_TRUE(engines.ok()) << engines.status();
  ASSERT_EQ(engines->size(), 5u);
  std::vector<uint32_t> ranks;
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ((*engines)[i].global_index, i) << "entries stay in index order";
    ranks.push_back((*engines)[i].heuristic_rank);
  }
  EXPECT_THAT(ranks, ElementsAre(3u, 2u, 0u, 1u, 0u))
      << "1 + the position in ENGINEHEUR_RESULTS; 0 for engines the heuristic did not return";
  EXPECT_EQ((*engines)[1].supported, 0u);

  // The order the client gives CUDNN_ATTR_ENGINEHEUR_RESULTS: supported engines by rank, then
  // the unranked in index order.
  std::vector<int64_t> order;
  for (const dnn::EngineSupport* e : dnn::heuristic_results(*engines))
    order.push_back(e->global_index);
  EXPECT_THAT(order, ElementsAre(3, 0, 2, 4));

  with_fake([](const FakeCudnn& f) {
    const FakeCudnnDescriptor* heur = first_of(f, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const FakeCudnnDescriptor* graph = first_of(f, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    ASSERT_TRUE(heur && graph);
    EXPECT_TRUE(heur->finalized);
    EXPECT_THAT(heur->find(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)->refs, ElementsAre(graph->id))
        << "the heuristic runs on the real rebuilt graph";
    EXPECT_EQ(heur->find(CUDNN_ATTR_ENGINEHEUR_MODE)->value<int32_t>(), CUDNN_HEUR_MODE_INSTANT);
  });
}

TEST_F(CudaDnnFakeTest, AFailingHeuristicLeavesIndexOrder) {
  with_fake([](FakeCudnn& f) { f.heuristic_fails = true; });
  Result<std::vector<dnn::EngineSupport>> engines = finalize(0, op_graph());
  ASSERT_TRUE(engines.ok()) << engines.status() << ": the answer does not depend on the heuristic";
  ASSERT_EQ(engines->size(), 3u);
  for (const dnn::EngineSupport& e : *engines) EXPECT_EQ(e.heuristic_rank, 0u);
  EXPECT_EQ((*engines)[0].supported, 1u);
  EXPECT_EQ((*engines)[2].supported, 1u);
}

TEST_F(CudaDnnFakeTest, AnEngineWhosePlanFailsIsUnsupportedWithCudnnsReason) {
  with_fake([](FakeCudnn& f) { f.plan_fails = {0}; });
  Result<std::vector<dnn::EngineSupport>> engines = finalize(1, op_graph());
  ASSERT_TRUE(engines.ok()) << engines.status();
  EXPECT_EQ((*engines)[0].supported, 0u);
  EXPECT_THAT(std::string((*engines)[0].why), HasSubstr("EXECUTION_PLAN"));
  EXPECT_THAT(std::string((*engines)[0].why), HasSubstr("3010"));
  EXPECT_THAT(std::string((*engines)[0].why), HasSubstr("fake: engine 0's plan does not fit"));
  with_fake([](const FakeCudnn& f) {
    ASSERT_EQ(f.created.size(), 1u);
    EXPECT_EQ(f.created[0].gpu, 1) << "the handle for the query's GPU";
  });
}

TEST_F(CudaDnnFakeTest, ThePlanIsBuiltOncePerGpuAndReused) {
  ASSERT_TRUE(define(5, plan_graph(0)).ok());
  with_fake([](const FakeCudnn& f) {
    EXPECT_TRUE(f.descriptors.empty()) << "defining a graph builds nothing yet";
  });
  ASSERT_TRUE(execute(streams_[0], execution(5)).ok());
  ASSERT_TRUE(execute(streams_[0], execution(5)).ok());
  // The function moved to GPU 1 (late binding): a fresh handle and plan there.
  ASSERT_TRUE(execute(streams_[1], execution(5)).ok());
  ASSERT_TRUE(execute(streams_[1], execution(5)).ok());

  with_fake([&](const FakeCudnn& f) {
    ASSERT_EQ(f.created.size(), 2u);
    EXPECT_EQ(f.created[0].gpu, 0);
    EXPECT_EQ(f.created[1].gpu, 1);
    std::vector<const FakeCudnnDescriptor*> plans;
    for (const FakeCudnnDescriptor& d : f.descriptors)
      if (d.type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) plans.push_back(&d);
    ASSERT_EQ(plans.size(), 2u) << "one plan per GPU";
    EXPECT_EQ(plans[0]->gpu, 0);
    EXPECT_EQ(plans[1]->gpu, 1);
    EXPECT_EQ(plans[0]->find(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)->value<uintptr_t>(),
              f.created[0].handle);
    EXPECT_EQ(plans[1]->find(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)->value<uintptr_t>(),
              f.created[1].handle);
    EXPECT_FALSE(plans[0]->destroyed);
    // The plan's chain as encoded: plan -> engine config -> engine (index 0) -> the graph.
    const FakeCudnnDescriptor* cfg =
        f.descriptor(plans[0]->find(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)->refs.at(0));
    ASSERT_NE(cfg, nullptr);
    EXPECT_EQ(cfg->type, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    const FakeCudnnDescriptor* engine =
        f.descriptor(cfg->find(CUDNN_ATTR_ENGINECFG_ENGINE)->refs.at(0));
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->find(CUDNN_ATTR_ENGINE_GLOBAL_INDEX)->value<int64_t>(), 0);
    EXPECT_EQ(f.descriptor(engine->find(CUDNN_ATTR_ENGINE_OPERATION_GRAPH)->refs.at(0))->type,
              CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);

    ASSERT_EQ(f.executes.size(), 4u);
    EXPECT_EQ(f.executes[0].plan, plans[0]->id);
    EXPECT_EQ(f.executes[1].plan, plans[0]->id) << "reused";
    EXPECT_EQ(f.executes[2].plan, plans[1]->id);
    EXPECT_EQ(f.executes[3].plan, plans[1]->id);
    EXPECT_EQ(f.executes[0].handle, f.created[0].handle);
    EXPECT_EQ(f.executes[2].handle, f.created[1].handle);
    EXPECT_EQ(f.executes[2].gpu, 1);
    // Variant packs are per execution, destroyed after it.
    EXPECT_EQ(f.count_of(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR), 4u);
    for (const FakeCudnnDescriptor& d : f.descriptors) {
      if (d.type == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
        EXPECT_TRUE(d.destroyed);
      }
    }
  });
}

TEST_F(CudaDnnFakeTest, ExecutePassesTheMappedStreamAndTheVariantPack) {
  Result<Stream> other = device_->create_stream(0, 0);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(define(5, plan_graph(2)).ok());  // engine 2: 4096 bytes of workspace
  ASSERT_TRUE(execute(streams_[0], execution(5, 4096)).ok());
  ASSERT_TRUE(execute(streams_[0], execution(5, 8192)).ok());
  ASSERT_TRUE(execute(*other, execution(5, 4096)).ok());
  with_fake([&](const FakeCudnn& f) {
    ASSERT_EQ(f.executes.size(), 3u);
    EXPECT_EQ(f.executes[0].stream, cu(streams_[0]));
    EXPECT_EQ(f.executes[1].stream, cu(streams_[0]));
    EXPECT_EQ(f.executes[2].stream, cu(*other));
    EXPECT_EQ(f.set_stream_calls, 2) << "a warm call on the same stream sets nothing";
    EXPECT_THAT(f.executes[0].uids, ElementsAre(1, 2, 3));
    EXPECT_THAT(f.executes[0].pointers, ElementsAre(0x10000u, 0x20000u, 0x30000u));
    EXPECT_EQ(f.executes[0].workspace, 0xF0000u);
  });
  // A plan that needs more workspace on this GPU than the client brought is refused, not run.
  Status s = execute(streams_[0], execution(5, 1024));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(s.message(), HasSubstr("4096 bytes of workspace"));
  EXPECT_EQ(with_fake([](const FakeCudnn& f) { return f.executes.size(); }), 3u);
  EXPECT_TRUE(device_->destroy_stream(*other).ok());
}

TEST_F(CudaDnnFakeTest, ReleaseDestroysPlansThenHandlesInTheirGpusContexts) {
  ASSERT_TRUE(define(5, plan_graph(0)).ok());
  ASSERT_TRUE(execute(streams_[0], execution(5)).ok());
  ASSERT_TRUE(execute(streams_[1], execution(5)).ok());
  ASSERT_TRUE(execute(streams_[0], execution(5), 8).ok());  // another client handle
  ASSERT_EQ(with_fake([](const FakeCudnn& f) { return f.created.size(); }), 3u);

  dnn_->release(kOwner, library_ops::LibraryHandle(kHandle));  // cudnnDestroy of client handle 7
  {
    std::lock_guard lock(driver_->mutex);
    EXPECT_THAT(driver_->context_synchronizations, UnorderedElementsAre(0, 1))
        << "each GPU's work finishes before its plans go";
  }
  with_fake([](const FakeCudnn& f) {
    ASSERT_EQ(f.destroyed.size(), 2u);
    for (const FakeCudnnHandleEvent& d : f.destroyed) {
      EXPECT_TRUE(d.handle == f.created[0].handle || d.handle == f.created[1].handle);
      EXPECT_EQ(d.gpu, d.handle == f.created[0].handle ? 0 : 1) << "in its GPU's context";
    }
    size_t live_plans = 0;
    for (const FakeCudnnDescriptor& d : f.descriptors)
      if (d.type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && !d.destroyed) ++live_plans;
    EXPECT_EQ(live_plans, 1u) << "handle 8's plan stays";
  });
  // The graph belongs to the session: handle 7 used again gets a fresh handle and plan.
  ASSERT_TRUE(execute(streams_[0], execution(5)).ok());
  EXPECT_EQ(with_fake([](const FakeCudnn& f) { return f.created.size(); }), 4u);

  dnn_->release(kOwner, std::nullopt);  // the session ends
  with_fake([](const FakeCudnn& f) {
    EXPECT_EQ(f.destroyed.size(), 4u);
    for (const FakeCudnnDescriptor& d : f.descriptors) EXPECT_TRUE(d.destroyed);
  });
  Status gone = execute(streams_[0], execution(5));
  EXPECT_EQ(gone.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(gone.message(), HasSubstr("was not defined"));
}

TEST_F(CudaDnnFakeTest, CudnnErrorsBecomeAStatusNamingTheStatusAndCudnnsMessage) {
  ASSERT_TRUE(define(5, plan_graph(0)).ok());
  with_fake([](FakeCudnn& f) {
    f.execute_result = CUDNN_STATUS_EXECUTION_FAILED;
    f.execute_message = "fake: the kernel could not be launched";
  });
  Status s = execute(streams_[0], execution(5));
  EXPECT_EQ(s.code(), ErrorCode::kLaunchFailed);
  EXPECT_THAT(s.message(), HasSubstr("cudnnBackendExecute"));
  EXPECT_THAT(s.message(), HasSubstr("CUDNN_STATUS_EXECUTION_FAILED (5000)"));
  EXPECT_THAT(s.message(), HasSubstr("fake: the kernel could not be launched"));

  // A plan whose engine this GPU does not run: the build fails naming the graph, GPU and reason.
  with_fake([](FakeCudnn& f) { f.execute_result = 0; });
  ASSERT_TRUE(define(6, plan_graph(1)).ok());
  Status unsupported = execute(streams_[1], execution(6));
  EXPECT_EQ(unsupported.code(), ErrorCode::kNotSupported);
  EXPECT_THAT(unsupported.message(), HasSubstr("graph 6"));
  EXPECT_THAT(unsupported.message(), HasSubstr("GPU 1"));
  EXPECT_THAT(unsupported.message(), HasSubstr("CUDNN_STATUS_NOT_SUPPORTED (3000)"));
  EXPECT_THAT(unsupported.message(), HasSubstr("engine 1 does not support this graph"));
  EXPECT_EQ(unsupported.message().find('\n'), std::string::npos) << "one line";
}

TEST_F(CudaDnnFakeTest, RefusesGraphsCarryingHandlesOrPointersBeforeCudnnSeesThem) {
  dnn::Graph g = op_graph();
  dnn::Attr handle;
  handle.name = dnn::kOperationGraphHandle;
  handle.type = dnn::kTypeHandle;
  handle.bytes.resize(8, std::byte{0x41});
  g.nodes.back().attrs.push_back(handle);
  Result<std::vector<dnn::EngineSupport>> refused = finalize(0, g);
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(refused.status().message(), HasSubstr("attribute 800"));

  dnn::Graph root_not_plan = op_graph();
  EXPECT_EQ(define(9, root_not_plan).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(execute(streams_[0], execution(9)).code(), ErrorCode::kInvalidValue);
  with_fake([](const FakeCudnn& f) {
    EXPECT_TRUE(f.descriptors.empty());
    EXPECT_TRUE(f.executes.empty());
  });
}

// A by-value tensor (an attention scale, an epsilon) reaches cuDNN as a pointer to the value the
// client sent, in hiberd's memory during cudnnBackendExecute, never as the client's address.
TEST_F(CudaDnnFakeTest, ByValueTensorsReachCudnnAsPointersToTheirValues) {
  dnn::Graph by_value = plan_graph(0);
  dnn::Attr flag;
  flag.name = dnn::kTensorIsByValue;
  flag.type = dnn::kTypeBoolean;
  flag.bytes = {std::byte{1}};
  by_value.nodes[1].attrs.push_back(flag);  // w, uid 2
  ASSERT_TRUE(define(8, by_value).ok());
  with_fake([](FakeCudnn& f) { f.host_uids = {2}; });
  dnn::Execute e = execution(8);
  e.entries = {{1, 0x10000}, {3, 0x30000}};
  dnn::ByValueEntry value;
  value.uid = 2;
  const float scale = 0.125f;
  std::memcpy(value.value, &scale, sizeof(scale));
  e.by_value = {value};
  ASSERT_TRUE(execute(streams_[0], e).ok());
  with_fake([&](const FakeCudnn& f) {
    ASSERT_EQ(f.executes.size(), 1u);
    EXPECT_THAT(f.executes[0].uids, ElementsAre(1, 3, 2));
    EXPECT_EQ(f.executes[0].pointers[0], 0x10000u);
    EXPECT_EQ(f.executes[0].pointers[1], 0x30000u);
    ASSERT_EQ(f.executes[0].host_values.count(2), 1u);
    EXPECT_EQ(f.executes[0].host_values.at(2), scale);
  });
}

TEST_F(CudaDnnFakeTest, LegacyCallsRebuildTheirDescriptorsOnTheMappedStream) {
  dnn::BatchNormInference bn;
  bn.x = bn.y = shape({2, 3, 4, 4});
  bn.bn = shape({1, 3, 1, 1});
  bn.x_ptr = 0x1000;
  bn.y_ptr = 0x2000;
  bn.scale = 0x3000;
  bn.bias = 0x4000;
  bn.mean = 0x5000;
  bn.variance = 0x6000;
  bn.alpha = 1.5;
  bn.beta = 0.25;
  bn.epsilon = 1e-5;
  bn.mode = 1;  // CUDNN_BATCHNORM_SPATIAL
  ASSERT_TRUE(legacy(streams_[0], bn).ok());

  dnn::Pooling pool;
  pool.x = shape({1, 2, 4, 4});
  pool.y = shape({1, 2, 2, 2});
  pool.x_ptr = 0x7000;
  pool.y_ptr = 0x8000;
  pool.mode = CUDNN_POOLING_MAX;
  pool.spatial = 2;
  pool.window[0] = pool.window[1] = 2;
  pool.stride[0] = pool.stride[1] = 2;
  ASSERT_TRUE(legacy(streams_[0], pool).ok());

  dnn::Activation act;
  act.x = act.y = shape({1, 2, 3, 3}, dnn::kDouble);
  act.x_ptr = 0x9000;
  act.y_ptr = 0xA000;
  act.mode = CUDNN_ACTIVATION_CLIPPED_RELU;
  act.coef = 6.0;
  act.alpha = -2.0;
  act.beta = 0.5;
  ASSERT_TRUE(legacy(streams_[1], act).ok());

  dnn::Softmax soft;
  soft.x = soft.y = shape({2, 10, 1, 1});
  soft.x_ptr = 0xB000;
  soft.y_ptr = 0xC000;
  soft.algorithm = CUDNN_SOFTMAX_LOG;
  soft.mode = CUDNN_SOFTMAX_MODE_CHANNEL;
  ASSERT_TRUE(legacy(streams_[0], soft).ok());

  dnn::AddTensor add;
  add.a = shape({1, 3, 1, 1});
  add.c = shape({2, 3, 4, 4});
  add.a_ptr = 0xD000;
  add.c_ptr = 0xE000;
  add.beta = 1.0;
  ASSERT_TRUE(legacy(streams_[0], add).ok());

  with_fake([&](const FakeCudnn& f) {
    ASSERT_EQ(f.legacy.size(), 5u);
    const FakeCudnnLegacyCall& b = f.legacy[0];
    EXPECT_EQ(b.call, "cudnnBatchNormalizationForwardInference");
    EXPECT_EQ(b.stream, cu(streams_[0]));
    EXPECT_EQ(b.handle, f.created.at(0).handle);
    ASSERT_EQ(b.tensors.size(), 3u);
    EXPECT_THAT(b.tensors[0].dims, ElementsAre(2, 3, 4, 4));
    EXPECT_THAT(b.tensors[0].strides, ElementsAre(48, 16, 4, 1));
    EXPECT_THAT(b.tensors[2].dims, ElementsAre(1, 3, 1, 1));
    EXPECT_EQ(b.tensors[0].data_type, CUDNN_DATA_FLOAT);
    EXPECT_THAT(b.pointers, ElementsAre(0x1000u, 0x2000u, 0x3000u, 0x4000u, 0x5000u, 0x6000u));
    EXPECT_FALSE(b.scalars_as_double);
    EXPECT_EQ(b.alpha, 1.5);
    EXPECT_EQ(b.beta, 0.25);
    EXPECT_EQ(b.epsilon, 1e-5);
    EXPECT_EQ(b.mode, 1);

    const FakeCudnnLegacyCall& p = f.legacy[1];
    EXPECT_EQ(p.call, "cudnnPoolingForward");
    EXPECT_EQ(p.mode, CUDNN_POOLING_MAX);
    EXPECT_EQ(p.spatial, 2);
    EXPECT_THAT(p.window, ElementsAre(2, 2));
    EXPECT_THAT(p.pad, ElementsAre(0, 0));
    EXPECT_THAT(p.stride, ElementsAre(2, 2));
    EXPECT_THAT(p.pointers, ElementsAre(0x7000u, 0x8000u));
    EXPECT_EQ(p.alpha, 1.0);

    const FakeCudnnLegacyCall& a = f.legacy[2];
    EXPECT_EQ(a.call, "cudnnActivationForward");
    EXPECT_EQ(a.gpu, 1);
    EXPECT_EQ(a.stream, cu(streams_[1]));
    EXPECT_EQ(a.handle, f.created.at(1).handle) << "GPU 1's own handle";
    EXPECT_TRUE(a.scalars_as_double) << "double data takes double scalars";
    EXPECT_EQ(a.alpha, -2.0);
    EXPECT_EQ(a.beta, 0.5);
    EXPECT_EQ(a.coef, 6.0);
    EXPECT_EQ(a.mode, CUDNN_ACTIVATION_CLIPPED_RELU);

    const FakeCudnnLegacyCall& s = f.legacy[3];
    EXPECT_EQ(s.call, "cudnnSoftmaxForward");
    EXPECT_EQ(s.algorithm, CUDNN_SOFTMAX_LOG);
    EXPECT_EQ(s.mode, CUDNN_SOFTMAX_MODE_CHANNEL);

    const FakeCudnnLegacyCall& t = f.legacy[4];
    EXPECT_EQ(t.call, "cudnnAddTensor");
    ASSERT_EQ(t.tensors.size(), 2u);
    EXPECT_THAT(t.tensors[0].dims, ElementsAre(1, 3, 1, 1));
    EXPECT_THAT(t.pointers, ElementsAre(0xD000u, 0xE000u));
    EXPECT_EQ(t.beta, 1.0);
    EXPECT_EQ(f.legacy_descriptors_live, 0) << "each call's descriptors are destroyed after it";
  });

  // A value cuDNN would refuse is refused before it is asked (the session checks it too).
  dnn::Softmax bad = soft;
  bad.mode = 7;
  EXPECT_NE(legacy(streams_[0], bad).code(), ErrorCode::kSuccess);
  EXPECT_EQ(with_fake([](const FakeCudnn& f) { return f.legacy.size(); }), 5u);
}

}  // namespace
}  // namespace hiber::device
