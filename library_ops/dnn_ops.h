// cuDNN operations (library_ops.h).
//
// Backend API: the client keeps cuDNN's backend descriptors as attribute bags and sends hiberd a
// descriptor graph when it needs an answer (kDnnFinalize: which engines run an operation graph,
// their notes and workspace) or before the first execution of a plan (kDnnDefineGraph: the
// plan's graph, named by a client-chosen id that later kDnnExecute calls reference). A graph is
// the descriptors reachable from its root, each a list of attributes exactly as the program set
// them (cudnnBackendAttributeType_t, element count, elements), in post-order: a descriptor-typed
// attribute holds the positions of earlier descriptors, so no graph has a cycle, and the root is
// last. Handles and host pointers (CUDNN_TYPE_HANDLE, CUDNN_TYPE_VOID_PTR) stay in the client.
// Decoding checks every count, type and position against the bytes received: hiberd meets
// malformed bytes with kInvalidValue, never a crash.
//
// interpret_*() read a decoded graph as the operations Hiber runs (convolution forward, matmul
// and pointwise ops on tensors), checking what cuDNN checks when it finalizes them; the session's
// checks (server/dnn_checks.cc) and the simulated GPU (server/device/sim/dnn_host.cc) share them.
//
// Legacy API (cudnnBatchNormalizationForwardInference, cudnnPoolingForward, ...): one fixed
// struct per call, with its tensor descriptors by value.
//
// Enumerations carry cuDNN's own values (cudnn_graph.h, cudnn_ops.h); this library builds without
// them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "library_ops/library_ops.h"

namespace hiber::library_ops::dnn {

// ---- cuDNN's values ----
enum AttrType : int32_t {  // cudnnBackendAttributeType_t
  kTypeHandle = 0,
  kTypeDataType = 1,
  kTypeBoolean = 2,
  kTypeInt64 = 3,
  kTypeFloat = 4,
  kTypeDouble = 5,
  kTypeVoidPtr = 6,
  kTypeConvolutionMode = 7,
  kTypeHeurMode = 8,
  kTypeKnobType = 9,
  kTypeNanPropagation = 10,
  kTypeNumericalNote = 11,
  kTypeLayoutType = 12,
  kTypeAttribName = 13,
  kTypePointwiseMode = 14,
  kTypeBackendDescriptor = 15,
  kTypeReductionOperator = 18,
  kTypeBehaviorNote = 19,
  kTypeInt32 = 23,
  kTypeChar = 24,
  kTypeFraction = 26,
  kTypeNormMode = 27,
  kTypeNormFwdPhase = 28,
};
// Bytes of one element of `type` as the API passes it; 0 for a type Hiber does not carry.
size_t attr_element_bytes(int32_t type);

enum DescriptorType : int32_t {  // cudnnBackendDescriptorType_t
  kPointwise = 0,
  kConvolution = 1,
  kEngine = 2,
  kEngineCfg = 3,
  kEngineHeur = 4,
  kExecutionPlan = 5,
  // Knob choices and knob infos exist for the cudnn-frontend, which creates CUDNN_KNOB_TYPE_COUNTS
  // of each around every execution plan and engine it builds; Hiber's engines have no knobs.
  kKnobChoice = 7,
  kKnobInfo = 8,
  kOpConvForward = 10,
  kOpPointwise = 13,
  kOperationGraph = 15,
  kVariantPack = 16,
  kTensor = 17,
  kMatmul = 18,
  kOpMatmul = 19,
  kReduction = 21,
  kOpReduction = 22,
  kOpNormForward = 29,
};
std::string descriptor_type_name(int32_t type);

enum Attribute : int32_t {  // cudnnBackendAttributeName_t
  kPointwiseMode = 0,
  kPointwiseMathPrec = 1,
  kPointwiseReluLowerClip = 3,
  kPointwiseReluUpperClip = 4,
  kPointwiseReluLowerClipSlope = 5,
  kPointwiseAxis = 9,
  kConvCompType = 100,
  kConvMode = 101,
  kConvDilations = 102,
  kConvFilterStrides = 103,
  kConvPostPaddings = 104,
  kConvPrePaddings = 105,
  kConvSpatialDims = 106,
  kEngineHeurMode = 200,
  kEngineHeurOperationGraph = 201,
  kEngineHeurResults = 202,
  kEngineCfgEngine = 300,
  kEngineCfgKnobChoices = 302,
  kEngineCfgWorkspaceSize = 303,
  kPlanHandle = 400,
  kPlanEngineConfig = 401,
  kPlanWorkspaceSize = 402,
  kPlanComputedIntermediateUids = 403,
  kPlanRunOnlyIntermediateUids = 404,
  kPlanJson = 405,
  kKnobChoiceKnobType = 600,
  kKnobChoiceKnobValue = 601,
  kConvFwdAlpha = 700,
  kConvFwdBeta = 701,
  kConvFwdConvDesc = 702,
  kConvFwdW = 703,
  kConvFwdX = 704,
  kConvFwdY = 705,
  kOpPointwisePwDesc = 750,
  kOpPointwiseX = 751,
  kOpPointwiseB = 752,
  kOpPointwiseY = 753,
  kOpPointwiseAlpha1 = 754,
  kOpPointwiseAlpha2 = 755,
  kOpPointwiseT = 758,
  kOperationGraphHandle = 800,
  kOperationGraphOps = 801,
  kOperationGraphEngineGlobalCount = 802,
  kTensorByteAlignment = 900,
  kTensorDataType = 901,
  kTensorDimensions = 902,
  kTensorStrides = 903,
  kTensorVectorCount = 904,
  kTensorVectorizedDimension = 905,
  kTensorUniqueId = 906,
  kTensorIsVirtual = 907,
  kTensorIsByValue = 908,
  kVariantPackUniqueIds = 1000,
  kVariantPackDataPointers = 1001,
  kVariantPackIntermediates = 1002,
  kVariantPackWorkspace = 1003,
  kMatmulCompType = 1500,
  kOpMatmulA = 1520,
  kOpMatmulB = 1521,
  kOpMatmulC = 1522,
  kOpMatmulDesc = 1523,
  kReductionOperator = 1600,
  kReductionCompType = 1601,
  kOpReductionX = 1610,
  kOpReductionY = 1611,
  kOpReductionDesc = 1612,
  kNormFwdMode = 2000,
  kNormFwdPhase = 2001,
  kNormFwdX = 2002,
  kNormFwdMean = 2003,
  kNormFwdInvVariance = 2004,
  kNormFwdScale = 2005,
  kNormFwdBias = 2006,
  kNormFwdEpsilon = 2007,
  kNormFwdY = 2013,
  kEngineOperationGraph = 1300,
  kEngineGlobalIndex = 1301,
  kEngineKnobInfo = 1302,
  kEngineNumericalNote = 1303,
  kEngineLayoutInfo = 1304,
  kEngineBehaviorNote = 1305,
};

enum DataType : int32_t {  // cudnnDataType_t
  kFloat = 0,
  kDouble = 1,
  kHalf = 2,
  kInt8 = 3,
  kInt32 = 4,
  kUint8 = 6,
  kBfloat16 = 9,
  kInt64 = 10,
  kBoolean = 11,
};
// Bytes of one element; kNotSupported for a type Hiber does not carry.
Result<uint64_t> data_type_bytes(int32_t type);

// cudnnPointwiseMode_t: the modes Hiber interprets (pointwise_arity() says which; the simulated
// GPU runs them all).
enum PointwiseMode : int32_t {
  kPwAdd = 0,
  kPwMul = 1,
  kPwMin = 2,
  kPwMax = 3,
  kPwSqrt = 4,
  kPwAddSquare = 5,
  kPwDiv = 6,
  kPwPow = 8,
  kPwSub = 9,
  kPwAbs = 10,
  kPwExp = 13,
  kPwLog = 15,
  kPwNeg = 16,
  kPwRsqrt = 17,
  kPwErf = 20,
  kPwIdentity = 21,
  kPwReciprocal = 22,
  kPwReluFwd = 100,
  kPwTanhFwd = 101,
  kPwSigmoidFwd = 102,
  kPwGeluFwd = 104,
  kPwSwishFwd = 106,
  kPwGeluApproxTanhFwd = 107,
  kPwCmpEq = 300,
  kPwCmpNeq = 301,
  kPwCmpGt = 302,
  kPwCmpGe = 303,
  kPwCmpLt = 304,
  kPwCmpLe = 305,
  kPwLogicalAnd = 400,
  kPwLogicalOr = 401,
  kPwLogicalNot = 402,
  kPwGenIndex = 501,
  kPwBinarySelect = 601,
};
// The tensors a pointwise mode reads: 1 (X), 2 (X, B), 3 (X, B and T: BINARY_SELECT's
// condition, Y = T ? X : B) or 0 for a mode Hiber does not interpret. GEN_INDEX reads X for its
// shape only: Y holds each element's coordinate along CUDNN_ATTR_POINTWISE_AXIS.
int pointwise_arity(int32_t mode);

enum ReductionOperator : int32_t {  // cudnnReduceTensorOp_t
  kReduceAdd = 0,
  kReduceMul = 1,
  kReduceMin = 2,
  kReduceMax = 3,
  kReduceAmax = 4,
  kReduceAvg = 5,
  kReduceNorm1 = 6,
  kReduceNorm2 = 7,
};
enum NormMode : int32_t { kLayerNorm = 0, kRmsNorm = 4 };  // cudnnBackendNormMode_t (those run)
enum NormPhase : int32_t { kNormInference = 0, kNormTraining = 1 };  // cudnnBackendNormFwdPhase_t
inline constexpr int32_t kConvolutionMode = 0;       // CUDNN_CONVOLUTION: the filter flipped
inline constexpr int32_t kCrossCorrelationMode = 1;  // CUDNN_CROSS_CORRELATION

inline constexpr int kMaxDims = 8;     // CUDNN_DIM_MAX
inline constexpr int kMaxSpatial = 3;  // convolution and pooling: 1 to 3 spatial dimensions

// ---- Descriptor graphs ----
struct Attr {
  int32_t name = 0;
  int32_t type = 0;
  std::vector<std::byte> bytes;  // count * attr_element_bytes(type); kTypeBackendDescriptor:
                                 // uint64 positions of earlier descriptors
  size_t count() const;
};
struct Node {
  int32_t type = 0;  // DescriptorType
  std::vector<Attr> attrs;
  const Attr* find(int32_t name) const;
};
struct Graph {
  std::vector<Node> nodes;  // post-order: references point backwards; the root is last
};

inline constexpr size_t kMaxGraphNodes = 1024;
inline constexpr size_t kMaxNodeAttrs = 128;
inline constexpr size_t kMaxAttrElements = 4096;

std::vector<std::byte> encode_graph(const Graph& graph);
// kInvalidValue naming what is wrong for anything but a well-formed graph.
Result<Graph> decode_graph(std::span<const std::byte> bytes);

// ---- The operations a graph describes ----
struct Tensor {
  int64_t uid = 0;
  int32_t data_type = 0;
  int32_t rank = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
  bool is_virtual = false;
  bool by_value = false;
};
// Bytes from the first element to the end of the last: kInvalidValue beyond 2^48.
Result<uint64_t> tensor_extent(const Tensor& tensor);

enum class OpKind : uint8_t { kConvForward, kPointwise, kMatmul, kReduction, kNormForward };
struct Op {
  OpKind kind = OpKind::kConvForward;
  // Positions in OpGraph::tensors; -1: none. A matmul's A, B and C are x, w and y: C = A x B over
  // the last two dimensions ([.., M, K] x [.., K, N]), the leading ones batch (1 broadcasts).
  // A pointwise op's inputs are x, b and t; a reduction's x and y; a norm's x, w (scale), b
  // (bias), epsilon, y, mean and inv_variance (the last two written in the training phase).
  int x = -1, w = -1, b = -1, y = -1;
  int t = -1, epsilon = -1, mean = -1, inv_variance = -1;
  // Convolution forward.
  int32_t spatial = 0;
  int64_t pre_pad[kMaxSpatial] = {}, post_pad[kMaxSpatial] = {};
  int64_t stride[kMaxSpatial] = {}, dilation[kMaxSpatial] = {};
  int32_t conv_mode = kCrossCorrelationMode;
  int32_t compute_type = kFloat;  // convolution and matmul
  double alpha = 1, beta = 0;
  // Pointwise.
  int32_t pw_mode = 0;
  double alpha1 = 1, alpha2 = 1;
  double relu_lower = 0, relu_upper = 0, relu_slope = 0;
  bool has_relu_upper = false;
  int64_t axis = 0;  // GEN_INDEX
  // Reduction: Y's dimensions are X's or 1 (those reduced).
  int32_t reduce_op = 0;
  // Norm forward (layer or RMS norm): each X[n, ...] normalized over every dimension but the
  // first, then scaled (and shifted) per element by scale (and bias) of X's shape with N = 1.
  int32_t norm_mode = 0, norm_phase = 0;
};
// The tensors an operation reads and writes (positions in OpGraph::tensors).
std::vector<int> op_inputs(const Op& op);
std::vector<int> op_outputs(const Op& op);
struct OpGraph {
  std::vector<Tensor> tensors;  // one per unique id
  std::vector<Op> ops;
  // The tensor with `uid`, or -1.
  int find(int64_t uid) const;
};
// An OPERATIONGRAPH descriptor (the root of `graph`) as operations: kInvalidValue for a graph
// cuDNN would refuse (missing or mistyped attributes, shapes that do not agree), kNotSupported
// naming an operation Hiber cannot describe.
Result<OpGraph> interpret_operation_graph(const Graph& graph);
// What cuDNN checks when it finalizes the root descriptor of `graph`, for the types the client
// finalizes itself (tensor, convolution, matmul, pointwise, their operations, operation graph):
// required
// attributes present, of the right attribute type, and values and shapes that agree.
// kInvalidValue naming what is wrong; kNotSupported for any other descriptor type.
Status check_finalizable(const Graph& graph);
// An EXECUTION_PLAN descriptor (the root): its operation graph and engine.
struct Plan {
  OpGraph graph;
  int64_t engine = 0;
};
Result<Plan> interpret_plan(const Graph& graph);

// ---- Calls ----
// kDnnFinalize (a query): the arguments are an encoded OPERATIONGRAPH graph; the answer is a
// FinalizeAnswer followed by `engines` EngineSupport, one per global engine index, in index order
// (the client finds an engine by its index). The order of the heuristic's results is each entry's
// `heuristic_rank`: the client lists the ranked supported engines first, by rank, then the others
// in index order (an answer with every rank 0, as the simulated GPU's, is index order).
struct FinalizeAnswer {
  uint32_t engines = 0;  // CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT
  uint32_t reserved = 0;
};
struct EngineSupport {
  int64_t global_index = 0;
  uint64_t workspace_bytes = 0;
  uint32_t supported = 0;        // 1: the engine runs the graph
  uint32_t numerical_notes = 0;  // bit n: cudnnBackendNumericalNote_t n
  uint32_t behavior_notes = 0;   // bit n: cudnnBackendBehaviorNote_t n
  // 1 + the engine's position in cuDNN's heuristic results (CUDNN_HEUR_MODE_INSTANT) for the
  // graph; 0: the heuristic did not return it (or did not run).
  uint32_t heuristic_rank = 0;
  char why[224] = {};  // unsupported: why, NUL-terminated
};
static_assert(std::has_unique_object_representations_v<FinalizeAnswer>);
static_assert(std::has_unique_object_representations_v<EngineSupport>);
std::vector<std::byte> encode_finalize_answer(std::span<const EngineSupport> engines);
Result<std::vector<EngineSupport>> decode_finalize_answer(std::span<const std::byte> bytes);
// The supported engines of an answer as CUDNN_ATTR_ENGINEHEUR_RESULTS lists them: by
// heuristic_rank, then the unranked ones in index order.
std::vector<const EngineSupport*> heuristic_results(std::span<const EngineSupport> engines);

// kDnnDefineGraph: this header, then an encoded EXECUTION_PLAN graph. The id is the client's,
// unique in its session.
struct DefineGraphHeader {
  uint64_t graph_id = 0;
};
// kDnnExecute: this header, then `count` VariantEntry, then (protocol 1.10) `by_value_count`
// ByValueEntry: the by-value tensors' (CUDNN_ATTR_TENSOR_IS_BY_VALUE) values. The program's
// variant pack gives a by-value tensor a host pointer of its own process, so the client sends
// what it points at: one element of the tensor's data type (a scale, an epsilon, a fill value).
struct ExecuteHeader {
  uint64_t graph_id = 0;
  uint64_t workspace = 0;
  uint64_t workspace_bytes = 0;  // the plan's workspace size, as finalized
  uint32_t count = 0;
  uint32_t by_value_count = 0;
};
struct VariantEntry {
  int64_t uid = 0;
  uint64_t ptr = 0;
};
inline constexpr size_t kMaxByValueBytes = 16;
struct ByValueEntry {
  int64_t uid = 0;
  std::byte value[kMaxByValueBytes] = {};  // the element's bytes, zero-padded
};
static_assert(std::has_unique_object_representations_v<ExecuteHeader>);
static_assert(std::has_unique_object_representations_v<VariantEntry>);
static_assert(std::has_unique_object_representations_v<ByValueEntry>);
inline constexpr size_t kMaxVariantEntries = 4096;
inline constexpr size_t kMaxSessionGraphs = 4096;

struct Execute {
  ExecuteHeader header;
  std::vector<VariantEntry> entries;
  std::vector<ByValueEntry> by_value;
};
std::vector<std::byte> encode_execute(const Execute& execute);
Result<Execute> decode_execute(std::span<const std::byte> bytes);
std::vector<std::byte> encode_define_graph(uint64_t graph_id, std::span<const std::byte> graph);
Result<std::pair<uint64_t, Graph>> decode_define_graph(std::span<const std::byte> bytes);

// A plan's tensors bound to the addresses of a variant pack: kInvalidValue for a uid the plan
// does not have, a non-virtual tensor without an address (a by-value one: without its value, or
// with an address), or a workspace smaller than needed. A by-value tensor is one element of at
// most kMaxByValueBytes.
struct Bound {
  uint64_t ptr = 0;    // 0 for virtual and by-value tensors
  uint64_t bytes = 0;  // the extent at ptr
  bool by_value = false;
  std::byte value[kMaxByValueBytes] = {};  // by_value: the element
};
Result<std::vector<Bound>> bind_variant_pack(const OpGraph& graph, const Execute& execute);

// ---- Legacy calls ----
// A tensor descriptor (cudnnTensorDescriptor_t) by value; strides in elements.
struct TensorShape {
  int32_t data_type = 0;
  int32_t rank = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};
static_assert(std::has_unique_object_representations_v<TensorShape>);
Tensor as_tensor(const TensorShape& shape);
// Rank 3..8, dims >= 1, strides >= 1, a carried data type; kInvalidValue naming `what`.
Status check_shape(const TensorShape& shape, std::string_view what);

// alpha and beta travel as double (cuDNN reads them as double for double data, float otherwise).
struct BatchNormInference {
  TensorShape x, y, bn;  // bn: scale, bias, mean and variance all have this shape
  uint64_t x_ptr = 0, y_ptr = 0, scale = 0, bias = 0, mean = 0, variance = 0;
  double alpha = 1, beta = 0, epsilon = 0;
  int32_t mode = 0;  // cudnnBatchNormMode_t: 0 per activation, 1 spatial, 2 spatial persistent
  int32_t reserved = 0;
};
struct Pooling {
  TensorShape x, y;
  uint64_t x_ptr = 0, y_ptr = 0;
  double alpha = 1, beta = 0;
  int32_t mode = 0;  // cudnnPoolingMode_t
  int32_t nan_propagation = 0;
  int32_t spatial = 0;
  int32_t reserved = 0;
  int64_t window[kMaxSpatial] = {}, pad[kMaxSpatial] = {}, stride[kMaxSpatial] = {};
};
struct Activation {
  TensorShape x, y;
  uint64_t x_ptr = 0, y_ptr = 0;
  double alpha = 1, beta = 0, coef = 0;
  int32_t mode = 0;  // cudnnActivationMode_t
  int32_t nan_propagation = 0;
};
struct Softmax {
  TensorShape x, y;
  uint64_t x_ptr = 0, y_ptr = 0;
  double alpha = 1, beta = 0;
  int32_t algorithm = 0;  // cudnnSoftmaxAlgorithm_t
  int32_t mode = 0;       // cudnnSoftmaxMode_t
};
struct AddTensor {
  TensorShape a, c;  // C = alpha * A + beta * C; A's dims are C's or 1 (broadcast)
  uint64_t a_ptr = 0, c_ptr = 0;
  double alpha = 1, beta = 0;
};
// No padding on the wire (doubles rule out has_unique_object_representations): each size is the
// sum of its fields'.
static_assert(sizeof(BatchNormInference) == 3 * sizeof(TensorShape) + 6 * 8 + 3 * 8 + 2 * 4);
static_assert(sizeof(Pooling) == 2 * sizeof(TensorShape) + 2 * 8 + 2 * 8 + 4 * 4 + 9 * 8);
static_assert(sizeof(Activation) == 2 * sizeof(TensorShape) + 2 * 8 + 3 * 8 + 2 * 4);
static_assert(sizeof(Softmax) == 2 * sizeof(TensorShape) + 2 * 8 + 2 * 8 + 2 * 4);
static_assert(sizeof(AddTensor) == 2 * sizeof(TensorShape) + 2 * 8 + 2 * 8);

// The values of each legacy call checked as cuDNN checks them (CUDNN_STATUS_BAD_PARAM there,
// kInvalidValue here; kNotSupported for a mode Hiber does not run).
Status check_op(const BatchNormInference& op);
Status check_op(const Pooling& op);
Status check_op(const Activation& op);
Status check_op(const Softmax& op);
Status check_op(const AddTensor& op);
// Pooling's output dims for an input (cudnnGetPoolingNdForwardOutputDim).
int64_t pooled_dim(int64_t in, int64_t window, int64_t pad, int64_t stride);
// Convolution's output dims (cudnnGetConvolutionNdForwardOutputDim).
int64_t convolved_dim(int64_t in, int64_t filter, int64_t pre, int64_t post, int64_t stride,
                      int64_t dilation);

}  // namespace hiber::library_ops::dnn
