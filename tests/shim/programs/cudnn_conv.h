// A 2-D convolution forward through cuDNN's backend API, built step by step exactly as the
// cudnn-frontend builds it (tensor, convolution and operation descriptors, operation graph,
// engine heuristics filtered by their notes, engine config, execution plan, variant pack,
// execute), shared by the test programs and benchmarks that drive cuDNN the way PyTorch does.
// Host code only; any shape, padding, stride, data type and NCHW or NHWC layout.
//
// Every failing call prints where (file and line), cuDNN's status and its last error string, and
// exits with program::kExitCudaError, per the programs' contract (program_util.h).
#pragma once

#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "program_util.h"

#define CUDNN_CHECK(call)                                                          \
  do {                                                                             \
    const cudnnStatus_t cudnn_check_status_ = (call);                              \
    if (cudnn_check_status_ != CUDNN_STATUS_SUCCESS) {                             \
      char cudnn_check_message_[512];                                              \
      cudnnGetLastErrorString(cudnn_check_message_, sizeof(cudnn_check_message_)); \
      std::printf("%s:%d: FAILED: %s = %s (%s)\n", __FILE__, __LINE__, #call,      \
                  cudnnGetErrorString(cudnn_check_status_), cudnn_check_message_); \
      std::exit(program::kExitCudaError);                                          \
    }                                                                              \
  } while (0)

namespace cudnn_conv {

// The tensors' unique ids in the graph and the variant pack.
constexpr int64_t kUidX = 'x', kUidW = 'w', kUidY = 'y';

// x N x C x H x W, w K x C x R x S, symmetric padding, equal strides in both spatial dims, no
// dilation, one group; x, w and y of `type` in one layout, computed in FLOAT (as PyTorch does for
// fp32, fp16 and bf16 data). `alignment`: the bytes every bound address is a multiple of, which
// engines may rely on (PyTorch declares what its pointers have; an element inside a larger
// tensor has only its element size).
struct Shape {
  int64_t n = 1, c = 1, h = 1, w = 1, k = 1, r = 1, s = 1, pad = 0, stride = 1;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool nhwc = false;
  int64_t alignment = 16;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }
};

// Strides in elements of an N x C x H x W tensor stored NCHW or NHWC (N does not enter them).
inline void strides_of(bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w, int64_t* s) {
  (void)n;
  if (nhwc) {
    s[0] = h * w * c, s[1] = 1, s[2] = w * c, s[3] = c;
  } else {
    s[0] = c * h * w, s[1] = h * w, s[2] = w, s[3] = 1;
  }
}

inline cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d;
  CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
  return d;
}

inline cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const int64_t* dims,
                                       const int64_t* strides, int64_t alignment = 16) {
  cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  CUDNN_CHECK(
      cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                       &alignment));
  CUDNN_CHECK(cudnnBackendFinalize(t));
  return t;
}

// The convolution's operation graph, as cudnn-frontend builds it.
struct ConvGraph {
  cudnnBackendDescriptor_t x, w, y, conv, op, graph;

  // The graph first: it refers to the others (cuDNN keeps references alive either way).
  void destroy() {
    for (auto d : {graph, op, conv, x, w, y}) CUDNN_CHECK(cudnnBackendDestroyDescriptor(d));
  }
};

inline ConvGraph conv_graph(cudnnHandle_t handle, const Shape& shape) {
  ConvGraph g;
  const int64_t P = shape.p(), Q = shape.q();
  int64_t xd[4] = {shape.n, shape.c, shape.h, shape.w},
          wd[4] = {shape.k, shape.c, shape.r, shape.s}, yd[4] = {shape.n, shape.k, P, Q};
  int64_t xs[4], ws[4], ys[4];
  strides_of(shape.nhwc, shape.n, shape.c, shape.h, shape.w, xs);
  strides_of(shape.nhwc, shape.k, shape.c, shape.r, shape.s, ws);
  strides_of(shape.nhwc, shape.n, shape.k, P, Q, ys);
  g.x = tensor(kUidX, shape.type, xd, xs, shape.alignment);
  g.w = tensor(kUidW, shape.type, wd, ws, shape.alignment);
  g.y = tensor(kUidY, shape.type, yd, ys, shape.alignment);
  g.conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t spatial = 2, pad[2] = {shape.pad, shape.pad},
                stride[2] = {shape.stride, shape.stride}, dil[2] = {1, 1};
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  CUDNN_CHECK(cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
                                       CUDNN_TYPE_INT64, 1, &spatial));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                                       CUDNN_TYPE_DATA_TYPE, 1, &compute));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                       CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
                                       CUDNN_TYPE_INT64, 2, pad));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
                                       CUDNN_TYPE_INT64, 2, pad));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
                                       CUDNN_TYPE_INT64, 2, stride));
  CUDNN_CHECK(
      cudnnBackendSetAttribute(g.conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil));
  CUDNN_CHECK(cudnnBackendFinalize(g.conv));
  g.op = make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  // FLOAT compute type: alpha and beta are FLOAT (they would be DOUBLE for DOUBLE compute).
  const float alpha = 1.0f, beta = 0.0f;
  CUDNN_CHECK(cudnnBackendSetAttribute(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.x));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.w));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.y));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.conv));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                       CUDNN_TYPE_FLOAT, 1, &alpha));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                       CUDNN_TYPE_FLOAT, 1, &beta));
  CUDNN_CHECK(cudnnBackendFinalize(g.op));
  g.graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  CUDNN_CHECK(cudnnBackendSetAttribute(g.graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.op));
  CUDNN_CHECK(cudnnBackendSetAttribute(g.graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE,
                                       1, &handle));
  CUDNN_CHECK(cudnnBackendFinalize(g.graph));
  return g;
}

// What the cudnn-frontend's ExecutionPlanBuilder_v8::build() does after finalizing a plan (its
// tag and notes), and what Engine_v8's constructor does with an engine (its knobs): both create
// CUDNN_KNOB_TYPE_COUNTS knob descriptors up front, so a library that refuses to create them
// fails every plan PyTorch's Conv_v8.cpp builds. Hiber's engines have no knobs: both counts are 0.
inline void describe_plan_as_the_frontend_does(cudnnBackendDescriptor_t config) {
  std::vector<cudnnBackendDescriptor_t> choices(CUDNN_KNOB_TYPE_COUNTS),
      infos(CUDNN_KNOB_TYPE_COUNTS);
  for (auto& k : choices) k = make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
  for (auto& k : infos) k = make(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
  cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = -1, index = -1;
  CUDNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine));
  CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                       &n, &index));
  int64_t knobs = -1;
  CUDNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS,
                                       &knobs, choices.data()));
  int64_t knob_infos = -1;
  CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS,
                                       &knob_infos, infos.data()));
  int64_t behavior = -1;
  CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                       CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT,
                                       &behavior, nullptr));
  // Hiber's engines carry no knobs; cuDNN's have some (its heuristic's choices).
  if (index < 0 || knobs < 0 || knob_infos < 0 || behavior < 0) {
    std::printf(
        "cudnn_conv: WRONG: plan tag eng%lld with %lld knob choices, %lld knob infos, "
        "%lld behaviour notes\n",
        static_cast<long long>(index), static_cast<long long>(knobs),
        static_cast<long long>(knob_infos), static_cast<long long>(behavior));
    std::exit(program::kExitMismatch);
  }
  // A knob choice finalizes on its own and reads back. A fresh one: cuDNN fills and finalizes the
  // first `knobs` of `choices`.
  cudnnBackendDescriptor_t probe = make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
  const cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_TILE_SIZE;  // SPLIT_K is deprecated: refused
  const int64_t value = 4;
  CUDNN_CHECK(cudnnBackendSetAttribute(probe, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                       CUDNN_TYPE_KNOB_TYPE, 1, &type));
  CUDNN_CHECK(cudnnBackendSetAttribute(probe, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64,
                                       1, &value));
  CUDNN_CHECK(cudnnBackendFinalize(probe));
  cudnnBackendKnobType_t type_back = CUDNN_KNOB_TYPE_COUNTS;
  int64_t value_back = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(probe, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                       CUDNN_TYPE_KNOB_TYPE, 1, &n, &type_back));
  CUDNN_CHECK(cudnnBackendGetAttribute(probe, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64,
                                       1, &n, &value_back));
  if (type_back != type || value_back != value) {
    std::printf("cudnn_conv: WRONG: the knob choice read back as %d = %lld\n",
                static_cast<int>(type_back), static_cast<long long>(value_back));
    std::exit(program::kExitMismatch);
  }
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(probe));
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(engine));
  for (auto k : choices) CUDNN_CHECK(cudnnBackendDestroyDescriptor(k));
  for (auto k : infos) CUDNN_CHECK(cudnnBackendDestroyDescriptor(k));
}

// Heuristics -> the first engine config whose engine has no notes the frontend would filter out
// (down-converting inputs, nondeterminism) -> execution plan. Exits with kExitMismatch when no
// config is left: a device that offers none for a plain convolution is wrong, not unlucky.
inline cudnnBackendDescriptor_t plan_for(cudnnHandle_t handle, cudnnBackendDescriptor_t graph) {
  cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_INSTANT;
  CUDNN_CHECK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
  CUDNN_CHECK(
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  CUDNN_CHECK(cudnnBackendFinalize(heur));
  int64_t count = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  if (count < 1) {
    std::printf("cudnn_conv: FAILED: no engine config from the heuristics\n");
    std::exit(program::kExitMismatch);
  }
  std::vector<cudnnBackendDescriptor_t> configs(count);
  for (auto& c : configs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t got = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, configs.data()));
  // cuDNN fills `got` of them (fewer than counted when some configs fail to build); the rest
  // stay uninitialized and answer CUDNN_STATUS_NOT_INITIALIZED.
  configs.resize(static_cast<size_t>(std::min(got, count)));
  cudnnBackendDescriptor_t chosen = nullptr;
  for (auto c : configs) {
    cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    if (cudnnBackendGetAttribute(c, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &n, &engine) != CUDNN_STATUS_SUCCESS) {
      CUDNN_CHECK(cudnnBackendDestroyDescriptor(engine));
      continue;  // a config cuDNN could not build (cudnn-frontend skips them too)
    }
    cudnnBackendNumericalNote_t notes[16];
    CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                         CUDNN_TYPE_NUMERICAL_NOTE, 16, &n, notes));
    bool usable = true;
    for (int64_t i = 0; i < n; ++i)
      usable = usable && notes[i] != CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS &&
               notes[i] != CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    int64_t index = -1;
    CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64,
                                         1, &n, &index));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(engine));
    if (usable && index >= 0 && chosen == nullptr) chosen = c;
  }
  if (chosen == nullptr) {
    std::printf("cudnn_conv: FAILED: every engine config was filtered out by its notes\n");
    std::exit(program::kExitMismatch);
  }
  cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  CUDNN_CHECK(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &chosen));
  CUDNN_CHECK(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                       &handle));
  CUDNN_CHECK(cudnnBackendFinalize(plan));
  describe_plan_as_the_frontend_does(chosen);
  for (auto c : configs) CUDNN_CHECK(cudnnBackendDestroyDescriptor(c));
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(heur));
  return plan;
}

// The workspace the plan's engine needs, in bytes.
inline int64_t workspace_size(cudnnBackendDescriptor_t plan) {
  int64_t bytes = 0, n = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &bytes));
  return bytes;
}

// A finalized variant pack binding x, w and y (device addresses) and the workspace (may be null
// when the plan needs none).
inline cudnnBackendDescriptor_t variant_pack(void* x, void* w, void* y, void* workspace) {
  cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  int64_t uids[3] = {kUidX, kUidW, kUidY};
  void* ptrs[3] = {x, w, y};
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                       3, uids));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                       CUDNN_TYPE_VOID_PTR, 3, ptrs));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                       1, &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack));
  return pack;
}

}  // namespace cudnn_conv
