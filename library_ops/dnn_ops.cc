#include "library_ops/dnn_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace hiber::library_ops::dnn {
namespace {

constexpr uint32_t kGraphMagic = 0x31474448;  // "HDG1"
constexpr int64_t kMaxExtent = int64_t{1} << 48;

// ---- Byte reading with bounds checks ----
class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <typename T>
  Result<T> read(std::string_view what) {
    if (bytes_.size() - offset_ < sizeof(T))
      return error(ErrorCode::kInvalidValue, "cuDNN graph: truncated at byte ", offset_,
                   " reading ", what);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  Result<std::span<const std::byte>> take(size_t n, std::string_view what) {
    if (bytes_.size() - offset_ < n)
      return error(ErrorCode::kInvalidValue, "cuDNN graph: ", what, " needs ", n, " bytes, only ",
                   bytes_.size() - offset_, " remain");
    auto out = bytes_.subspan(offset_, n);
    offset_ += n;
    return out;
  }
  bool done() const { return offset_ == bytes_.size(); }
  size_t offset() const { return offset_; }

 private:
  std::span<const std::byte> bytes_;
  size_t offset_ = 0;
};

// (resize and memcpy: GCC 12 warns falsely of an overflow in vector::insert of a struct's bytes)
template <typename T>
void append(std::vector<std::byte>& out, const T& value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

// ---- Reading attributes of a decoded graph ----
const char* attr_what(int32_t name) {
  switch (name) {
    case kTensorDataType: return "CUDNN_ATTR_TENSOR_DATA_TYPE";
    case kTensorDimensions: return "CUDNN_ATTR_TENSOR_DIMENSIONS";
    case kTensorStrides: return "CUDNN_ATTR_TENSOR_STRIDES";
    case kTensorUniqueId: return "CUDNN_ATTR_TENSOR_UNIQUE_ID";
    case kConvFwdX: return "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X";
    case kConvFwdW: return "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W";
    case kConvFwdY: return "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y";
    case kConvFwdConvDesc: return "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC";
    case kConvFwdAlpha: return "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA";
    case kConvFwdBeta: return "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA";
    case kOperationGraphOps: return "CUDNN_ATTR_OPERATIONGRAPH_OPS";
    case kPlanEngineConfig: return "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG";
    case kEngineCfgEngine: return "CUDNN_ATTR_ENGINECFG_ENGINE";
    case kEngineOperationGraph: return "CUDNN_ATTR_ENGINE_OPERATION_GRAPH";
    case kEngineGlobalIndex: return "CUDNN_ATTR_ENGINE_GLOBAL_INDEX";
    case kOpPointwisePwDesc: return "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR";
    case kOpPointwiseX: return "CUDNN_ATTR_OPERATION_POINTWISE_XDESC";
    case kOpPointwiseB: return "CUDNN_ATTR_OPERATION_POINTWISE_BDESC";
    case kOpPointwiseY: return "CUDNN_ATTR_OPERATION_POINTWISE_YDESC";
    case kPointwiseMode: return "CUDNN_ATTR_POINTWISE_MODE";
    case kConvSpatialDims: return "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS";
    case kConvMode: return "CUDNN_ATTR_CONVOLUTION_CONV_MODE";
    case kConvCompType: return "CUDNN_ATTR_CONVOLUTION_COMP_TYPE";
    case kConvPrePaddings: return "CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS";
    case kConvPostPaddings: return "CUDNN_ATTR_CONVOLUTION_POST_PADDINGS";
    case kConvFilterStrides: return "CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES";
    case kConvDilations: return "CUDNN_ATTR_CONVOLUTION_DILATIONS";
    case kMatmulCompType: return "CUDNN_ATTR_MATMUL_COMP_TYPE";
    case kOpMatmulA: return "CUDNN_ATTR_OPERATION_MATMUL_ADESC";
    case kOpMatmulB: return "CUDNN_ATTR_OPERATION_MATMUL_BDESC";
    case kOpMatmulC: return "CUDNN_ATTR_OPERATION_MATMUL_CDESC";
    case kOpMatmulDesc: return "CUDNN_ATTR_OPERATION_MATMUL_DESC";
    case kOpPointwiseT: return "CUDNN_ATTR_OPERATION_POINTWISE_TDESC";
    case kPointwiseAxis: return "CUDNN_ATTR_POINTWISE_AXIS";
    case kReductionOperator: return "CUDNN_ATTR_REDUCTION_OPERATOR";
    case kReductionCompType: return "CUDNN_ATTR_REDUCTION_COMP_TYPE";
    case kOpReductionX: return "CUDNN_ATTR_OPERATION_REDUCTION_XDESC";
    case kOpReductionY: return "CUDNN_ATTR_OPERATION_REDUCTION_YDESC";
    case kOpReductionDesc: return "CUDNN_ATTR_OPERATION_REDUCTION_DESC";
    case kNormFwdMode: return "CUDNN_ATTR_OPERATION_NORM_FWD_MODE";
    case kNormFwdPhase: return "CUDNN_ATTR_OPERATION_NORM_FWD_PHASE";
    case kNormFwdX: return "CUDNN_ATTR_OPERATION_NORM_FWD_XDESC";
    case kNormFwdMean: return "CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC";
    case kNormFwdInvVariance: return "CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC";
    case kNormFwdScale: return "CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC";
    case kNormFwdBias: return "CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC";
    case kNormFwdEpsilon: return "CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC";
    case kNormFwdY: return "CUDNN_ATTR_OPERATION_NORM_FWD_YDESC";
  }
  return "an attribute";
}

// The attribute `name` of `node`, of one of `types`: kInvalidValue if missing (when required)
// or mistyped.
Result<const Attr*> attr_of(const Node& node, int32_t name, std::initializer_list<int32_t> types,
                            bool required) {
  const Attr* a = node.find(name);
  if (a == nullptr) {
    if (!required) return static_cast<const Attr*>(nullptr);
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " (", name, ") is not set");
  }
  if (std::find(types.begin(), types.end(), a->type) == types.end())
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " (", name, ") has attribute type ", a->type);
  return a;
}

template <typename T>
T element(const Attr& a, size_t i) {
  T v;
  std::memcpy(&v, a.bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

Result<std::vector<int64_t>> int64s(const Node& node, int32_t name) {
  HIBER_ASSIGN_OR_RETURN(const Attr* a, attr_of(node, name, {kTypeInt64}, true));
  std::vector<int64_t> out(a->count());
  for (size_t i = 0; i < out.size(); ++i) out[i] = element<int64_t>(*a, i);
  return out;
}

Result<int64_t> int64_one(const Node& node, int32_t name) {
  HIBER_ASSIGN_OR_RETURN(auto v, int64s(node, name));
  if (v.size() != 1)
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " has ", v.size(), " elements, 1 expected");
  return v[0];
}

// A 4-byte enum attribute (data type, mode, ...).
Result<int32_t> enum_one(const Node& node, int32_t name, int32_t type) {
  HIBER_ASSIGN_OR_RETURN(const Attr* a, attr_of(node, name, {type}, true));
  if (a->count() != 1)
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " has ", a->count(), " elements, 1 expected");
  return element<int32_t>(*a, 0);
}

// A FLOAT or DOUBLE scalar (convolution alpha/beta arrive as either, by compute type).
Result<double> real_one(const Node& node, int32_t name, bool required, double fallback) {
  HIBER_ASSIGN_OR_RETURN(const Attr* a, attr_of(node, name, {kTypeFloat, kTypeDouble}, required));
  if (a == nullptr) return fallback;
  if (a->count() != 1)
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " has ", a->count(), " elements, 1 expected");
  return a->type == kTypeFloat ? element<float>(*a, 0) : element<double>(*a, 0);
}

// The descriptor a one-element descriptor attribute references, checked to be of `type`.
Result<size_t> ref_one(const Graph& g, const Node& node, int32_t name, int32_t type,
                       bool required) {
  HIBER_ASSIGN_OR_RETURN(const Attr* a, attr_of(node, name, {kTypeBackendDescriptor}, required));
  if (a == nullptr) return SIZE_MAX;
  if (a->count() != 1)
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " has ", a->count(), " elements, 1 expected");
  const uint64_t at = element<uint64_t>(*a, 0);  // decode_graph checked the position
  if (g.nodes[at].type != type)
    return error(ErrorCode::kInvalidValue, descriptor_type_name(node.type), ": ", attr_what(name),
                 " is a ", descriptor_type_name(g.nodes[at].type), ", not a ",
                 descriptor_type_name(type));
  return static_cast<size_t>(at);
}

Result<Tensor> tensor_of(const Node& node) {
  Tensor t;
  HIBER_ASSIGN_OR_RETURN(t.data_type, enum_one(node, kTensorDataType, kTypeDataType));
  HIBER_RETURN_IF_ERROR(data_type_bytes(t.data_type).status());
  HIBER_ASSIGN_OR_RETURN(auto dims, int64s(node, kTensorDimensions));
  HIBER_ASSIGN_OR_RETURN(auto strides, int64s(node, kTensorStrides));
  HIBER_ASSIGN_OR_RETURN(t.uid, int64_one(node, kTensorUniqueId));
  if (dims.size() != strides.size() || dims.empty() || dims.size() > kMaxDims)
    return error(ErrorCode::kInvalidValue, "tensor ", t.uid, ": ", dims.size(), " dimensions and ",
                 strides.size(), " strides (1 to ", kMaxDims, ", as many of each)");
  t.rank = static_cast<int32_t>(dims.size());
  for (int i = 0; i < t.rank; ++i) {
    if (dims[i] < 1 || strides[i] < 1)
      return error(ErrorCode::kInvalidValue, "tensor ", t.uid, ": dimension ", i, " is ", dims[i],
                   " with stride ", strides[i], " (both must be positive)");
    t.dims[i] = dims[i];
    t.strides[i] = strides[i];
  }
  if (const Attr* v = node.find(kTensorIsVirtual); v != nullptr) {
    if (v->type != kTypeBoolean || v->count() != 1)
      return error(ErrorCode::kInvalidValue, "tensor ", t.uid,
                   ": CUDNN_ATTR_TENSOR_IS_VIRTUAL must be one BOOLEAN");
    t.is_virtual = v->bytes[0] != std::byte{0};
  }
  if (const Attr* v = node.find(kTensorIsByValue);
      v != nullptr && v->type == kTypeBoolean && v->count() == 1 && v->bytes[0] != std::byte{0})
    t.by_value = true;
  HIBER_RETURN_IF_ERROR(tensor_extent(t).status());
  return t;
}

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.data_type != b.data_type || a.rank != b.rank || a.is_virtual != b.is_virtual) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a.dims[i] != b.dims[i] || a.strides[i] != b.strides[i]) return false;
  return true;
}

// Adds the tensor at node `at` (or finds the same uid): its position in `out.tensors`.
Result<int> add_tensor(const Graph& g, size_t at, OpGraph& out) {
  HIBER_ASSIGN_OR_RETURN(Tensor t, tensor_of(g.nodes[at]));
  const int found = out.find(t.uid);
  if (found >= 0) {
    if (!same_shape(out.tensors[found], t))
      return error(ErrorCode::kInvalidValue, "two tensors have unique id ", t.uid,
                   " but differ in type, shape or virtuality");
    return found;
  }
  out.tensors.push_back(t);
  return static_cast<int>(out.tensors.size() - 1);
}

// A CONVOLUTION descriptor's values, into `op`.
Status conv_desc(const Node& conv, Op& op) {
  HIBER_ASSIGN_OR_RETURN(op.compute_type, enum_one(conv, kConvCompType, kTypeDataType));
  HIBER_ASSIGN_OR_RETURN(op.conv_mode, enum_one(conv, kConvMode, kTypeConvolutionMode));
  HIBER_ASSIGN_OR_RETURN(int64_t spatial, int64_one(conv, kConvSpatialDims));
  if (spatial < 1 || spatial > kMaxSpatial)
    return error(ErrorCode::kNotSupported, "convolution with ", spatial,
                 " spatial dimensions (Hiber runs 1 to 3)");
  op.spatial = static_cast<int32_t>(spatial);
  struct {
    int32_t name;
    int64_t* into;
    int64_t min;
  } lists[] = {{kConvPrePaddings, op.pre_pad, 0},
               {kConvPostPaddings, op.post_pad, 0},
               {kConvFilterStrides, op.stride, 1},
               {kConvDilations, op.dilation, 1}};
  for (auto& l : lists) {
    HIBER_ASSIGN_OR_RETURN(auto v, int64s(conv, l.name));
    if (static_cast<int64_t>(v.size()) != spatial)
      return error(ErrorCode::kInvalidValue, "convolution: ", attr_what(l.name), " has ", v.size(),
                   " elements for ", spatial, " spatial dimensions");
    for (int64_t i = 0; i < spatial; ++i) {
      if (v[i] < l.min || v[i] > (int64_t{1} << 24))
        return error(ErrorCode::kInvalidValue, "convolution: ", attr_what(l.name), "[", i,
                     "] = ", v[i]);
      l.into[i] = v[i];
    }
  }
  if (op.conv_mode != kConvolutionMode && op.conv_mode != kCrossCorrelationMode)
    return error(ErrorCode::kInvalidValue, "convolution mode ", op.conv_mode);
  return Status();
}

Status conv_forward(const Graph& g, const Node& node, OpGraph& out) {
  Op op;
  op.kind = OpKind::kConvForward;
  HIBER_ASSIGN_OR_RETURN(size_t x, ref_one(g, node, kConvFwdX, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t w, ref_one(g, node, kConvFwdW, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t y, ref_one(g, node, kConvFwdY, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t c, ref_one(g, node, kConvFwdConvDesc, kConvolution, true));
  HIBER_ASSIGN_OR_RETURN(op.x, add_tensor(g, x, out));
  HIBER_ASSIGN_OR_RETURN(op.w, add_tensor(g, w, out));
  HIBER_ASSIGN_OR_RETURN(op.y, add_tensor(g, y, out));
  HIBER_ASSIGN_OR_RETURN(op.alpha, real_one(node, kConvFwdAlpha, false, 1.0));
  HIBER_ASSIGN_OR_RETURN(op.beta, real_one(node, kConvFwdBeta, false, 0.0));
  HIBER_RETURN_IF_ERROR(conv_desc(g.nodes[c], op));
  const Tensor& tx = out.tensors[op.x];
  const Tensor& tw = out.tensors[op.w];
  const Tensor& ty = out.tensors[op.y];
  const int rank = 2 + op.spatial;
  if (tx.rank != rank || tw.rank != rank || ty.rank != rank)
    return error(ErrorCode::kInvalidValue, "convolution forward: X, W and Y have ranks ", tx.rank,
                 ", ", tw.rank, " and ", ty.rank, "; ", rank, " expected for ", op.spatial,
                 " spatial dimensions");
  // Groups: X has C channels, W has C / groups per filter and K filters, K a multiple of groups.
  if (tx.dims[1] % tw.dims[1] != 0 || tw.dims[0] % (tx.dims[1] / tw.dims[1]) != 0)
    return error(ErrorCode::kInvalidValue, "convolution forward: X has ", tx.dims[1],
                 " channels, W has ", tw.dims[0], " filters of ", tw.dims[1],
                 " channels: not a grouped convolution");
  bool ok = ty.dims[0] == tx.dims[0] && ty.dims[1] == tw.dims[0];
  for (int i = 0; i < op.spatial; ++i) {
    const int64_t want = convolved_dim(tx.dims[2 + i], tw.dims[2 + i], op.pre_pad[i],
                                       op.post_pad[i], op.stride[i], op.dilation[i]);
    ok = ok && want >= 1 && ty.dims[2 + i] == want;
  }
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "convolution forward: Y's dimensions are not those X, W and the convolution "
                 "give");
  out.ops.push_back(op);
  return Status();
}

Status matmul(const Graph& g, const Node& node, OpGraph& out) {
  Op op;
  op.kind = OpKind::kMatmul;
  HIBER_ASSIGN_OR_RETURN(size_t a, ref_one(g, node, kOpMatmulA, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t b, ref_one(g, node, kOpMatmulB, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t c, ref_one(g, node, kOpMatmulC, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t desc, ref_one(g, node, kOpMatmulDesc, kMatmul, true));
  HIBER_ASSIGN_OR_RETURN(op.compute_type, enum_one(g.nodes[desc], kMatmulCompType, kTypeDataType));
  HIBER_ASSIGN_OR_RETURN(op.x, add_tensor(g, a, out));
  HIBER_ASSIGN_OR_RETURN(op.w, add_tensor(g, b, out));
  HIBER_ASSIGN_OR_RETURN(op.y, add_tensor(g, c, out));
  const Tensor& ta = out.tensors[op.x];
  const Tensor& tb = out.tensors[op.w];
  const Tensor& tc = out.tensors[op.y];
  const int r = tc.rank;
  bool ok = r >= 2 && ta.rank == r && tb.rank == r && ta.dims[r - 2] == tc.dims[r - 2] &&
            tb.dims[r - 1] == tc.dims[r - 1] && ta.dims[r - 1] == tb.dims[r - 2];
  for (int i = 0; ok && i < r - 2; ++i) {
    ok = (ta.dims[i] == tc.dims[i] || ta.dims[i] == 1) &&
         (tb.dims[i] == tc.dims[i] || tb.dims[i] == 1);
  }
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "matmul: A, B and C are not [.., M, K], [.., K, N] and [.., M, N] of one rank "
                 "(batch dimensions equal or 1)");
  out.ops.push_back(op);
  return Status();
}

constexpr const char* kPointwiseModes =
    "ADD, MUL, MIN, MAX, SQRT, ADD_SQUARE, DIV, POW, SUB, ABS, EXP, LOG, NEG, RSQRT, ERF, "
    "IDENTITY, RECIPROCAL, RELU_FWD, TANH_FWD, SIGMOID_FWD, GELU_FWD, SWISH_FWD, "
    "GELU_APPROX_TANH_FWD, CMP_*, LOGICAL_*, GEN_INDEX, BINARY_SELECT";

Status known_pointwise(int32_t mode) {
  if (pointwise_arity(mode) == 0)
    return error(ErrorCode::kNotSupported, "pointwise mode ", mode, " (Hiber runs ",
                 kPointwiseModes, ")");
  return Status();
}

Status known_reduction(int32_t op) {
  if (op < kReduceAdd || op > kReduceNorm2)
    return error(ErrorCode::kNotSupported, "reduction operator ", op,
                 " (Hiber runs ADD, MUL, MIN, MAX, AMAX, AVG, NORM1, NORM2)");
  return Status();
}

// `t`'s dimensions are `y`'s, or 1 where `broadcast` (of one rank).
bool fits(const Tensor& t, const Tensor& y, bool broadcast) {
  if (t.rank != y.rank) return false;
  for (int i = 0; i < y.rank; ++i)
    if (t.dims[i] != y.dims[i] && !(broadcast && t.dims[i] == 1)) return false;
  return true;
}

int64_t elements(const Tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.dims[i];
  return n;
}

Status pointwise(const Graph& g, const Node& node, OpGraph& out) {
  Op op;
  op.kind = OpKind::kPointwise;
  HIBER_ASSIGN_OR_RETURN(size_t pw, ref_one(g, node, kOpPointwisePwDesc, kPointwise, true));
  const Node& desc = g.nodes[pw];
  HIBER_ASSIGN_OR_RETURN(op.pw_mode, enum_one(desc, kPointwiseMode, kTypePointwiseMode));
  HIBER_RETURN_IF_ERROR(known_pointwise(op.pw_mode));
  const int arity = pointwise_arity(op.pw_mode);
  HIBER_ASSIGN_OR_RETURN(op.relu_lower, real_one(desc, kPointwiseReluLowerClip, false, 0.0));
  HIBER_ASSIGN_OR_RETURN(op.relu_slope, real_one(desc, kPointwiseReluLowerClipSlope, false, 0.0));
  if (desc.find(kPointwiseReluUpperClip) != nullptr) {
    HIBER_ASSIGN_OR_RETURN(op.relu_upper, real_one(desc, kPointwiseReluUpperClip, true, 0.0));
    op.has_relu_upper = true;
  }
  if (op.pw_mode == kPwGenIndex) {
    HIBER_ASSIGN_OR_RETURN(op.axis, int64_one(desc, kPointwiseAxis));
  }
  HIBER_ASSIGN_OR_RETURN(size_t x, ref_one(g, node, kOpPointwiseX, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t y, ref_one(g, node, kOpPointwiseY, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t b, ref_one(g, node, kOpPointwiseB, kTensor, arity >= 2));
  HIBER_ASSIGN_OR_RETURN(size_t t, ref_one(g, node, kOpPointwiseT, kTensor, arity == 3));
  HIBER_ASSIGN_OR_RETURN(op.x, add_tensor(g, x, out));
  HIBER_ASSIGN_OR_RETURN(op.y, add_tensor(g, y, out));
  if (b != SIZE_MAX && arity >= 2) {
    HIBER_ASSIGN_OR_RETURN(op.b, add_tensor(g, b, out));
  }
  if (t != SIZE_MAX && arity == 3) {
    HIBER_ASSIGN_OR_RETURN(op.t, add_tensor(g, t, out));
  }
  HIBER_ASSIGN_OR_RETURN(op.alpha1, real_one(node, kOpPointwiseAlpha1, false, 1.0));
  HIBER_ASSIGN_OR_RETURN(op.alpha2, real_one(node, kOpPointwiseAlpha2, false, 1.0));
  // Y has the shape of the operation; X, B and T each have it or broadcast (dimensions of 1).
  const Tensor& ty = out.tensors[op.y];
  bool ok = fits(out.tensors[op.x], ty, true);
  if (op.b >= 0) ok = ok && fits(out.tensors[op.b], ty, true);
  if (op.t >= 0) ok = ok && fits(out.tensors[op.t], ty, true);
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "pointwise operation: X, B and T do not have Y's shape (each may broadcast "
                 "dimensions of 1)");
  if (op.pw_mode == kPwGenIndex && (op.axis < 0 || op.axis >= ty.rank))
    return error(ErrorCode::kInvalidValue, "pointwise GEN_INDEX: axis ", op.axis,
                 " of a tensor of rank ", ty.rank);
  out.ops.push_back(op);
  return Status();
}

Status reduction(const Graph& g, const Node& node, OpGraph& out) {
  Op op;
  op.kind = OpKind::kReduction;
  HIBER_ASSIGN_OR_RETURN(size_t desc, ref_one(g, node, kOpReductionDesc, kReduction, true));
  HIBER_ASSIGN_OR_RETURN(op.reduce_op,
                         enum_one(g.nodes[desc], kReductionOperator, kTypeReductionOperator));
  HIBER_RETURN_IF_ERROR(known_reduction(op.reduce_op));
  if (g.nodes[desc].find(kReductionCompType) != nullptr) {
    HIBER_ASSIGN_OR_RETURN(op.compute_type,
                           enum_one(g.nodes[desc], kReductionCompType, kTypeDataType));
  }
  HIBER_ASSIGN_OR_RETURN(size_t x, ref_one(g, node, kOpReductionX, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(size_t y, ref_one(g, node, kOpReductionY, kTensor, true));
  HIBER_ASSIGN_OR_RETURN(op.x, add_tensor(g, x, out));
  HIBER_ASSIGN_OR_RETURN(op.y, add_tensor(g, y, out));
  if (!fits(out.tensors[op.y], out.tensors[op.x], true))
    return error(ErrorCode::kInvalidValue,
                 "reduction: Y's dimensions must be X's, or 1 where X is reduced");
  out.ops.push_back(op);
  return Status();
}

Status norm_forward(const Graph& g, const Node& node, OpGraph& out) {
  Op op;
  op.kind = OpKind::kNormForward;
  HIBER_ASSIGN_OR_RETURN(op.norm_mode, enum_one(node, kNormFwdMode, kTypeNormMode));
  HIBER_ASSIGN_OR_RETURN(op.norm_phase, enum_one(node, kNormFwdPhase, kTypeNormFwdPhase));
  if (op.norm_mode != kLayerNorm && op.norm_mode != kRmsNorm)
    return error(ErrorCode::kNotSupported, "norm forward: mode ", op.norm_mode,
                 " (Hiber runs CUDNN_LAYER_NORM and CUDNN_RMS_NORM)");
  if (op.norm_phase != kNormInference && op.norm_phase != kNormTraining)
    return error(ErrorCode::kInvalidValue, "norm forward: phase ", op.norm_phase);
  const bool training = op.norm_phase == kNormTraining;
  const bool layer = op.norm_mode == kLayerNorm;
  struct {
    int32_t name;
    int* into;
    bool required;
  } refs[] = {{kNormFwdX, &op.x, true},
              {kNormFwdY, &op.y, true},
              {kNormFwdScale, &op.w, true},
              {kNormFwdBias, &op.b, layer},
              {kNormFwdEpsilon, &op.epsilon, true},
              {kNormFwdMean, &op.mean, training && layer},
              {kNormFwdInvVariance, &op.inv_variance, training}};
  for (auto& r : refs) {
    HIBER_ASSIGN_OR_RETURN(size_t at, ref_one(g, node, r.name, kTensor, r.required));
    if (at == SIZE_MAX) continue;
    if (!training && (r.name == kNormFwdMean || r.name == kNormFwdInvVariance))
      return error(ErrorCode::kInvalidValue, "norm forward: ", attr_what(r.name),
                   " is set in the inference phase, which writes no statistics");
    if (!layer && r.name == kNormFwdMean)
      return error(ErrorCode::kInvalidValue,
                   "norm forward: RMS norm has no mean (CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC)");
    HIBER_ASSIGN_OR_RETURN(*r.into, add_tensor(g, at, out));
  }
  const Tensor& tx = out.tensors[op.x];
  bool ok = fits(out.tensors[op.y], tx, false) && tx.rank >= 2;
  // Scale and bias: one value per normalized element (N = 1; dimensions of 1 broadcast).
  for (int p : {op.w, op.b}) {
    if (p < 0) continue;
    const Tensor& t = out.tensors[p];
    ok = ok && fits(t, tx, true) && t.dims[0] == 1;
  }
  // Statistics: one per row (N x 1 x ... x 1).
  for (int p : {op.mean, op.inv_variance}) {
    if (p < 0) continue;
    const Tensor& t = out.tensors[p];
    ok = ok && t.rank == tx.rank && t.dims[0] == tx.dims[0] && elements(t) == tx.dims[0];
  }
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "norm forward: Y must have X's shape, scale and bias X's with N = 1 (or 1s), "
                 "mean and inverse variance N x 1 x ... x 1");
  if (elements(out.tensors[op.epsilon]) != 1)
    return error(ErrorCode::kInvalidValue, "norm forward: epsilon must be one element");
  out.ops.push_back(op);
  return Status();
}

}  // namespace

int pointwise_arity(int32_t mode) {
  switch (mode) {
    case kPwSqrt:
    case kPwAbs:
    case kPwExp:
    case kPwLog:
    case kPwNeg:
    case kPwRsqrt:
    case kPwErf:
    case kPwIdentity:
    case kPwReciprocal:
    case kPwReluFwd:
    case kPwTanhFwd:
    case kPwSigmoidFwd:
    case kPwGeluFwd:
    case kPwSwishFwd:
    case kPwGeluApproxTanhFwd:
    case kPwLogicalNot:
    case kPwGenIndex: return 1;
    case kPwAdd:
    case kPwMul:
    case kPwMin:
    case kPwMax:
    case kPwAddSquare:
    case kPwDiv:
    case kPwPow:
    case kPwSub:
    case kPwCmpEq:
    case kPwCmpNeq:
    case kPwCmpGt:
    case kPwCmpGe:
    case kPwCmpLt:
    case kPwCmpLe:
    case kPwLogicalAnd:
    case kPwLogicalOr: return 2;
    case kPwBinarySelect: return 3;
  }
  return 0;
}

std::vector<int> op_inputs(const Op& op) {
  std::vector<int> in;
  for (int p : {op.x, op.w, op.b, op.t, op.epsilon})
    if (p >= 0) in.push_back(p);
  return in;
}

std::vector<int> op_outputs(const Op& op) {
  std::vector<int> written;
  for (int p : {op.y, op.mean, op.inv_variance})
    if (p >= 0) written.push_back(p);
  return written;
}

size_t attr_element_bytes(int32_t type) {
  switch (type) {
    case kTypeHandle:
    case kTypeInt64:
    case kTypeDouble:
    case kTypeVoidPtr:
    case kTypeBackendDescriptor: return 8;
    case kTypeBoolean:
    case kTypeChar: return 1;
    case kTypeFraction: return 16;
    case kTypeFloat:
    case kTypeInt32:
    case kTypeDataType:
    case kTypeConvolutionMode:
    case kTypeHeurMode:
    case kTypeKnobType:
    case kTypeNanPropagation:
    case kTypeNumericalNote:
    case kTypeLayoutType:
    case kTypeAttribName:
    case kTypePointwiseMode:
    case kTypeBehaviorNote: return 4;
  }
  if (type >= 16 && type <= 30) return 4;  // the other enumerations
  return 0;
}

std::string descriptor_type_name(int32_t type) {
  switch (type) {
    case kPointwise: return "CUDNN_BACKEND_POINTWISE_DESCRIPTOR";
    case kConvolution: return "CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR";
    case kEngine: return "CUDNN_BACKEND_ENGINE_DESCRIPTOR";
    case kEngineCfg: return "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR";
    case kEngineHeur: return "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR";
    case kExecutionPlan: return "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR";
    case kKnobChoice: return "CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR";
    case kKnobInfo: return "CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR";
    case kOpConvForward: return "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR";
    case kOpPointwise: return "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR";
    case kOperationGraph: return "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR";
    case kVariantPack: return "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR";
    case kTensor: return "CUDNN_BACKEND_TENSOR_DESCRIPTOR";
    case kMatmul: return "CUDNN_BACKEND_MATMUL_DESCRIPTOR";
    case kOpMatmul: return "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR";
    case kReduction: return "CUDNN_BACKEND_REDUCTION_DESCRIPTOR";
    case kOpReduction: return "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR";
    case kOpNormForward: return "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR";
  }
  return str_cat("cudnnBackendDescriptorType_t ", type);
}

Result<uint64_t> data_type_bytes(int32_t type) {
  switch (type) {
    case kInt8:
    case kUint8:
    case kBoolean: return 1;
    case kHalf:
    case kBfloat16: return 2;
    case kFloat:
    case kInt32: return 4;
    case kDouble:
    case kInt64: return 8;
  }
  return error(ErrorCode::kNotSupported, "cudnnDataType_t ", type, " is not one Hiber carries");
}

size_t Attr::count() const {
  const size_t each = attr_element_bytes(type);
  return each == 0 ? 0 : bytes.size() / each;
}

const Attr* Node::find(int32_t name) const {
  for (const Attr& a : attrs)
    if (a.name == name) return &a;
  return nullptr;
}

int OpGraph::find(int64_t uid) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].uid == uid) return static_cast<int>(i);
  return -1;
}

std::vector<std::byte> encode_graph(const Graph& graph) {
  std::vector<std::byte> out;
  append(out, kGraphMagic);
  append(out, static_cast<uint32_t>(graph.nodes.size()));
  for (const Node& node : graph.nodes) {
    append(out, node.type);
    append(out, static_cast<uint32_t>(node.attrs.size()));
    for (const Attr& a : node.attrs) {
      append(out, a.name);
      append(out, a.type);
      append(out, static_cast<uint32_t>(a.count()));
      out.insert(out.end(), a.bytes.begin(), a.bytes.end());
    }
  }
  return out;
}

Result<Graph> decode_graph(std::span<const std::byte> bytes) {
  Reader r(bytes);
  HIBER_ASSIGN_OR_RETURN(uint32_t magic, r.read<uint32_t>("the magic number"));
  if (magic != kGraphMagic)
    return error(ErrorCode::kInvalidValue, "cuDNN graph: bad magic number ", hex(magic));
  HIBER_ASSIGN_OR_RETURN(uint32_t nodes, r.read<uint32_t>("the descriptor count"));
  if (nodes == 0 || nodes > kMaxGraphNodes)
    return error(ErrorCode::kInvalidValue, "cuDNN graph: ", nodes, " descriptors (1 to ",
                 kMaxGraphNodes, ")");
  Graph g;
  g.nodes.resize(nodes);
  for (uint32_t n = 0; n < nodes; ++n) {
    Node& node = g.nodes[n];
    HIBER_ASSIGN_OR_RETURN(node.type, r.read<int32_t>("a descriptor type"));
    HIBER_ASSIGN_OR_RETURN(uint32_t attrs, r.read<uint32_t>("an attribute count"));
    if (attrs > kMaxNodeAttrs)
      return error(ErrorCode::kInvalidValue, "cuDNN graph: descriptor ", n, " has ", attrs,
                   " attributes (at most ", kMaxNodeAttrs, ")");
    node.attrs.resize(attrs);
    for (uint32_t i = 0; i < attrs; ++i) {
      Attr& a = node.attrs[i];
      HIBER_ASSIGN_OR_RETURN(a.name, r.read<int32_t>("an attribute name"));
      HIBER_ASSIGN_OR_RETURN(a.type, r.read<int32_t>("an attribute type"));
      HIBER_ASSIGN_OR_RETURN(uint32_t count, r.read<uint32_t>("an element count"));
      const size_t each = attr_element_bytes(a.type);
      if (each == 0 || a.type == kTypeHandle || a.type == kTypeVoidPtr)
        return error(ErrorCode::kInvalidValue, "cuDNN graph: descriptor ", n, " attribute ", a.name,
                     " has attribute type ", a.type, ", which no graph carries");
      if (count > kMaxAttrElements)
        return error(ErrorCode::kInvalidValue, "cuDNN graph: descriptor ", n, " attribute ", a.name,
                     " has ", count, " elements (at most ", kMaxAttrElements, ")");
      for (uint32_t j = 0; j < i; ++j)
        if (node.attrs[j].name == a.name)
          return error(ErrorCode::kInvalidValue, "cuDNN graph: descriptor ", n, " sets attribute ",
                       a.name, " twice");
      HIBER_ASSIGN_OR_RETURN(auto data, r.take(size_t{count} * each, "an attribute's elements"));
      a.bytes.assign(data.begin(), data.end());
      if (a.type == kTypeBackendDescriptor) {
        for (uint32_t j = 0; j < count; ++j)
          if (element<uint64_t>(a, j) >= n)
            return error(ErrorCode::kInvalidValue, "cuDNN graph: descriptor ", n, " attribute ",
                         a.name, " references descriptor ", element<uint64_t>(a, j),
                         ", which does not precede it");
      }
    }
  }
  if (!r.done())
    return error(ErrorCode::kInvalidValue, "cuDNN graph: ", bytes.size() - r.offset(),
                 " bytes after the last descriptor");
  return g;
}

Result<uint64_t> tensor_extent(const Tensor& t) {
  HIBER_ASSIGN_OR_RETURN(uint64_t each, data_type_bytes(t.data_type));
  __int128 last = 0;
  for (int i = 0; i < t.rank && i < kMaxDims; ++i) {
    if (t.dims[i] < 1 || t.strides[i] < 1)
      return error(ErrorCode::kInvalidValue, "tensor ", t.uid, ": dimension ", i, " is ", t.dims[i],
                   " with stride ", t.strides[i]);
    last += static_cast<__int128>(t.dims[i] - 1) * t.strides[i];
    if (last > kMaxExtent)
      return error(ErrorCode::kInvalidValue, "tensor ", t.uid, " spans more than 2^48 elements");
  }
  const __int128 bytes = (last + 1) * static_cast<__int128>(each);
  if (bytes > kMaxExtent)
    return error(ErrorCode::kInvalidValue, "tensor ", t.uid, " spans more than 2^48 bytes");
  return static_cast<uint64_t>(bytes);
}

Result<OpGraph> interpret_operation_graph(const Graph& g) {
  if (g.nodes.empty()) return error(ErrorCode::kInvalidValue, "cuDNN graph: empty");
  const Node& root = g.nodes.back();
  if (root.type != kOperationGraph)
    return error(ErrorCode::kInvalidValue, "cuDNN graph: the root is a ",
                 descriptor_type_name(root.type), ", not an operation graph");
  HIBER_ASSIGN_OR_RETURN(const Attr* ops,
                         attr_of(root, kOperationGraphOps, {kTypeBackendDescriptor}, true));
  if (ops->count() == 0)
    return error(ErrorCode::kInvalidValue,
                 "operation graph: CUDNN_ATTR_OPERATIONGRAPH_OPS is empty");
  OpGraph out;
  for (size_t i = 0; i < ops->count(); ++i) {
    const Node& op = g.nodes[element<uint64_t>(*ops, i)];
    switch (op.type) {
      case kOpConvForward: HIBER_RETURN_IF_ERROR(conv_forward(g, op, out)); break;
      case kOpPointwise: HIBER_RETURN_IF_ERROR(pointwise(g, op, out)); break;
      case kOpMatmul: HIBER_RETURN_IF_ERROR(matmul(g, op, out)); break;
      case kOpReduction: HIBER_RETURN_IF_ERROR(reduction(g, op, out)); break;
      case kOpNormForward: HIBER_RETURN_IF_ERROR(norm_forward(g, op, out)); break;
      default:
        return error(ErrorCode::kNotSupported, "operation graph: a ", descriptor_type_name(op.type),
                     " is not an operation Hiber runs (convolution forward, matmul, pointwise, "
                     "reduction, norm forward)");
    }
  }
  return out;
}

Status check_finalizable(const Graph& g) {
  if (g.nodes.empty()) return error(ErrorCode::kInvalidValue, "cuDNN graph: empty");
  const Node& root = g.nodes.back();
  OpGraph scratch;
  switch (root.type) {
    case kTensor: return tensor_of(root).status();
    case kConvolution: {
      Op op;
      return conv_desc(root, op);
    }
    case kPointwise: {
      HIBER_ASSIGN_OR_RETURN(int32_t mode, enum_one(root, kPointwiseMode, kTypePointwiseMode));
      HIBER_RETURN_IF_ERROR(known_pointwise(mode));
      if (mode == kPwGenIndex) return int64_one(root, kPointwiseAxis).status();
      return Status();
    }
    case kMatmul: return enum_one(root, kMatmulCompType, kTypeDataType).status();
    case kReduction: {
      HIBER_ASSIGN_OR_RETURN(int32_t op,
                             enum_one(root, kReductionOperator, kTypeReductionOperator));
      return known_reduction(op);
    }
    case kOpConvForward: return conv_forward(g, root, scratch);
    case kOpPointwise: return pointwise(g, root, scratch);
    case kOpMatmul: return matmul(g, root, scratch);
    case kOpReduction: return reduction(g, root, scratch);
    case kOpNormForward: return norm_forward(g, root, scratch);
    case kOperationGraph: return interpret_operation_graph(g).status();
  }
  return error(ErrorCode::kNotSupported, descriptor_type_name(root.type),
               " is not finalized by the client");
}

Result<Plan> interpret_plan(const Graph& g) {
  if (g.nodes.empty() || g.nodes.back().type != kExecutionPlan)
    return error(ErrorCode::kInvalidValue, "cuDNN graph: the root is not an execution plan");
  HIBER_ASSIGN_OR_RETURN(size_t cfg,
                         ref_one(g, g.nodes.back(), kPlanEngineConfig, kEngineCfg, true));
  HIBER_ASSIGN_OR_RETURN(size_t engine, ref_one(g, g.nodes[cfg], kEngineCfgEngine, kEngine, true));
  HIBER_ASSIGN_OR_RETURN(size_t opg,
                         ref_one(g, g.nodes[engine], kEngineOperationGraph, kOperationGraph, true));
  Plan plan;
  HIBER_ASSIGN_OR_RETURN(plan.engine, int64_one(g.nodes[engine], kEngineGlobalIndex));
  // The operation graph's own sub-graph: the nodes up to it (post-order keeps its references
  // before it).
  Graph sub;
  sub.nodes.assign(g.nodes.begin(), g.nodes.begin() + static_cast<ptrdiff_t>(opg) + 1);
  HIBER_ASSIGN_OR_RETURN(plan.graph, interpret_operation_graph(sub));
  return plan;
}

std::vector<std::byte> encode_finalize_answer(std::span<const EngineSupport> engines) {
  std::vector<std::byte> out;
  append(out, FinalizeAnswer{.engines = static_cast<uint32_t>(engines.size())});
  for (const EngineSupport& e : engines) append(out, e);
  return out;
}

std::vector<const EngineSupport*> heuristic_results(std::span<const EngineSupport> engines) {
  std::vector<const EngineSupport*> results;
  for (const EngineSupport& e : engines)
    if (e.supported) results.push_back(&e);
  auto rank = [](const EngineSupport* e) {
    return e->heuristic_rank == 0 ? UINT32_MAX : e->heuristic_rank;
  };
  std::stable_sort(
      results.begin(), results.end(),
      [&](const EngineSupport* a, const EngineSupport* b) { return rank(a) < rank(b); });
  return results;
}

Result<std::vector<EngineSupport>> decode_finalize_answer(std::span<const std::byte> bytes) {
  Reader r(bytes);
  HIBER_ASSIGN_OR_RETURN(auto head, r.read<FinalizeAnswer>("the answer's header"));
  if (head.engines > 1024)
    return error(ErrorCode::kInvalidValue, "cuDNN finalize answer: ", head.engines, " engines");
  std::vector<EngineSupport> out;
  for (uint32_t i = 0; i < head.engines; ++i) {
    HIBER_ASSIGN_OR_RETURN(auto e, r.read<EngineSupport>("an engine"));
    e.why[sizeof(e.why) - 1] = '\0';
    out.push_back(e);
  }
  if (!r.done()) return error(ErrorCode::kInvalidValue, "cuDNN finalize answer: trailing bytes");
  return out;
}

std::vector<std::byte> encode_execute(const Execute& e) {
  std::vector<std::byte> out;
  ExecuteHeader h = e.header;
  h.count = static_cast<uint32_t>(e.entries.size());
  h.by_value_count = static_cast<uint32_t>(e.by_value.size());
  append(out, h);
  for (const VariantEntry& v : e.entries) append(out, v);
  for (const ByValueEntry& v : e.by_value) append(out, v);
  return out;
}

Result<Execute> decode_execute(std::span<const std::byte> bytes) {
  Reader r(bytes);
  Execute e;
  HIBER_ASSIGN_OR_RETURN(e.header, r.read<ExecuteHeader>("cuDNN execute header"));
  if (e.header.count > kMaxVariantEntries || e.header.by_value_count > kMaxVariantEntries)
    return error(ErrorCode::kInvalidValue, "cuDNN execute: ", e.header.count,
                 " variant pack entries and ", e.header.by_value_count,
                 " by-value ones (at most ", kMaxVariantEntries, " of each)");
  for (uint32_t i = 0; i < e.header.count; ++i) {
    HIBER_ASSIGN_OR_RETURN(auto v, r.read<VariantEntry>("a variant pack entry"));
    e.entries.push_back(v);
  }
  for (uint32_t i = 0; i < e.header.by_value_count; ++i) {
    HIBER_ASSIGN_OR_RETURN(auto v, r.read<ByValueEntry>("a by-value variant pack entry"));
    e.by_value.push_back(v);
  }
  if (!r.done())
    return error(ErrorCode::kInvalidValue, "cuDNN execute: bytes after the variant pack");
  return e;
}

std::vector<std::byte> encode_define_graph(uint64_t graph_id, std::span<const std::byte> graph) {
  const DefineGraphHeader header{.graph_id = graph_id};
  std::vector<std::byte> out(sizeof(header) + graph.size());
  std::memcpy(out.data(), &header, sizeof(header));
  if (!graph.empty()) std::memcpy(out.data() + sizeof(header), graph.data(), graph.size());
  return out;
}

Result<std::pair<uint64_t, Graph>> decode_define_graph(std::span<const std::byte> bytes) {
  Reader r(bytes);
  HIBER_ASSIGN_OR_RETURN(auto head, r.read<DefineGraphHeader>("cuDNN define-graph header"));
  if (head.graph_id == 0)
    return error(ErrorCode::kInvalidValue, "cuDNN define graph: graph id 0 is reserved");
  HIBER_ASSIGN_OR_RETURN(Graph g, decode_graph(bytes.subspan(sizeof(DefineGraphHeader))));
  return std::pair<uint64_t, Graph>(head.graph_id, std::move(g));
}

Result<std::vector<Bound>> bind_variant_pack(const OpGraph& graph, const Execute& e) {
  std::vector<Bound> bound(graph.tensors.size());
  std::vector<bool> seen(graph.tensors.size(), false);
  for (const VariantEntry& v : e.entries) {
    const int t = graph.find(v.uid);
    if (t < 0)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: the variant pack names unique id ",
                   v.uid, ", which is no tensor of the plan");
    if (seen[t])
      return error(ErrorCode::kInvalidValue, "cuDNN execute: unique id ", v.uid,
                   " appears twice in the variant pack");
    seen[t] = true;
    if (graph.tensors[t].is_virtual)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: unique id ", v.uid,
                   " is a virtual tensor and takes no address");
    if (graph.tensors[t].by_value)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: unique id ", v.uid,
                   " is a by-value tensor: its value travels, not an address");
    HIBER_ASSIGN_OR_RETURN(uint64_t bytes, tensor_extent(graph.tensors[t]));
    bound[t].ptr = v.ptr;
    bound[t].bytes = bytes;
  }
  for (const ByValueEntry& v : e.by_value) {
    const int t = graph.find(v.uid);
    if (t < 0 || !graph.tensors[t].by_value)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: a value for unique id ", v.uid,
                   ", which is no by-value tensor of the plan");
    if (seen[t])
      return error(ErrorCode::kInvalidValue, "cuDNN execute: unique id ", v.uid,
                   " appears twice in the variant pack");
    seen[t] = true;
    bound[t].by_value = true;
    std::memcpy(bound[t].value, v.value, kMaxByValueBytes);
  }
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    const Tensor& tensor = graph.tensors[t];
    if (tensor.is_virtual) continue;
    if (tensor.by_value) {
      HIBER_ASSIGN_OR_RETURN(uint64_t each, data_type_bytes(tensor.data_type));
      if (elements(tensor) != 1 || each > kMaxByValueBytes)
        return error(ErrorCode::kInvalidValue, "cuDNN execute: by-value tensor ", tensor.uid,
                     " is not one element of at most ", kMaxByValueBytes, " bytes");
      if (!seen[t])
        return error(ErrorCode::kInvalidValue, "cuDNN execute: by-value tensor ", tensor.uid,
                     " has no value in the variant pack");
      continue;
    }
    if (!seen[t] || bound[t].ptr == 0)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: tensor ", tensor.uid,
                   " has no address in the variant pack");
  }
  return bound;
}

Tensor as_tensor(const TensorShape& s) {
  Tensor t;
  t.data_type = s.data_type;
  t.rank = std::clamp(s.rank, 0, kMaxDims);
  for (int i = 0; i < t.rank; ++i) {
    t.dims[i] = s.dims[i];
    t.strides[i] = s.strides[i];
  }
  return t;
}

Status check_shape(const TensorShape& s, std::string_view what) {
  if (s.rank < 3 || s.rank > kMaxDims)
    return error(ErrorCode::kInvalidValue, what, ": rank ", s.rank, " (3 to ", kMaxDims, ")");
  if (s.data_type != kFloat && s.data_type != kHalf && s.data_type != kBfloat16 &&
      s.data_type != kDouble)
    return error(ErrorCode::kNotSupported, what, ": data type ", s.data_type,
                 " (Hiber runs FLOAT, DOUBLE, HALF and BFLOAT16)");
  return tensor_extent(as_tensor(s)).status().with_context(what);
}

namespace {

bool same_dims(const TensorShape& a, const TensorShape& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a.dims[i] != b.dims[i]) return false;
  return true;
}

Status check_xy(const TensorShape& x, const TensorShape& y, bool same, std::string_view call) {
  HIBER_RETURN_IF_ERROR(check_shape(x, str_cat(call, ": x")));
  HIBER_RETURN_IF_ERROR(check_shape(y, str_cat(call, ": y")));
  if (same && !same_dims(x, y))
    return error(ErrorCode::kInvalidValue, call, ": x and y differ in dimensions");
  if (x.data_type != y.data_type)
    return error(ErrorCode::kInvalidValue, call, ": x and y differ in data type");
  return Status();
}

}  // namespace

Status check_op(const BatchNormInference& op) {
  HIBER_RETURN_IF_ERROR(check_xy(op.x, op.y, true, "cudnnBatchNormalizationForwardInference"));
  HIBER_RETURN_IF_ERROR(check_shape(op.bn, "cudnnBatchNormalizationForwardInference: bn"));
  if (op.mode < 0 || op.mode > 2)
    return error(ErrorCode::kInvalidValue, "cudnnBatchNormalizationForwardInference: mode ",
                 op.mode);
  if (!(op.epsilon >= 0))
    return error(ErrorCode::kInvalidValue, "cudnnBatchNormalizationForwardInference: epsilon ",
                 op.epsilon, " (below CUDNN_BN_MIN_EPSILON)");
  // Spatial: bn is 1 x C x 1 x 1; per activation: 1 x C x H x W.
  bool ok = op.bn.rank == op.x.rank && op.bn.dims[0] == 1 && op.bn.dims[1] == op.x.dims[1];
  for (int i = 2; ok && i < op.x.rank; ++i) ok = op.bn.dims[i] == (op.mode == 0 ? op.x.dims[i] : 1);
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "cudnnBatchNormalizationForwardInference: the scale/bias/mean/variance "
                 "descriptor does not match x for the mode");
  const bool half_data = op.x.data_type == kHalf || op.x.data_type == kBfloat16;
  if (half_data ? op.bn.data_type != kFloat : op.bn.data_type != op.x.data_type)
    return error(ErrorCode::kInvalidValue,
                 "cudnnBatchNormalizationForwardInference: the scale/bias/mean/variance type must "
                 "be FLOAT for HALF/BFLOAT16 data, the data's type otherwise");
  return Status();
}

int64_t pooled_dim(int64_t in, int64_t window, int64_t pad, int64_t stride) {
  return stride < 1 ? 0 : 1 + (in + 2 * pad - window) / stride;
}

int64_t convolved_dim(int64_t in, int64_t filter, int64_t pre, int64_t post, int64_t stride,
                      int64_t dilation) {
  const int64_t span = (filter - 1) * dilation + 1;
  if (stride < 1 || in + pre + post < span) return 0;
  return 1 + (in + pre + post - span) / stride;
}

Status check_op(const Pooling& op) {
  HIBER_RETURN_IF_ERROR(check_xy(op.x, op.y, false, "cudnnPoolingForward"));
  if (op.mode < 0 || op.mode > 3)
    return error(ErrorCode::kInvalidValue, "cudnnPoolingForward: mode ", op.mode);
  if (op.spatial < 1 || op.spatial > kMaxSpatial || op.x.rank != op.spatial + 2 ||
      op.y.rank != op.x.rank)
    return error(ErrorCode::kInvalidValue, "cudnnPoolingForward: ", op.spatial,
                 " spatial dimensions for tensors of rank ", op.x.rank);
  bool ok = op.y.dims[0] == op.x.dims[0] && op.y.dims[1] == op.x.dims[1];
  for (int i = 0; ok && i < op.spatial; ++i) {
    ok = op.window[i] >= 1 && op.stride[i] >= 1 && op.pad[i] >= 0 && op.pad[i] < op.window[i] &&
         op.window[i] <= op.x.dims[2 + i] + 2 * op.pad[i] &&
         op.y.dims[2 + i] == pooled_dim(op.x.dims[2 + i], op.window[i], op.pad[i], op.stride[i]);
  }
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "cudnnPoolingForward: window, padding, stride and y's dimensions do not agree "
                 "with x");
  return Status();
}

Status check_op(const Activation& op) {
  HIBER_RETURN_IF_ERROR(check_xy(op.x, op.y, true, "cudnnActivationForward"));
  if (op.mode < 0 || op.mode > 6)
    return error(ErrorCode::kInvalidValue, "cudnnActivationForward: mode ", op.mode);
  return Status();
}

Status check_op(const Softmax& op) {
  HIBER_RETURN_IF_ERROR(check_xy(op.x, op.y, true, "cudnnSoftmaxForward"));
  if (op.algorithm < 0 || op.algorithm > 2 || op.mode < 0 || op.mode > 1)
    return error(ErrorCode::kInvalidValue, "cudnnSoftmaxForward: algorithm ", op.algorithm,
                 ", mode ", op.mode);
  return Status();
}

Status check_op(const AddTensor& op) {
  HIBER_RETURN_IF_ERROR(check_shape(op.a, "cudnnAddTensor: A"));
  HIBER_RETURN_IF_ERROR(check_shape(op.c, "cudnnAddTensor: C"));
  bool ok = op.a.rank == op.c.rank;
  for (int i = 0; ok && i < op.c.rank; ++i) ok = op.a.dims[i] == op.c.dims[i] || op.a.dims[i] == 1;
  if (!ok)
    return error(ErrorCode::kInvalidValue,
                 "cudnnAddTensor: A's dimensions must be C's or 1 (broadcast)");
  return Status();
}

}  // namespace hiber::library_ops::dnn
