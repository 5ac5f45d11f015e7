#include "server/device/sim/dnn_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "server/device/sim/numeric.h"

namespace hiber::device::sim {
namespace {

namespace dnn = library_ops::dnn;

bool is_float_type(int32_t t) {
  return t == dnn::kFloat || t == dnn::kDouble || t == dnn::kHalf || t == dnn::kBfloat16;
}
// The data types the host engine reads and writes: the floating ones, and the booleans and
// integers that comparisons, GEN_INDEX and BINARY_SELECT's conditions use.
bool is_carried_type(int32_t t) {
  return is_float_type(t) || t == dnn::kBoolean || t == dnn::kInt32 || t == dnn::kInt64 ||
         t == dnn::kInt8 || t == dnn::kUint8;
}

// A strided N-d tensor in host memory, of a cudnnDataType_t.
struct View {
  std::byte* base = nullptr;
  int32_t type = dnn::kFloat;
  int rank = 0;
  int64_t dims[dnn::kMaxDims] = {};
  int64_t strides[dnn::kMaxDims] = {};

  View() = default;
  View(const dnn::Tensor& t, std::byte* at) : base(at), type(t.data_type), rank(t.rank) {
    for (int i = 0; i < rank; ++i) {
      dims[i] = t.dims[i];
      strides[i] = t.strides[i];
    }
  }
  View(const dnn::Tensor& t, uint64_t ptr) : View(t, reinterpret_cast<std::byte*>(ptr)) {}
  View(const dnn::TensorShape& s, uint64_t ptr) : View(dnn::as_tensor(s), ptr) {}

  // Element at `coord`; a dimension of size 1 broadcasts (its coordinate is ignored).
  int64_t offset(const int64_t* coord) const {
    int64_t at = 0;
    for (int i = 0; i < rank; ++i) at += (dims[i] == 1 ? 0 : coord[i]) * strides[i];
    return at;
  }
  double load_at(int64_t i) const {
    switch (type) {
      case dnn::kFloat: return load_element(base, kHostF32, i);
      case dnn::kDouble: return load_element(base, kHostF64, i);
      case dnn::kHalf: return load_element(base, kHostF16, i);
      case dnn::kBfloat16: return load_element(base, kHostBF16, i);
      case dnn::kBoolean: return reinterpret_cast<const uint8_t*>(base)[i] != 0 ? 1.0 : 0.0;
      case dnn::kInt8: return reinterpret_cast<const int8_t*>(base)[i];
      case dnn::kUint8: return reinterpret_cast<const uint8_t*>(base)[i];
      case dnn::kInt32: return reinterpret_cast<const int32_t*>(base)[i];
      case dnn::kInt64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[i]);
    }
    return 0;
  }
  // Stores v as the view's type: floating types round to nearest even; integers truncate toward
  // zero (C's conversion); a boolean is v != 0.
  void store_at(int64_t i, double v) const {
    switch (type) {
      case dnn::kFloat: store_element(base, kHostF32, i, v); break;
      case dnn::kDouble: store_element(base, kHostF64, i, v); break;
      case dnn::kHalf: store_element(base, kHostF16, i, v); break;
      case dnn::kBfloat16: store_element(base, kHostBF16, i, v); break;
      case dnn::kBoolean: reinterpret_cast<uint8_t*>(base)[i] = v != 0 ? 1 : 0; break;
      case dnn::kInt8: reinterpret_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); break;
      case dnn::kUint8: reinterpret_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
      case dnn::kInt32: reinterpret_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
      case dnn::kInt64: reinterpret_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    }
  }
  double load(const int64_t* coord) const { return load_at(offset(coord)); }
  void store(const int64_t* coord, double v) const { store_at(offset(coord), v); }
};

// Calls f(coord) for every coordinate of `dims`, the last dimension fastest.
template <typename F>
void for_each(int rank, const int64_t* dims, F&& f) {
  int64_t coord[dnn::kMaxDims] = {};
  for (int i = 0; i < rank; ++i)
    if (dims[i] == 0) return;
  while (true) {
    f(static_cast<const int64_t*>(coord));
    int i = rank - 1;
    for (; i >= 0; --i) {
      if (++coord[i] < dims[i]) break;
      coord[i] = 0;
    }
    if (i < 0) return;
  }
}

// alpha * value + beta * the old output (not read when beta is 0, so NaNs there do not spread).
double blend(double value, double alpha, double beta, const View& y, const int64_t* coord) {
  double out = alpha * value;
  if (beta != 0) out += beta * y.load(coord);
  return out;
}

constexpr double kSqrt2OverPi = 0.7978845608028654;

double apply_pointwise(const dnn::Op& op, double x, double b, double t, const int64_t* coord) {
  switch (op.pw_mode) {
    case dnn::kPwAdd: return op.alpha1 * x + op.alpha2 * b;
    case dnn::kPwMul: return op.alpha1 * x * op.alpha2 * b;
    case dnn::kPwMin: return std::min(x, b);
    case dnn::kPwMax: return std::max(x, b);
    case dnn::kPwSqrt: return std::sqrt(x);
    case dnn::kPwAddSquare: return x + b * b;
    case dnn::kPwDiv: return x / b;
    case dnn::kPwPow: return std::pow(x, b);
    case dnn::kPwSub: return x - b;
    case dnn::kPwAbs: return std::fabs(x);
    case dnn::kPwExp: return std::exp(x);
    case dnn::kPwLog: return std::log(x);
    case dnn::kPwNeg: return -x;
    case dnn::kPwRsqrt: return 1.0 / std::sqrt(x);
    case dnn::kPwErf: return std::erf(x);
    case dnn::kPwIdentity: return x;
    case dnn::kPwReciprocal: return 1.0 / x;
    case dnn::kPwReluFwd: {
      double v = x > op.relu_lower ? x : op.relu_lower + op.relu_slope * (x - op.relu_lower);
      if (op.has_relu_upper) v = std::min(v, op.relu_upper);
      return v;
    }
    case dnn::kPwTanhFwd: return std::tanh(x);
    case dnn::kPwSigmoidFwd: return 1.0 / (1.0 + std::exp(-x));
    case dnn::kPwGeluFwd: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case dnn::kPwSwishFwd: return x / (1.0 + std::exp(-x));
    case dnn::kPwGeluApproxTanhFwd:
      return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
    case dnn::kPwCmpEq: return x == b;
    case dnn::kPwCmpNeq: return x != b;
    case dnn::kPwCmpGt: return x > b;
    case dnn::kPwCmpGe: return x >= b;
    case dnn::kPwCmpLt: return x < b;
    case dnn::kPwCmpLe: return x <= b;
    case dnn::kPwLogicalAnd: return (x != 0) && (b != 0);
    case dnn::kPwLogicalOr: return (x != 0) || (b != 0);
    case dnn::kPwLogicalNot: return x == 0;
    case dnn::kPwGenIndex: return static_cast<double>(coord[op.axis]);
    case dnn::kPwBinarySelect: return t != 0 ? x : b;
  }
  return x;
}

// The order the host engine runs a graph's operations in: each after the producers of what it
// reads. kNotSupported (naming why) for a graph it cannot order or does not run.
Result<std::vector<int>> schedule(const dnn::OpGraph& g) {
  std::vector<int> producer(g.tensors.size(), -1);
  int convolutions = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    convolutions += g.ops[i].kind == dnn::OpKind::kConvForward ? 1 : 0;
    for (int out : dnn::op_outputs(g.ops[i])) {
      if (producer[out] >= 0)
        return error(ErrorCode::kInvalidValue, "tensor ", g.tensors[out].uid,
                     " is written by two operations of the graph");
      if (g.tensors[out].by_value)
        return error(ErrorCode::kInvalidValue, "tensor ", g.tensors[out].uid,
                     " is by value and cannot be an operation's output");
      producer[out] = static_cast<int>(i);
    }
  }
  if (convolutions > 1)
    return error(ErrorCode::kNotSupported,
                 "the simulated GPU's engine runs one convolution per graph, not ", convolutions,
                 " (no cuDNN engine fuses two)");
  for (size_t t = 0; t < g.tensors.size(); ++t)
    if (g.tensors[t].is_virtual && producer[t] < 0)
      return error(ErrorCode::kInvalidValue, "virtual tensor ", g.tensors[t].uid,
                   " is read but no operation of the graph writes it");
  std::vector<int> order;
  std::vector<bool> done(g.ops.size(), false), ready(g.tensors.size(), false);
  for (size_t t = 0; t < g.tensors.size(); ++t) ready[t] = producer[t] < 0;
  while (order.size() < g.ops.size()) {
    bool progressed = false;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      if (done[i]) continue;
      const std::vector<int> in = dnn::op_inputs(g.ops[i]);
      if (!std::all_of(in.begin(), in.end(), [&](int t) { return ready[t]; })) continue;
      done[i] = true;
      progressed = true;
      order.push_back(static_cast<int>(i));
      for (int out : dnn::op_outputs(g.ops[i])) ready[out] = true;
    }
    if (!progressed)
      return error(ErrorCode::kInvalidValue, "the graph's operations form a cycle");
  }
  return order;
}

// Rounds an intermediate value to the precision the computation keeps: fp32, or double for
// double data.
double keep(double v, bool f64) { return f64 ? v : static_cast<double>(static_cast<float>(v)); }

void run_conv(const dnn::Op& op, const View& x, const View& w, const View& y, bool y_virtual) {
  const bool f64 = x.type == dnn::kDouble;
  const int s = op.spatial;
  // Spatial dimensions padded to 3 (a missing one has size 1).
  int64_t in[3] = {1, 1, 1}, fil[3] = {1, 1, 1}, st[3] = {1, 1, 1}, dil[3] = {1, 1, 1},
          pad[3] = {0, 0, 0};
  int64_t xs[3] = {0, 0, 0}, ws[3] = {0, 0, 0};
  for (int i = 0; i < s; ++i) {
    const int d = 3 - s + i;
    in[d] = x.dims[2 + i];
    fil[d] = w.dims[2 + i];
    st[d] = op.stride[i];
    dil[d] = op.dilation[i];
    pad[d] = op.pre_pad[i];
    xs[d] = x.strides[2 + i];
    ws[d] = w.strides[2 + i];
  }
  const int64_t channels_per_group = w.dims[1];
  const int64_t groups = x.dims[1] / channels_per_group;
  const int64_t filters_per_group = w.dims[0] / groups;
  const bool flip = op.conv_mode == dnn::kConvolutionMode;
  const double beta = y_virtual ? 0.0 : op.beta;
  for_each(y.rank, y.dims, [&](const int64_t* coord) {
    const int64_t n = coord[0], k = coord[1];
    int64_t o[3] = {0, 0, 0};
    for (int i = 0; i < s; ++i) o[3 - s + i] = coord[2 + i];
    const int64_t group = k / filters_per_group;
    double acc64 = 0;
    float acc32 = 0;
    for (int64_t ci = 0; ci < channels_per_group; ++ci) {
      const int64_t xc = (n * x.strides[0] + (group * channels_per_group + ci) * x.strides[1]);
      const int64_t wc = k * w.strides[0] + ci * w.strides[1];
      for (int64_t f0 = 0; f0 < fil[0]; ++f0) {
        const int64_t i0 = o[0] * st[0] - pad[0] + f0 * dil[0];
        if (i0 < 0 || i0 >= in[0]) continue;
        for (int64_t f1 = 0; f1 < fil[1]; ++f1) {
          const int64_t i1 = o[1] * st[1] - pad[1] + f1 * dil[1];
          if (i1 < 0 || i1 >= in[1]) continue;
          for (int64_t f2 = 0; f2 < fil[2]; ++f2) {
            const int64_t i2 = o[2] * st[2] - pad[2] + f2 * dil[2];
            if (i2 < 0 || i2 >= in[2]) continue;
            const int64_t g0 = flip ? fil[0] - 1 - f0 : f0;
            const int64_t g1 = flip ? fil[1] - 1 - f1 : f1;
            const int64_t g2 = flip ? fil[2] - 1 - f2 : f2;
            const double xv = x.load_at(xc + i0 * xs[0] + i1 * xs[1] + i2 * xs[2]);
            const double wv = w.load_at(wc + g0 * ws[0] + g1 * ws[1] + g2 * ws[2]);
            if (f64) {
              acc64 += xv * wv;
            } else {
              acc32 += static_cast<float>(xv) * static_cast<float>(wv);
            }
          }
        }
      }
    }
    const double acc = f64 ? acc64 : static_cast<double>(acc32);
    y.store(coord, keep(blend(acc, op.alpha, beta, y, coord), f64));
  });
}

// C[.., m, n] = sum over k of A[.., m, k] * B[.., k, n], accumulated in FLOAT in k order.
void run_matmul(const View& a, const View& b, const View& c) {
  const int r = c.rank;
  const int64_t depth = a.dims[r - 1];
  for_each(r, c.dims, [&](const int64_t* coord) {
    int64_t ac[dnn::kMaxDims], bc[dnn::kMaxDims];
    std::copy(coord, coord + r, ac);
    std::copy(coord, coord + r, bc);
    float acc = 0;
    for (int64_t k = 0; k < depth; ++k) {
      ac[r - 1] = k;
      bc[r - 2] = k;
      acc += static_cast<float>(a.load(ac)) * static_cast<float>(b.load(bc));
    }
    c.store(coord, acc);
  });
}

void run_pointwise(const dnn::Op& op, const std::vector<View>& views) {
  const View& y = views[op.y];
  const View& x = views[op.x];
  for_each(y.rank, y.dims, [&](const int64_t* coord) {
    const double b = op.b >= 0 ? views[op.b].load(coord) : 0.0;
    const double t = op.t >= 0 ? views[op.t].load(coord) : 0.0;
    y.store(coord, apply_pointwise(op, x.load(coord), b, t, coord));
  });
}

// Y's element for each of X's: the dense index into Y's dimensions (reduced ones are 1).
int64_t reduced_index(const View& y, const int64_t* coord) {
  int64_t at = 0;
  for (int i = 0; i < y.rank; ++i) at = at * y.dims[i] + (y.dims[i] == 1 ? 0 : coord[i]);
  return at;
}

void run_reduction(const dnn::Op& op, const View& x, const View& y) {
  int64_t outputs = 1;
  for (int i = 0; i < y.rank; ++i) outputs *= y.dims[i];
  double start = 0;
  switch (op.reduce_op) {
    case dnn::kReduceMul: start = 1; break;
    case dnn::kReduceMin: start = std::numeric_limits<double>::infinity(); break;
    case dnn::kReduceMax: start = -std::numeric_limits<double>::infinity(); break;
  }
  std::vector<double> acc(static_cast<size_t>(outputs), start);
  int64_t per_output = 1;
  for (int i = 0; i < x.rank; ++i) per_output *= y.dims[i] == 1 ? x.dims[i] : 1;
  for_each(x.rank, x.dims, [&](const int64_t* coord) {
    double& a = acc[static_cast<size_t>(reduced_index(y, coord))];
    const double v = x.load(coord);
    switch (op.reduce_op) {
      case dnn::kReduceAdd:
      case dnn::kReduceAvg: a += v; break;
      case dnn::kReduceMul: a *= v; break;
      case dnn::kReduceMin: a = std::min(a, v); break;
      case dnn::kReduceMax: a = std::max(a, v); break;
      case dnn::kReduceAmax: a = std::max(a, std::fabs(v)); break;
      case dnn::kReduceNorm1: a += std::fabs(v); break;
      case dnn::kReduceNorm2: a += v * v; break;
    }
  });
  for_each(y.rank, y.dims, [&](const int64_t* coord) {
    double v = acc[static_cast<size_t>(reduced_index(y, coord))];
    if (op.reduce_op == dnn::kReduceAvg) v /= static_cast<double>(per_output);
    if (op.reduce_op == dnn::kReduceNorm2) v = std::sqrt(v);
    y.store(coord, v);
  });
}

// Layer norm: y = (x - mean) / sqrt(var + eps) * scale + bias over each X[n, ...]; RMS norm:
// y = x / sqrt(mean(x^2) + eps) * scale (+ bias). Statistics in double.
void run_norm(const dnn::Op& op, const std::vector<View>& views) {
  const View& x = views[op.x];
  const View& y = views[op.y];
  const double epsilon = views[op.epsilon].load_at(0);
  const bool layer = op.norm_mode == dnn::kLayerNorm;
  int64_t row[dnn::kMaxDims];
  row[0] = 1;
  for (int i = 1; i < x.rank; ++i) row[i] = x.dims[i];
  int64_t count = 1;
  for (int i = 1; i < x.rank; ++i) count *= x.dims[i];
  for (int64_t n = 0; n < x.dims[0]; ++n) {
    int64_t at[dnn::kMaxDims];
    auto each = [&](auto&& f) {
      for_each(x.rank, row, [&](const int64_t* c) {
        std::copy(c, c + x.rank, at);
        at[0] = n;
        f(static_cast<const int64_t*>(at));
      });
    };
    double sum = 0, squares = 0;
    each([&](const int64_t* c) {
      const double v = x.load(c);
      sum += v;
      squares += v * v;
    });
    const double mean = layer ? sum / static_cast<double>(count) : 0.0;
    double variance = 0;
    if (layer) {
      each([&](const int64_t* c) { variance += (x.load(c) - mean) * (x.load(c) - mean); });
      variance /= static_cast<double>(count);
    } else {
      variance = squares / static_cast<double>(count);
    }
    const double inv = 1.0 / std::sqrt(variance + epsilon);
    each([&](const int64_t* c) {
      double v = (x.load(c) - mean) * inv * views[op.w].load(c);
      if (op.b >= 0) v += views[op.b].load(c);
      y.store(c, v);
    });
    const int64_t stat[dnn::kMaxDims] = {n};
    if (op.mean >= 0) views[op.mean].store(stat, mean);
    if (op.inv_variance >= 0) views[op.inv_variance].store(stat, inv);
  }
}

}  // namespace

namespace {

// Everything host_engine_supports checks, and the order run_op_graph runs the operations in.
Result<std::vector<int>> checked_schedule(const dnn::OpGraph& g) {
  for (const dnn::Tensor& t : g.tensors)
    if (!is_carried_type(t.data_type))
      return error(ErrorCode::kNotSupported, "tensor ", t.uid, " has cudnnDataType_t ", t.data_type,
                   "; the simulated GPU runs FLOAT, DOUBLE, HALF, BFLOAT16, BOOLEAN, INT8, UINT8, "
                   "INT32 and INT64");
  HIBER_ASSIGN_OR_RETURN(std::vector<int> order, schedule(g));
  // Virtual tensors take hiberd's host memory while the graph runs: bounded, so a graph cannot
  // exhaust it.
  uint64_t virtual_bytes = 0;
  for (const dnn::Tensor& t : g.tensors) {
    if (!t.is_virtual) continue;
    HIBER_ASSIGN_OR_RETURN(uint64_t bytes, dnn::tensor_extent(t));
    virtual_bytes += bytes;
  }
  if (virtual_bytes > kMaxVirtualBytes)
    return error(ErrorCode::kNotSupported, "the graph's virtual tensors take ", virtual_bytes,
                 " bytes; the simulated GPU holds at most ", kMaxVirtualBytes, " per graph");
  for (const dnn::Op& op : g.ops) {
    const int32_t xt = g.tensors[op.x].data_type;
    if (op.kind == dnn::OpKind::kMatmul) {
      if (xt != g.tensors[op.w].data_type || !is_float_type(xt) || xt == dnn::kDouble ||
          op.compute_type != dnn::kFloat)
        return error(ErrorCode::kNotSupported, "matmul of A type ", xt, ", B type ",
                     g.tensors[op.w].data_type, ", compute type ", op.compute_type,
                     "; the simulated GPU multiplies FLOAT, HALF or BFLOAT16 A and B of one type, ",
                     "computing in FLOAT");
    } else if (op.kind == dnn::OpKind::kConvForward) {
      const bool f64 = xt == dnn::kDouble;
      if (xt != g.tensors[op.w].data_type || !is_float_type(xt))
        return error(ErrorCode::kNotSupported,
                     "convolution with X and W of different or non-floating types");
      if (f64 != (op.compute_type == dnn::kDouble) ||
          (op.compute_type != dnn::kFloat && op.compute_type != dnn::kDouble &&
           op.compute_type != dnn::kHalf))
        return error(ErrorCode::kNotSupported, "convolution compute type ", op.compute_type,
                     " for data type ", xt,
                     "; the simulated GPU computes FLOAT (or HALF) for FLOAT/HALF/BFLOAT16 data, "
                     "DOUBLE for DOUBLE");
    } else if (op.kind == dnn::OpKind::kNormForward) {
      if (!is_float_type(xt))
        return error(ErrorCode::kNotSupported, "norm forward of X type ", xt,
                     "; the simulated GPU normalizes floating types");
    }
  }
  return order;
}

}  // namespace

Status host_engine_supports(const dnn::OpGraph& g) { return checked_schedule(g).status(); }

Status run_op_graph(const dnn::OpGraph& g, std::span<const dnn::Bound> bound) {
  HIBER_ASSIGN_OR_RETURN(std::vector<int> order, checked_schedule(g));
  // Virtual tensors live here while the graph runs; by-value ones are copied out of `bound`.
  std::vector<std::vector<std::byte>> scratch(g.tensors.size());
  std::vector<std::array<std::byte, dnn::kMaxByValueBytes>> values(g.tensors.size());
  std::vector<View> views(g.tensors.size());
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const dnn::Tensor& t = g.tensors[i];
    if (t.is_virtual) {
      HIBER_ASSIGN_OR_RETURN(uint64_t bytes, dnn::tensor_extent(t));
      scratch[i].resize(bytes);
      views[i] = View(t, scratch[i].data());
    } else if (bound[i].by_value) {
      std::memcpy(values[i].data(), bound[i].value, dnn::kMaxByValueBytes);
      views[i] = View(t, values[i].data());
    } else {
      views[i] = View(t, bound[i].ptr);
    }
  }
  for (int i : order) {
    const dnn::Op& op = g.ops[i];
    switch (op.kind) {
      case dnn::OpKind::kConvForward:
        run_conv(op, views[op.x], views[op.w], views[op.y], g.tensors[op.y].is_virtual);
        break;
      case dnn::OpKind::kMatmul: run_matmul(views[op.x], views[op.w], views[op.y]); break;
      case dnn::OpKind::kPointwise: run_pointwise(op, views); break;
      case dnn::OpKind::kReduction: run_reduction(op, views[op.x], views[op.y]); break;
      case dnn::OpKind::kNormForward: run_norm(op, views); break;
    }
  }
  return Status();
}

void batch_norm_inference(const dnn::BatchNormInference& op) {
  const View x(op.x, op.x_ptr), y(op.y, op.y_ptr);
  const View scale(op.bn, op.scale), bias(op.bn, op.bias), mean(op.bn, op.mean),
      var(op.bn, op.variance);
  for_each(x.rank, x.dims, [&](const int64_t* coord) {
    // bn's dims of size 1 (N always; spatial ones in spatial mode) broadcast.
    const double inv = 1.0 / std::sqrt(var.load(coord) + op.epsilon);
    const double v =
        scale.load(coord) * (x.load(coord) - mean.load(coord)) * inv + bias.load(coord);
    y.store(coord, blend(v, op.alpha, op.beta, y, coord));
  });
}

void pooling_forward(const dnn::Pooling& op) {
  const View x(op.x, op.x_ptr), y(op.y, op.y_ptr);
  const int s = op.spatial;
  const bool is_max = op.mode == 0 || op.mode == 3;
  const bool propagate_nan = op.nan_propagation == 1;
  for_each(y.rank, y.dims, [&](const int64_t* coord) {
    int64_t window[dnn::kMaxSpatial] = {1, 1, 1};
    for (int i = 0; i < s; ++i) window[i] = op.window[i];
    double best = -std::numeric_limits<double>::infinity();
    double sum = 0;
    int64_t inside = 0;
    bool nan = false;
    int64_t at[dnn::kMaxDims] = {coord[0], coord[1]};
    for_each(s, window, [&](const int64_t* f) {
      for (int i = 0; i < s; ++i) {
        at[2 + i] = coord[2 + i] * op.stride[i] - op.pad[i] + f[i];
        if (at[2 + i] < 0 || at[2 + i] >= x.dims[2 + i]) return;  // padding
      }
      const double v = x.load(at);
      nan = nan || std::isnan(v);
      best = std::max(best, v);
      sum += v;
      ++inside;
    });
    int64_t cells = 1;
    for (int i = 0; i < s; ++i) cells *= op.window[i];
    double v;
    if (is_max) {
      v = nan && propagate_nan ? std::numeric_limits<double>::quiet_NaN() : best;
    } else {
      v = sum / static_cast<double>(op.mode == 1 ? cells : std::max<int64_t>(inside, 1));
    }
    y.store(coord, blend(v, op.alpha, op.beta, y, coord));
  });
}

void activation_forward(const dnn::Activation& op) {
  const View x(op.x, op.x_ptr), y(op.y, op.y_ptr);
  for_each(x.rank, x.dims, [&](const int64_t* coord) {
    const double v = x.load(coord);
    double r = v;
    switch (op.mode) {
      case 0: r = 1.0 / (1.0 + std::exp(-v)); break;               // SIGMOID
      case 1: r = v > 0 ? v : 0; break;                            // RELU
      case 2: r = std::tanh(v); break;                             // TANH
      case 3: r = std::min(std::max(v, 0.0), op.coef); break;      // CLIPPED_RELU
      case 4: r = v > 0 ? v : op.coef * (std::exp(v) - 1); break;  // ELU
      case 5: r = v; break;                                        // IDENTITY
      case 6: r = v / (1.0 + std::exp(-op.coef * v)); break;       // SWISH
    }
    if (std::isnan(v) && op.nan_propagation == 1) r = v;
    y.store(coord, blend(r, op.alpha, op.beta, y, coord));
  });
}

void softmax_forward(const dnn::Softmax& op) {
  const View x(op.x, op.x_ptr), y(op.y, op.y_ptr);
  // Instance: one softmax per n over every other dimension; channel: one per (n, spatial) over C.
  const bool instance = op.mode == 0;
  int64_t outer[dnn::kMaxDims], inner[dnn::kMaxDims];
  for (int i = 0; i < x.rank; ++i) {
    const bool reduced = instance ? i >= 1 : i == 1;
    outer[i] = reduced ? 1 : x.dims[i];
    inner[i] = reduced ? x.dims[i] : 1;
  }
  for_each(x.rank, outer, [&](const int64_t* base) {
    int64_t at[dnn::kMaxDims];
    auto each = [&](auto&& f) {
      for_each(x.rank, inner, [&](const int64_t* in) {
        for (int i = 0; i < x.rank; ++i) at[i] = base[i] + in[i];
        f(static_cast<const int64_t*>(at));
      });
    };
    double max = op.algorithm == 0 ? 0.0 : -std::numeric_limits<double>::infinity();
    if (op.algorithm != 0) each([&](const int64_t* c) { max = std::max(max, x.load(c)); });
    double sum = 0;
    each([&](const int64_t* c) { sum += std::exp(x.load(c) - max); });
    each([&](const int64_t* c) {
      const double shifted = x.load(c) - max;
      const double v = op.algorithm == 2 ? shifted - std::log(sum) : std::exp(shifted) / sum;
      y.store(c, blend(v, op.alpha, op.beta, y, c));
    });
  });
}

void add_tensor(const dnn::AddTensor& op) {
  const View a(op.a, op.a_ptr), c(op.c, op.c_ptr);
  for_each(c.rank, c.dims, [&](const int64_t* coord) {
    c.store(coord, blend(a.load(coord), op.alpha, op.beta, c, coord));
  });
}

}  // namespace hiber::device::sim
