// cuDNN remoting: the descriptor-graph codec (round trip; truncated and corrupted bytes refused,
// never a crash), the session's checks of cuDNN calls (extents from dims/strides/type, unknown
// unique ids, undefined graphs, bad descriptors), and the simulated GPU's host implementations
// against references written here, independently: convolution forward (NCHW and NHWC, stride,
// padding, dilation, groups, fp32 and fp16, fused bias + ReLU), softmax built of reductions and
// pointwise ops, layer and RMS norm, a causal mask (GEN_INDEX, CMP_GE, BINARY_SELECT), by-value
// tensors (the session binds no address to them; their values travel), batch-norm inference,
// pooling, softmax, activation and add tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "library_ops/dnn_ops.h"
#include "server/device/sim/dnn_kernels.h"
#include "server/device/sim/numeric.h"
#include "server/library_calls.h"

namespace hiber {
namespace {

namespace dnn = library_ops::dnn;

// ---- Building graphs as the client encodes them ----
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
  uint64_t tensor(int64_t uid, int32_t type, std::vector<int64_t> dims,
                  std::vector<int64_t> strides, bool is_virtual = false) {
    dnn::Node n{dnn::kTensor, {}};
    attr<int32_t>(n, dnn::kTensorDataType, dnn::kTypeDataType, {type});
    attr(n, dnn::kTensorDimensions, dnn::kTypeInt64, dims);
    attr(n, dnn::kTensorStrides, dnn::kTypeInt64, strides);
    attr<int64_t>(n, dnn::kTensorUniqueId, dnn::kTypeInt64, {uid});
    if (is_virtual) attr<uint8_t>(n, dnn::kTensorIsVirtual, dnn::kTypeBoolean, {1});
    return add(std::move(n));
  }
  uint64_t conv(int64_t pad, int64_t stride, int64_t dilation, int32_t compute = dnn::kFloat) {
    dnn::Node n{dnn::kConvolution, {}};
    attr<int64_t>(n, dnn::kConvSpatialDims, dnn::kTypeInt64, {2});
    attr<int32_t>(n, dnn::kConvCompType, dnn::kTypeDataType, {compute});
    attr<int32_t>(n, dnn::kConvMode, dnn::kTypeConvolutionMode, {dnn::kCrossCorrelationMode});
    attr<int64_t>(n, dnn::kConvPrePaddings, dnn::kTypeInt64, {pad, pad});
    attr<int64_t>(n, dnn::kConvPostPaddings, dnn::kTypeInt64, {pad, pad});
    attr<int64_t>(n, dnn::kConvFilterStrides, dnn::kTypeInt64, {stride, stride});
    attr<int64_t>(n, dnn::kConvDilations, dnn::kTypeInt64, {dilation, dilation});
    return add(std::move(n));
  }
  uint64_t conv_op(uint64_t x, uint64_t w, uint64_t y, uint64_t c) {
    dnn::Node n{dnn::kOpConvForward, {}};
    attr<uint64_t>(n, dnn::kConvFwdX, dnn::kTypeBackendDescriptor, {x});
    attr<uint64_t>(n, dnn::kConvFwdW, dnn::kTypeBackendDescriptor, {w});
    attr<uint64_t>(n, dnn::kConvFwdY, dnn::kTypeBackendDescriptor, {y});
    attr<uint64_t>(n, dnn::kConvFwdConvDesc, dnn::kTypeBackendDescriptor, {c});
    attr<double>(n, dnn::kConvFwdAlpha, dnn::kTypeDouble, {1.0});  // DOUBLE accepted as FLOAT is
    attr<float>(n, dnn::kConvFwdBeta, dnn::kTypeFloat, {0.0f});
    return add(std::move(n));
  }
  uint64_t pointwise(int32_t mode, uint64_t x, uint64_t y, int64_t b = -1, int64_t t = -1,
                     int64_t axis = -1) {
    dnn::Node d{dnn::kPointwise, {}};
    attr<int32_t>(d, dnn::kPointwiseMode, dnn::kTypePointwiseMode, {mode});
    if (axis >= 0) attr<int64_t>(d, dnn::kPointwiseAxis, dnn::kTypeInt64, {axis});
    const uint64_t desc = add(std::move(d));
    dnn::Node n{dnn::kOpPointwise, {}};
    attr<uint64_t>(n, dnn::kOpPointwisePwDesc, dnn::kTypeBackendDescriptor, {desc});
    attr<uint64_t>(n, dnn::kOpPointwiseX, dnn::kTypeBackendDescriptor, {x});
    attr<uint64_t>(n, dnn::kOpPointwiseY, dnn::kTypeBackendDescriptor, {y});
    if (b >= 0) attr<uint64_t>(n, dnn::kOpPointwiseB, dnn::kTypeBackendDescriptor, {uint64_t(b)});
    if (t >= 0) attr<uint64_t>(n, dnn::kOpPointwiseT, dnn::kTypeBackendDescriptor, {uint64_t(t)});
    return add(std::move(n));
  }
  // A one-element FLOAT tensor passed by value (a scale, an epsilon).
  uint64_t scalar(int64_t uid) {
    const uint64_t at = tensor(uid, dnn::kFloat, {1, 1, 1, 1}, {1, 1, 1, 1});
    attr<uint8_t>(g.nodes[at], dnn::kTensorIsByValue, dnn::kTypeBoolean, {1});
    return at;
  }
  uint64_t reduction(int32_t op, uint64_t x, uint64_t y) {
    dnn::Node d{dnn::kReduction, {}};
    attr<int32_t>(d, dnn::kReductionOperator, dnn::kTypeReductionOperator, {op});
    attr<int32_t>(d, dnn::kReductionCompType, dnn::kTypeDataType, {dnn::kFloat});
    const uint64_t desc = add(std::move(d));
    dnn::Node n{dnn::kOpReduction, {}};
    attr<uint64_t>(n, dnn::kOpReductionX, dnn::kTypeBackendDescriptor, {x});
    attr<uint64_t>(n, dnn::kOpReductionY, dnn::kTypeBackendDescriptor, {y});
    attr<uint64_t>(n, dnn::kOpReductionDesc, dnn::kTypeBackendDescriptor, {desc});
    return add(std::move(n));
  }
  // Layer norm (bias, and in training mean and inverse variance) or RMS norm.
  uint64_t norm(int32_t mode, int32_t phase, uint64_t x, uint64_t scale, int64_t bias,
                uint64_t epsilon, uint64_t y, int64_t mean = -1, int64_t inv_variance = -1) {
    dnn::Node n{dnn::kOpNormForward, {}};
    attr<int32_t>(n, dnn::kNormFwdMode, dnn::kTypeNormMode, {mode});
    attr<int32_t>(n, dnn::kNormFwdPhase, dnn::kTypeNormFwdPhase, {phase});
    attr<uint64_t>(n, dnn::kNormFwdX, dnn::kTypeBackendDescriptor, {x});
    attr<uint64_t>(n, dnn::kNormFwdScale, dnn::kTypeBackendDescriptor, {scale});
    if (bias >= 0) attr<uint64_t>(n, dnn::kNormFwdBias, dnn::kTypeBackendDescriptor, {uint64_t(bias)});
    attr<uint64_t>(n, dnn::kNormFwdEpsilon, dnn::kTypeBackendDescriptor, {epsilon});
    attr<uint64_t>(n, dnn::kNormFwdY, dnn::kTypeBackendDescriptor, {y});
    if (mean >= 0) attr<uint64_t>(n, dnn::kNormFwdMean, dnn::kTypeBackendDescriptor, {uint64_t(mean)});
    if (inv_variance >= 0)
      attr<uint64_t>(n, dnn::kNormFwdInvVariance, dnn::kTypeBackendDescriptor,
                     {uint64_t(inv_variance)});
    return add(std::move(n));
  }
  uint64_t op_graph(std::vector<uint64_t> ops) {
    dnn::Node n{dnn::kOperationGraph, {}};
    attr(n, dnn::kOperationGraphOps, dnn::kTypeBackendDescriptor, ops);
    return add(std::move(n));
  }
  uint64_t plan(uint64_t graph, int64_t engine = 0) {
    dnn::Node e{dnn::kEngine, {}};
    attr<uint64_t>(e, dnn::kEngineOperationGraph, dnn::kTypeBackendDescriptor, {graph});
    attr<int64_t>(e, dnn::kEngineGlobalIndex, dnn::kTypeInt64, {engine});
    const uint64_t eng = add(std::move(e));
    dnn::Node c{dnn::kEngineCfg, {}};
    attr<uint64_t>(c, dnn::kEngineCfgEngine, dnn::kTypeBackendDescriptor, {eng});
    const uint64_t cfg = add(std::move(c));
    dnn::Node p{dnn::kExecutionPlan, {}};
    attr<uint64_t>(p, dnn::kPlanEngineConfig, dnn::kTypeBackendDescriptor, {cfg});
    return add(std::move(p));
  }
  dnn::Graph g;
};

std::vector<int64_t> strides(bool nhwc, const std::vector<int64_t>& d) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// A conv (+ optional bias and ReLU) plan: x 2x4x7x6, w 6x(4/groups)x3x3.
struct ConvCase {
  bool nhwc = false;
  int32_t type = dnn::kFloat;
  int64_t pad = 1, stride = 1, dilation = 1, groups = 1;
  bool fused = false;
};
struct ConvShapes {
  std::vector<int64_t> x, w, y, b;
};
ConvShapes shapes(const ConvCase& c) {
  ConvShapes s;
  s.x = {2, 4, 7, 6};
  s.w = {6, 4 / c.groups, 3, 3};
  s.y = {2, 6, dnn::convolved_dim(7, 3, c.pad, c.pad, c.stride, c.dilation),
         dnn::convolved_dim(6, 3, c.pad, c.pad, c.stride, c.dilation)};
  s.b = {1, 6, 1, 1};
  return s;
}
dnn::Graph conv_plan(const ConvCase& c) {
  Builder b;
  const ConvShapes s = shapes(c);
  const uint64_t x = b.tensor(1, c.type, s.x, strides(c.nhwc, s.x));
  const uint64_t w = b.tensor(2, c.type, s.w, strides(c.nhwc, s.w));
  std::vector<uint64_t> ops;
  if (!c.fused) {
    const uint64_t y = b.tensor(3, c.type, s.y, strides(c.nhwc, s.y));
    ops.push_back(b.conv_op(x, w, y, b.conv(c.pad, c.stride, c.dilation)));
  } else {
    const uint64_t v1 = b.tensor(10, dnn::kFloat, s.y, strides(c.nhwc, s.y), true);
    const uint64_t v2 = b.tensor(11, dnn::kFloat, s.y, strides(c.nhwc, s.y), true);
    const uint64_t bias = b.tensor(4, c.type, s.b, {6, 1, 1, 1});
    const uint64_t y = b.tensor(3, c.type, s.y, strides(c.nhwc, s.y));
    ops.push_back(b.conv_op(x, w, v1, b.conv(c.pad, c.stride, c.dilation)));
    ops.push_back(b.pointwise(dnn::kPwAdd, v1, v2, static_cast<int64_t>(bias)));
    ops.push_back(b.pointwise(dnn::kPwReluFwd, v2, y));
  }
  b.plan(b.op_graph(ops));
  return b.g;
}

// ---- Codec ----
TEST(DnnGraphCodec, RoundTrips) {
  const dnn::Graph g = conv_plan({.fused = true});
  const auto bytes = dnn::encode_graph(g);
  auto decoded = dnn::decode_graph(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(dnn::encode_graph(*decoded), bytes);
  auto plan = dnn::interpret_plan(*decoded);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->graph.ops.size(), 3u);
  EXPECT_EQ(plan->graph.tensors.size(), 6u);
  EXPECT_EQ(plan->engine, 0);
}

TEST(DnnGraphCodec, RefusesEveryTruncation) {
  const auto bytes = dnn::encode_graph(conv_plan({}));
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto decoded = dnn::decode_graph(std::span(bytes).first(n));
    EXPECT_FALSE(decoded.ok()) << "truncated to " << n;
    if (!decoded.ok()) {
      EXPECT_EQ(decoded.status().code(), ErrorCode::kInvalidValue);
    }
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(dnn::decode_graph(longer).ok()) << "trailing bytes";
}

TEST(DnnGraphCodec, SurvivesCorruption) {
  const auto bytes = dnn::encode_graph(conv_plan({.groups = 2, .fused = true}));
  std::mt19937 rng(16);
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    auto corrupt = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      corrupt[rng() % corrupt.size()] = static_cast<std::byte>(rng() & 0xff);
    auto decoded = dnn::decode_graph(corrupt);
    if (!decoded.ok()) {
      ++refused;
      continue;
    }
    // Whatever decodes is interpreted without crashing, and what interprets binds safely.
    auto plan = dnn::interpret_plan(*decoded);
    if (plan.ok()) {
      for (const auto& t : plan->graph.tensors) EXPECT_TRUE(dnn::tensor_extent(t).ok());
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(DnnGraphCodec, RefusesBackwardViolationsAndBadMagic) {
  dnn::Graph g = conv_plan({});
  // A reference to itself (not an earlier descriptor).
  Builder b;
  dnn::Node n{dnn::kOperationGraph, {}};
  b.attr<uint64_t>(n, dnn::kOperationGraphOps, dnn::kTypeBackendDescriptor, {0});
  b.add(std::move(n));
  auto decoded = dnn::decode_graph(dnn::encode_graph(b.g));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("does not precede"), std::string::npos);
  auto bytes = dnn::encode_graph(g);
  bytes[0] = std::byte{0};
  EXPECT_FALSE(dnn::decode_graph(bytes).ok());
}

TEST(DnnGraph, RefusesWhatCudnnRefuses) {
  // Y's dimensions disagree with what X, W and the convolution give.
  Builder b;
  const uint64_t x = b.tensor(1, dnn::kFloat, {1, 2, 5, 5}, {50, 25, 5, 1});
  const uint64_t w = b.tensor(2, dnn::kFloat, {3, 2, 3, 3}, {18, 9, 3, 1});
  const uint64_t y = b.tensor(3, dnn::kFloat, {1, 3, 5, 5}, {75, 25, 5, 1});  // pad 0 gives 3x3
  b.op_graph({b.conv_op(x, w, y, b.conv(0, 1, 1))});
  auto g = dnn::interpret_operation_graph(b.g);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidValue);
  // A tensor without its unique id.
  Builder t;
  dnn::Node n{dnn::kTensor, {}};
  t.attr<int32_t>(n, dnn::kTensorDataType, dnn::kTypeDataType, {dnn::kFloat});
  t.add(std::move(n));
  EXPECT_FALSE(dnn::check_finalizable(t.g).ok());
  // A mistyped attribute (dimensions as INT32).
  Builder m;
  dnn::Node k{dnn::kTensor, {}};
  m.attr<int32_t>(k, dnn::kTensorDataType, dnn::kTypeDataType, {dnn::kFloat});
  m.attr<int32_t>(k, dnn::kTensorDimensions, dnn::kTypeInt32, {1, 2, 3, 4});
  m.add(std::move(k));
  EXPECT_FALSE(dnn::check_finalizable(m.g).ok());
}

// ---- The session's checks ----
std::vector<std::byte> define(uint64_t id, const dnn::Graph& g) {
  return dnn::encode_define_graph(id, dnn::encode_graph(g));
}

TEST(DnnChecks, ExecuteOperandsComeFromDimsStridesAndType) {
  server::DnnGraphs graphs;
  ConvCase c{.nhwc = true, .type = dnn::kHalf};
  ASSERT_TRUE(server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph,
                                     define(7, conv_plan(c)), graphs)
                  .ok());
  dnn::Execute e;
  e.header.graph_id = 7;
  e.entries = {{1, 0x1000}, {2, 0x20000}, {3, 0x30000}};
  auto access =
      server::check_dnn_call(library_ops::LibraryOp::kDnnExecute, dnn::encode_execute(e), graphs);
  ASSERT_TRUE(access.ok()) << access.status();
  ASSERT_EQ(access->operands.size(), 3u);
  const ConvShapes s = shapes(c);
  auto elements = [](const std::vector<int64_t>& d) { return d[0] * d[1] * d[2] * d[3]; };
  EXPECT_EQ(access->operands[0].bytes, 2u * elements(s.x));  // fp16: 2 bytes each
  EXPECT_EQ(access->operands[1].bytes, 2u * elements(s.w));
  EXPECT_EQ(access->operands[2].bytes, 2u * elements(s.y));
  EXPECT_FALSE(access->operands[0].write);
  EXPECT_TRUE(access->operands[2].write);
  // Same graph in fp32: twice the bytes (the declared type rules).
  ASSERT_TRUE(server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph,
                                     define(8, conv_plan({.nhwc = true})), graphs)
                  .ok());
  e.header.graph_id = 8;
  access =
      server::check_dnn_call(library_ops::LibraryOp::kDnnExecute, dnn::encode_execute(e), graphs);
  ASSERT_TRUE(access.ok());
  EXPECT_EQ(access->operands[0].bytes, 4u * elements(s.x));
}

TEST(DnnChecks, RefusesUnknownUidsGraphsAndBadDescriptors) {
  server::DnnGraphs graphs;
  ASSERT_TRUE(server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph,
                                     define(1, conv_plan({})), graphs)
                  .ok());
  auto run = [&](dnn::Execute e) {
    return server::check_dnn_call(library_ops::LibraryOp::kDnnExecute, dnn::encode_execute(e),
                                  graphs)
        .status();
  };
  dnn::Execute e;
  e.header.graph_id = 1;
  e.entries = {{1, 0x1000}, {2, 0x2000}, {3, 0x3000}, {99, 0x4000}};
  Status s = run(e);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(s.message().find("unique id 99"), std::string::npos) << s;
  e.entries = {{1, 0x1000}, {2, 0x2000}};  // y missing
  EXPECT_EQ(run(e).code(), ErrorCode::kInvalidValue);
  e.entries = {{1, 0x1000}, {2, 0x2000}, {3, 0x3000}};
  e.header.graph_id = 2;  // never defined
  EXPECT_EQ(run(e).code(), ErrorCode::kInvalidValue);
  e.header.graph_id = 1;
  e.header.workspace_bytes = 64;  // a workspace needed, none given
  EXPECT_EQ(run(e).code(), ErrorCode::kInvalidValue);
  // Redefining an id; a graph whose root is no plan; garbage.
  EXPECT_FALSE(server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph,
                                      define(1, conv_plan({})), graphs)
                   .ok());
  dnn::Graph not_plan = conv_plan({});
  not_plan.nodes.pop_back();
  auto refused =
      server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph, define(3, not_plan), graphs);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not an execution plan"), std::string::npos);
  std::vector<std::byte> garbage(40, std::byte{0x5a});
  EXPECT_EQ(server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph, garbage, graphs)
                .status()
                .code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(
      server::check_dnn_call(library_ops::LibraryOp::kDnnExecute, garbage, graphs).status().code(),
      ErrorCode::kInvalidValue);
  EXPECT_EQ(server::check_dnn_query(library_ops::LibraryOp::kDnnFinalize, garbage).code(),
            ErrorCode::kInvalidValue);
}

TEST(DnnChecks, LegacyCallsExtentsAndValues) {
  server::DnnGraphs graphs;
  dnn::Pooling p;
  p.x = {dnn::kFloat, 4, {1, 2, 4, 4}, {32, 16, 4, 1}};
  p.y = {dnn::kFloat, 4, {1, 2, 2, 2}, {8, 4, 2, 1}};
  p.x_ptr = 0x1000;
  p.y_ptr = 0x2000;
  p.spatial = 2;
  p.window[0] = p.window[1] = 2;
  p.stride[0] = p.stride[1] = 2;
  auto access =
      server::check_dnn_call(library_ops::LibraryOp::kDnnPooling, library_ops::op_bytes(p), graphs);
  ASSERT_TRUE(access.ok()) << access.status();
  EXPECT_EQ(access->operands[0].bytes, 32u * 4);
  EXPECT_EQ(access->operands[1].bytes, 8u * 4);
  p.y.dims[3] = 3;  // not what the window gives
  EXPECT_EQ(
      server::check_dnn_call(library_ops::LibraryOp::kDnnPooling, library_ops::op_bytes(p), graphs)
          .status()
          .code(),
      ErrorCode::kInvalidValue);
}

// ---- Host implementations against references written here ----
struct Buffer {
  int32_t type;
  std::vector<std::byte> bytes;
  Buffer(int32_t t, size_t n) : type(t), bytes(n * (t == dnn::kHalf ? 2 : 4)) {}
  uint64_t ptr() { return reinterpret_cast<uint64_t>(bytes.data()); }
  void set(size_t i, float v) {
    if (type == dnn::kHalf) {
      const uint16_t h = device::sim::float_to_half(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  float get(size_t i) const {
    if (type == dnn::kHalf) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return device::sim::half_to_float(h);
    }
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
};

size_t offset(const std::vector<int64_t>& st, int64_t a, int64_t b, int64_t c, int64_t d) {
  return static_cast<size_t>(a * st[0] + b * st[1] + c * st[2] + d * st[3]);
}

class DnnConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(DnnConvTest, MatchesReference) {
  const ConvCase c = GetParam();
  const ConvShapes s = shapes(c);
  auto count = [](const std::vector<int64_t>& d) { return size_t(d[0] * d[1] * d[2] * d[3]); };
  Buffer x(c.type, count(s.x)), w(c.type, count(s.w)), y(c.type, count(s.y)), bias(c.type, 6);
  const auto xs = strides(c.nhwc, s.x), ws = strides(c.nhwc, s.w), ys = strides(c.nhwc, s.y);
  // Logical values by NCHW coordinates, quarter-integers exact in fp16.
  auto xv = [](int64_t n, int64_t ch, int64_t h, int64_t ww) {
    return static_cast<float>((n * 31 + ch * 7 + h * 5 + ww * 3) % 9 - 4) / 4;
  };
  auto wv = [](int64_t k, int64_t ch, int64_t r, int64_t q) {
    return static_cast<float>((k * 13 + ch * 5 + r * 3 + q) % 7 - 3) / 4;
  };
  for (int64_t a = 0; a < s.x[0]; ++a)
    for (int64_t b = 0; b < s.x[1]; ++b)
      for (int64_t h = 0; h < s.x[2]; ++h)
        for (int64_t q = 0; q < s.x[3]; ++q) x.set(offset(xs, a, b, h, q), xv(a, b, h, q));
  for (int64_t a = 0; a < s.w[0]; ++a)
    for (int64_t b = 0; b < s.w[1]; ++b)
      for (int64_t h = 0; h < s.w[2]; ++h)
        for (int64_t q = 0; q < s.w[3]; ++q) w.set(offset(ws, a, b, h, q), wv(a, b, h, q));
  for (int k = 0; k < 6; ++k) bias.set(k, static_cast<float>(k - 3) / 2);
  auto plan = dnn::interpret_plan(conv_plan(c));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(device::sim::host_engine_supports(plan->graph).ok());
  std::vector<dnn::Bound> bound(plan->graph.tensors.size());
  for (size_t t = 0; t < bound.size(); ++t) {
    switch (plan->graph.tensors[t].uid) {
      case 1: bound[t].ptr = x.ptr(); break;
      case 2: bound[t].ptr = w.ptr(); break;
      case 3: bound[t].ptr = y.ptr(); break;
      case 4: bound[t].ptr = bias.ptr(); break;
    }
  }
  ASSERT_TRUE(device::sim::run_op_graph(plan->graph, bound).ok());
  const int64_t cg = s.w[1], per_group = 6 / c.groups;
  size_t checked = 0;
  for (int64_t n = 0; n < s.y[0]; ++n)
    for (int64_t k = 0; k < s.y[1]; ++k)
      for (int64_t p = 0; p < s.y[2]; ++p)
        for (int64_t q = 0; q < s.y[3]; ++q) {
          double acc = 0;
          const int64_t g = k / per_group;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t r = 0; r < 3; ++r)
              for (int64_t t = 0; t < 3; ++t) {
                const int64_t h = p * c.stride - c.pad + r * c.dilation;
                const int64_t ww = q * c.stride - c.pad + t * c.dilation;
                if (h < 0 || h >= s.x[2] || ww < 0 || ww >= s.x[3]) continue;
                acc += double{xv(n, g * cg + ci, h, ww)} * wv(k, ci, r, t);
              }
          if (c.fused) acc = std::max(0.0, acc + (k - 3) / 2.0);
          // Products of quarter-integers sum exactly in fp32 here; fp16 output rounds once
          // (relative 2^-11).
          const double tol = c.type == dnn::kHalf ? std::fabs(acc) / 2048 + 1e-6 : 1e-5;
          ASSERT_NEAR(y.get(offset(ys, n, k, p, q)), acc, tol)
              << "at " << n << "," << k << "," << p << "," << q;
          ++checked;
        }
  EXPECT_EQ(checked, size_t(s.y[0] * s.y[1] * s.y[2] * s.y[3]));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DnnConvTest,
    ::testing::Values(ConvCase{}, ConvCase{.nhwc = true},
                      ConvCase{.pad = 2, .stride = 2, .dilation = 2},
                      ConvCase{.nhwc = true, .pad = 0, .stride = 2, .groups = 2},
                      ConvCase{.type = dnn::kHalf, .pad = 1, .stride = 1, .groups = 2},
                      ConvCase{.nhwc = true, .type = dnn::kHalf, .dilation = 2, .groups = 2},
                      ConvCase{.fused = true},
                      ConvCase{.nhwc = true, .type = dnn::kHalf, .fused = true}));

TEST(DnnHost, BatchNormPoolingSoftmaxActivationAddTensor) {
  // x: 1 x 2 x 3 x 4, NCHW, fp32.
  std::vector<float> x(24), y(24), mean{0.5f, -1}, var{4, 0.25f}, scale{2, 3}, bias{1, -1};
  for (int i = 0; i < 24; ++i) x[i] = static_cast<float>(i % 7) - 2.5f;
  const dnn::TensorShape xs{dnn::kFloat, 4, {1, 2, 3, 4}, {24, 12, 4, 1}};
  const dnn::TensorShape bn{dnn::kFloat, 4, {1, 2, 1, 1}, {2, 1, 1, 1}};
  auto p = [](auto& v) { return reinterpret_cast<uint64_t>(v.data()); };
  dnn::BatchNormInference b;
  b.x = b.y = xs;
  b.bn = bn;
  b.x_ptr = p(x), b.y_ptr = p(y), b.scale = p(scale), b.bias = p(bias), b.mean = p(mean),
  b.variance = p(var);
  b.epsilon = 1e-3;
  b.mode = 1;
  ASSERT_TRUE(dnn::check_op(b).ok());
  device::sim::batch_norm_inference(b);
  for (int i = 0; i < 24; ++i) {
    const int c = i / 12;
    EXPECT_NEAR(y[i], scale[c] * (x[i] - mean[c]) / std::sqrt(var[c] + 1e-3) + bias[c], 1e-5);
  }
  // Pooling 2x2 stride 2 with padding 1 over 3x4: 2 x 3 outputs; max and average (both counts).
  for (int mode : {0, 1, 2}) {
    dnn::Pooling pl;
    std::vector<float> out(12);
    pl.x = xs;
    pl.y = {dnn::kFloat, 4, {1, 2, 2, 3}, {12, 6, 3, 1}};
    pl.x_ptr = p(x), pl.y_ptr = p(out);
    pl.mode = mode, pl.spatial = 2;
    pl.window[0] = pl.window[1] = 2, pl.pad[0] = pl.pad[1] = 1, pl.stride[0] = pl.stride[1] = 2;
    ASSERT_TRUE(dnn::check_op(pl).ok()) << dnn::check_op(pl);
    device::sim::pooling_forward(pl);
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) {
          double best = -1e30, sum = 0;
          int inside = 0;
          for (int a = 0; a < 2; ++a)
            for (int bb = 0; bb < 2; ++bb) {
              const int h = 2 * i - 1 + a, w = 2 * j - 1 + bb;
              if (h < 0 || h >= 3 || w < 0 || w >= 4) continue;
              best = std::max(best, double{x[c * 12 + h * 4 + w]});
              sum += x[c * 12 + h * 4 + w];
              ++inside;
            }
          const double want = mode == 0 ? best : sum / (mode == 1 ? 4 : inside);
          EXPECT_NEAR(out[c * 6 + i * 3 + j], want, 1e-6) << "mode " << mode;
        }
  }
  // Softmax, channel mode (over C per position) and instance mode (over C*H*W).
  for (int mode : {0, 1}) {
    dnn::Softmax sm;
    std::vector<float> out(24);
    sm.x = sm.y = xs;
    sm.x_ptr = p(x), sm.y_ptr = p(out);
    sm.algorithm = 1, sm.mode = mode;
    device::sim::softmax_forward(sm);
    for (int i = 0; i < 24; ++i) {
      double sum = 0;
      for (int j = 0; j < 24; ++j)
        if (mode == 0 || j % 12 == i % 12) sum += std::exp(double{x[j]});
      EXPECT_NEAR(out[i], std::exp(double{x[i]}) / sum, 1e-6) << "mode " << mode;
    }
  }
  // Activations: ReLU, sigmoid, tanh; alpha 2, beta 1 blending into y.
  for (int mode : {0, 1, 2}) {
    dnn::Activation a;
    std::vector<float> out(24, 1.0f);
    a.x = a.y = xs;
    a.x_ptr = p(x), a.y_ptr = p(out);
    a.mode = mode, a.alpha = 2, a.beta = 1;
    device::sim::activation_forward(a);
    for (int i = 0; i < 24; ++i) {
      const double v = x[i];
      const double f = mode == 0   ? 1 / (1 + std::exp(-v))
                       : mode == 1 ? std::max(v, 0.0)
                                   : std::tanh(v);
      EXPECT_NEAR(out[i], 2 * f + 1, 1e-5) << "mode " << mode;
    }
  }
  // Add tensor: a per-channel bias broadcast over C.
  dnn::AddTensor at;
  std::vector<float> c(x);
  at.a = bn, at.c = xs, at.a_ptr = p(bias), at.c_ptr = p(c), at.alpha = 1, at.beta = 1;
  ASSERT_TRUE(dnn::check_op(at).ok());
  device::sim::add_tensor(at);
  for (int i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(c[i], x[i] + bias[i / 12]);
}

TEST(DnnHost, UnsupportedGraphsAreNamed) {
  // Two convolutions in one graph: not the host engine's pattern.
  Builder b;
  const uint64_t x = b.tensor(1, dnn::kFloat, {1, 1, 3, 3}, {9, 9, 3, 1});
  const uint64_t w = b.tensor(2, dnn::kFloat, {1, 1, 1, 1}, {1, 1, 1, 1});
  const uint64_t y = b.tensor(3, dnn::kFloat, {1, 1, 3, 3}, {9, 9, 3, 1});
  const uint64_t z = b.tensor(4, dnn::kFloat, {1, 1, 3, 3}, {9, 9, 3, 1});
  const uint64_t conv = b.conv(0, 1, 1);
  b.op_graph({b.conv_op(x, w, y, conv), b.conv_op(y, w, z, conv)});
  auto g = dnn::interpret_operation_graph(b.g);
  ASSERT_TRUE(g.ok()) << g.status();
  Status s = device::sim::host_engine_supports(*g);
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_NE(s.message().find("one convolution"), std::string::npos) << s;

  // A virtual tensor of 2^40 bytes would be hiberd's host memory: refused, never allocated.
  Builder big;
  const uint64_t bx = big.tensor(1, dnn::kFloat, {1, 1, 1, 1}, {1, 1, 1, 1});
  const uint64_t bv = big.tensor(2, dnn::kFloat, {1, 1, 1 << 19, 1 << 19}, {1, 1, 1 << 19, 1}, true);
  const uint64_t by = big.tensor(3, dnn::kFloat, {1, 1, 1, 1}, {1, 1, 1, 1});
  big.op_graph({big.pointwise(dnn::kPwIdentity, bx, bv), big.reduction(dnn::kReduceAdd, bv, by)});
  auto huge = dnn::interpret_operation_graph(big.g);
  ASSERT_TRUE(huge.ok()) << huge.status();
  Status refused = device::sim::host_engine_supports(*huge);
  EXPECT_EQ(refused.code(), ErrorCode::kNotSupported);
  EXPECT_NE(refused.message().find("virtual tensors take"), std::string::npos) << refused;
}

// ---- Softmax, norms and by-value tensors ----
// Binds a plan's tensors by uid: host buffers, or by-value floats.
std::vector<dnn::Bound> bind(const dnn::OpGraph& g, const std::map<int64_t, uint64_t>& buffers,
                             const std::map<int64_t, float>& values = {}) {
  std::vector<dnn::Bound> bound(g.tensors.size());
  for (size_t t = 0; t < bound.size(); ++t) {
    const int64_t uid = g.tensors[t].uid;
    if (auto it = buffers.find(uid); it != buffers.end()) bound[t].ptr = it->second;
    if (auto it = values.find(uid); it != values.end()) {
      bound[t].by_value = true;
      std::memcpy(bound[t].value, &it->second, sizeof(float));
    }
  }
  return bound;
}
uint64_t address(std::vector<float>& v) { return reinterpret_cast<uint64_t>(v.data()); }

TEST(DnnHost, SoftmaxAsReductionsAndPointwiseOps) {
  // y = exp(x - max) / sum(exp(x - max)) over the last dimension of a 2 x 3 x 5 x 7 tensor, the
  // graph cudnn-frontend's softmax node builds, with the statistics max + log(sum).
  const std::vector<int64_t> dims = {2, 3, 5, 7}, row = {2, 3, 5, 1};
  const std::vector<int64_t> st = {105, 35, 7, 1}, row_st = {15, 5, 1, 1};
  Builder b;
  const uint64_t x = b.tensor(1, dnn::kFloat, dims, st);
  const uint64_t mx = b.tensor(10, dnn::kFloat, row, row_st, true);
  const uint64_t sub = b.tensor(11, dnn::kFloat, dims, st, true);
  const uint64_t ex = b.tensor(12, dnn::kFloat, dims, st, true);
  const uint64_t sum = b.tensor(13, dnn::kFloat, row, row_st, true);
  const uint64_t lg = b.tensor(14, dnn::kFloat, row, row_st, true);
  const uint64_t stats = b.tensor(3, dnn::kFloat, row, row_st);
  const uint64_t y = b.tensor(2, dnn::kFloat, dims, st);
  // Listed out of dependency order: the engine orders them.
  b.plan(b.op_graph({b.pointwise(dnn::kPwDiv, ex, y, int64_t(sum)),
                     b.reduction(dnn::kReduceMax, x, mx),
                     b.pointwise(dnn::kPwSub, x, sub, int64_t(mx)),
                     b.pointwise(dnn::kPwExp, sub, ex), b.reduction(dnn::kReduceAdd, ex, sum),
                     b.pointwise(dnn::kPwLog, sum, lg),
                     b.pointwise(dnn::kPwAdd, mx, stats, int64_t(lg))}));
  auto plan = dnn::interpret_plan(b.g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(device::sim::host_engine_supports(plan->graph).ok());
  std::vector<float> hx(210), hy(210, -1), hs(30, -1);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = static_cast<float>((i * 37 % 23)) / 4 - 2;
  ASSERT_TRUE(device::sim::run_op_graph(
                  plan->graph, bind(plan->graph, {{1, address(hx)}, {2, address(hy)},
                                                  {3, address(hs)}}))
                  .ok());
  for (int r = 0; r < 30; ++r) {
    double m = -INFINITY, total = 0;
    for (int i = 0; i < 7; ++i) m = std::max(m, double{hx[r * 7 + i]});
    for (int i = 0; i < 7; ++i) total += std::exp(hx[r * 7 + i] - m);
    EXPECT_NEAR(hs[r], m + std::log(total), 1e-5) << "row " << r;
    for (int i = 0; i < 7; ++i)
      EXPECT_NEAR(hy[r * 7 + i], std::exp(hx[r * 7 + i] - m) / total, 1e-6) << r << "," << i;
  }
}

// A norm's tensors: x and y 4 x 6 x 1 x 1, scale and bias 1 x 6 x 1 x 1, a by-value epsilon,
// mean and inverse variance 4 x 1 x 1 x 1 (uids 1 to 7 in that order, y 5).
struct NormTensors {
  uint64_t x, scale, bias, eps, y, mean, inv;
  explicit NormTensors(Builder& b)
      : x(b.tensor(1, dnn::kFloat, {4, 6, 1, 1}, {6, 1, 1, 1})),
        scale(b.tensor(2, dnn::kFloat, {1, 6, 1, 1}, {6, 1, 1, 1})),
        bias(b.tensor(3, dnn::kFloat, {1, 6, 1, 1}, {6, 1, 1, 1})),
        eps(b.scalar(4)),
        y(b.tensor(5, dnn::kFloat, {4, 6, 1, 1}, {6, 1, 1, 1})),
        mean(b.tensor(6, dnn::kFloat, {4, 1, 1, 1}, {1, 1, 1, 1})),
        inv(b.tensor(7, dnn::kFloat, {4, 1, 1, 1}, {1, 1, 1, 1})) {}
};

TEST(DnnHost, LayerAndRmsNormWithByValueEpsilon) {
  for (int32_t mode : {dnn::kLayerNorm, dnn::kRmsNorm}) {
    const bool layer = mode == dnn::kLayerNorm;
    Builder b;
    const NormTensors n(b);
    b.plan(b.op_graph({b.norm(mode, dnn::kNormTraining, n.x, n.scale, layer ? int64_t(n.bias) : -1,
                              n.eps, n.y, layer ? int64_t(n.mean) : -1, int64_t(n.inv))}));
    auto plan = dnn::interpret_plan(b.g);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(device::sim::host_engine_supports(plan->graph).ok());
    std::vector<float> hx(24), hscale(6), hbias(6), hy(24, -7), hmean(4, -7), hinv(4, -7);
    for (int i = 0; i < 24; ++i) hx[i] = static_cast<float>(i * 7 % 11) - 5;
    for (int i = 0; i < 6; ++i) hscale[i] = 1 + i / 2.0f, hbias[i] = i - 2.5f;
    const float epsilon = 0.25f;
    ASSERT_TRUE(device::sim::run_op_graph(
                    plan->graph,
                    bind(plan->graph,
                         {{1, address(hx)}, {2, address(hscale)}, {3, address(hbias)},
                          {5, address(hy)}, {6, address(hmean)}, {7, address(hinv)}},
                         {{4, epsilon}}))
                    .ok());
    for (int r = 0; r < 4; ++r) {
      double mu = 0, var = 0;
      for (int i = 0; i < 6; ++i) mu += hx[r * 6 + i] / 6.0;
      if (!layer) mu = 0;
      for (int i = 0; i < 6; ++i) var += (hx[r * 6 + i] - mu) * (hx[r * 6 + i] - mu) / 6.0;
      const double inv_sd = 1 / std::sqrt(var + epsilon);
      if (layer) {
        EXPECT_NEAR(hmean[r], mu, 1e-6);
      }
      EXPECT_NEAR(hinv[r], inv_sd, 1e-6);
      for (int i = 0; i < 6; ++i)
        EXPECT_NEAR(hy[r * 6 + i], (hx[r * 6 + i] - mu) * inv_sd * hscale[i] + (layer ? hbias[i] : 0),
                    1e-5)
            << (layer ? "layer" : "rms") << " norm at " << r << "," << i;
    }
  }
}

TEST(DnnHost, CausalMaskFromGenIndexCompareAndSelect) {
  const std::vector<int64_t> dims = {1, 1, 4, 4}, st = {16, 16, 4, 1};
  Builder b;
  const uint64_t x = b.tensor(1, dnn::kFloat, dims, st);
  const uint64_t fill = b.scalar(2);
  const uint64_t rows = b.tensor(10, dnn::kInt32, dims, st, true);
  const uint64_t cols = b.tensor(11, dnn::kInt32, dims, st, true);
  const uint64_t keep = b.tensor(12, dnn::kBoolean, dims, st, true);
  const uint64_t y = b.tensor(3, dnn::kFloat, dims, st);
  b.plan(b.op_graph({b.pointwise(dnn::kPwGenIndex, x, rows, -1, -1, 2),
                     b.pointwise(dnn::kPwGenIndex, x, cols, -1, -1, 3),
                     b.pointwise(dnn::kPwCmpGe, rows, keep, int64_t(cols)),
                     b.pointwise(dnn::kPwBinarySelect, x, y, int64_t(fill), int64_t(keep))}));
  auto plan = dnn::interpret_plan(b.g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<float> hx(16), hy(16);
  for (int i = 0; i < 16; ++i) hx[i] = static_cast<float>(i + 1);
  ASSERT_TRUE(device::sim::run_op_graph(
                  plan->graph, bind(plan->graph, {{1, address(hx)}, {3, address(hy)}}, {{2, -9}}))
                  .ok());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(hy[i * 4 + j], j <= i ? hx[i * 4 + j] : -9) << i << j;
}

TEST(DnnChecks, ByValueTensorsTravelAsValues) {
  // x * scale, the scale by value: the session binds x and y only; the value must come as one.
  Builder b;
  const uint64_t x = b.tensor(1, dnn::kFloat, {1, 1, 2, 2}, {4, 4, 2, 1});
  const uint64_t scale = b.scalar(2);
  const uint64_t y = b.tensor(3, dnn::kFloat, {1, 1, 2, 2}, {4, 4, 2, 1});
  b.plan(b.op_graph({b.pointwise(dnn::kPwMul, x, y, int64_t(scale))}));
  server::DnnGraphs graphs;
  ASSERT_TRUE(
      server::check_dnn_call(library_ops::LibraryOp::kDnnDefineGraph, define(5, b.g), graphs)
          .ok());
  auto run = [&](const dnn::Execute& e) {
    return server::check_dnn_call(library_ops::LibraryOp::kDnnExecute, dnn::encode_execute(e),
                                  graphs);
  };
  dnn::Execute e;
  e.header.graph_id = 5;
  e.entries = {{1, 0x1000}, {3, 0x2000}};
  Status missing = run(e).status();
  EXPECT_EQ(missing.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(missing.message().find("has no value"), std::string::npos) << missing;
  e.entries.push_back({2, 0x3000});  // an address for a by-value tensor
  Status addressed = run(e).status();
  EXPECT_NE(addressed.message().find("by-value tensor"), std::string::npos) << addressed;
  e.entries.pop_back();
  dnn::ByValueEntry value;
  value.uid = 2;
  const float two = 2;
  std::memcpy(value.value, &two, 4);
  e.by_value = {value};
  auto access = run(e);
  ASSERT_TRUE(access.ok()) << access.status();
  EXPECT_EQ(access->operands.size(), 2u);  // x read, y written; the scalar is no operand
  // The codec round-trips the values; a value for a tensor that is not by value is refused.
  auto decoded = dnn::decode_execute(dnn::encode_execute(e));
  ASSERT_TRUE(decoded.ok());
  ASSERT_EQ(decoded->by_value.size(), 1u);
  EXPECT_EQ(std::memcmp(decoded->by_value[0].value, &two, 4), 0);
  e.by_value[0].uid = 1;
  EXPECT_EQ(run(e).status().code(), ErrorCode::kInvalidValue);
  // The sim runs it with the value.
  auto plan = dnn::interpret_plan(b.g);
  ASSERT_TRUE(plan.ok());
  std::vector<float> hx = {1, 2, 3, 4}, hy(4);
  ASSERT_TRUE(device::sim::run_op_graph(
                  plan->graph, bind(plan->graph, {{1, address(hx)}, {3, address(hy)}}, {{2, 2.5f}}))
                  .ok());
  EXPECT_EQ(hy, (std::vector<float>{2.5f, 5, 7.5f, 10}));
}

TEST(DnnGraph, NormsAndReductionsRefuseWhatCudnnRefuses) {
  // A reduction whose Y keeps a dimension X does not have.
  Builder r;
  const uint64_t x = r.tensor(1, dnn::kFloat, {2, 3, 4, 1}, {12, 4, 1, 1});
  const uint64_t y = r.tensor(2, dnn::kFloat, {2, 3, 5, 1}, {15, 5, 1, 1});
  r.op_graph({r.reduction(dnn::kReduceAdd, x, y)});
  EXPECT_EQ(dnn::interpret_operation_graph(r.g).status().code(), ErrorCode::kInvalidValue);
  // A layer norm without its bias; statistics asked of the inference phase; an unknown mode.
  for (int which = 0; which < 3; ++which) {
    Builder b;
    const NormTensors n(b);
    if (which == 0)
      b.op_graph({b.norm(dnn::kLayerNorm, dnn::kNormInference, n.x, n.scale, -1, n.eps, n.y)});
    if (which == 1)
      b.op_graph({b.norm(dnn::kRmsNorm, dnn::kNormInference, n.x, n.scale, int64_t(n.bias), n.eps,
                         n.y, -1, int64_t(n.inv))});
    if (which == 2)
      b.op_graph({b.norm(2, dnn::kNormInference, n.x, n.scale, int64_t(n.bias), n.eps, n.y)});
    Status s = dnn::interpret_operation_graph(b.g).status();
    EXPECT_EQ(s.code(), which == 2 ? ErrorCode::kNotSupported : ErrorCode::kInvalidValue)
        << which << ": " << s;
  }
  // A pointwise mode Hiber does not interpret is named.
  Builder p;
  const uint64_t px = p.tensor(1, dnn::kFloat, {1, 1, 1, 4}, {4, 4, 4, 1});
  const uint64_t py = p.tensor(2, dnn::kFloat, {1, 1, 1, 4}, {4, 4, 4, 1});
  p.op_graph({p.pointwise(dnn::kPwReluFwd + 100, px, py)});  // RELU_BWD
  Status s = dnn::interpret_operation_graph(p.g).status();
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_NE(s.message().find("pointwise mode 200"), std::string::npos) << s;
}

}  // namespace
}  // namespace hiber
