#include "server/device/sim/dnn_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "server/device/sim/numeric.h"

namespace hiber::device::sim {
namespace {

namespace dnn = library_ops::dnn;

// cudnnDataType_t -> the cudaDataType_t numbering of numeric.h.
int32_t host_type(int32_t dnn_type) {
  switch (dnn_type) {
    case dnn::kFloat: return kHostF32;
    case dnn::kDouble: return kHostF64;
    case dnn::kHalf: return kHostF16;
    case dnn::kBfloat16: return kHostBF16;
  }
  return -1;
}

// A strided N-d tensor in host memory.
struct View {
  std::byte* base = nullptr;
  int32_t type = kHostF32;
  int rank = 0;
  int64_t dims[dnn::kMaxDims] = {};
  int64_t strides[dnn::kMaxDims] = {};

  View() = default;
  View(const dnn::Tensor& t, uint64_t ptr)
      : base(reinterpret_cast<std::byte*>(ptr)), type(host_type(t.data_type)), rank(t.rank) {
    for (int i = 0; i < rank; ++i) {
      dims[i] = t.dims[i];
      strides[i] = t.strides[i];
    }
  }
  View(const dnn::TensorShape& s, uint64_t ptr) : View(dnn::as_tensor(s), ptr) {}

  // Element at `coord`; a dimension of size 1 broadcasts (its coordinate is ignored).
  int64_t offset(const int64_t* coord) const {
    int64_t at = 0;
    for (int i = 0; i < rank; ++i) at += (dims[i] == 1 ? 0 : coord[i]) * strides[i];
    return at;
  }
  double load(const int64_t* coord) const { return load_element(base, type, offset(coord)); }
  void store(const int64_t* coord, double v) const { store_element(base, type, offset(coord), v); }
  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
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

double apply_pointwise(const dnn::Op& op, double x, double b) {
  switch (op.pw_mode) {
    case dnn::kPwAdd: return op.alpha1 * x + op.alpha2 * b;
    case dnn::kPwMul: return op.alpha1 * x * op.alpha2 * b;
    case dnn::kPwIdentity: return x;
    case dnn::kPwReluFwd: {
      double v = x > op.relu_lower ? x : op.relu_lower + op.relu_slope * (x - op.relu_lower);
      if (op.has_relu_upper) v = std::min(v, op.relu_upper);
      return v;
    }
    case dnn::kPwTanhFwd: return std::tanh(x);
    case dnn::kPwSigmoidFwd: return 1.0 / (1.0 + std::exp(-x));
    case dnn::kPwGeluFwd: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return x;
}

// Rounds an intermediate value to the precision the computation keeps: fp32, or double for
// double data.
double keep(double v, bool f64) { return f64 ? v : static_cast<double>(static_cast<float>(v)); }

// How the host engine runs a graph: an optional convolution or matmul (the anchor), then a chain
// of pointwise ops.
struct Chain {
  int conv = -1;               // the anchor's position in ops, or -1
  int source = -1;             // without a convolution: the chain's non-virtual input tensor
  std::vector<int> pointwise;  // in order
  int output = -1;             // the final tensor
};

Result<Chain> chain_of(const dnn::OpGraph& g) {
  Chain c;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].kind == dnn::OpKind::kPointwise) continue;
    if (c.conv >= 0)
      return error(ErrorCode::kNotSupported,
                   "the simulated GPU's engine runs one convolution or matmul per graph, not "
                   "several");
    c.conv = static_cast<int>(i);
  }
  int current = -1;
  if (c.conv >= 0) {
    current = g.ops[c.conv].y;
  } else {
    // Without a convolution: the pointwise op whose input no op produces starts the chain.
    for (const dnn::Op& op : g.ops) {
      bool produced = false;
      for (const dnn::Op& other : g.ops) produced = produced || other.y == op.x;
      if (!produced) current = op.x;
    }
    if (current < 0 || g.tensors[current].is_virtual)
      return error(ErrorCode::kNotSupported,
                   "the simulated GPU's engine found no non-virtual input to the pointwise chain");
    c.source = current;
  }
  std::vector<bool> used(g.ops.size(), false);
  if (c.conv >= 0) used[c.conv] = true;
  while (true) {
    int next = -1;
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (!used[i] && g.ops[i].x == current) next = static_cast<int>(i);
    if (next < 0) break;
    if (!g.tensors[current].is_virtual && !(c.conv < 0 && current == c.source))
      return error(ErrorCode::kNotSupported,
                   "the simulated GPU's engine fuses pointwise ops "
                   "only through virtual tensors");
    used[next] = true;
    c.pointwise.push_back(next);
    current = g.ops[next].y;
  }
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (!used[i])
      return error(ErrorCode::kNotSupported,
                   "the simulated GPU's engine runs a convolution or matmul followed by a chain "
                   "of pointwise ops; operation ",
                   i, " of the graph is not on that chain");
  if (g.tensors[current].is_virtual)
    return error(ErrorCode::kInvalidValue, "the graph's output (tensor ", g.tensors[current].uid,
                 ") is virtual");
  c.output = current;
  return c;
}

}  // namespace

Status host_engine_supports(const dnn::OpGraph& g) {
  for (const dnn::Tensor& t : g.tensors)
    if (host_type(t.data_type) < 0)
      return error(ErrorCode::kNotSupported, "tensor ", t.uid, " has cudnnDataType_t ", t.data_type,
                   "; the simulated GPU runs FLOAT, DOUBLE, HALF and BFLOAT16");
  HIBER_ASSIGN_OR_RETURN(Chain c, chain_of(g));
  if (c.conv >= 0 && g.ops[c.conv].kind == dnn::OpKind::kMatmul) {
    const dnn::Op& mm = g.ops[c.conv];
    if (g.tensors[mm.x].data_type != g.tensors[mm.w].data_type ||
        g.tensors[mm.x].data_type == dnn::kDouble || mm.compute_type != dnn::kFloat)
      return error(ErrorCode::kNotSupported, "matmul of A type ", g.tensors[mm.x].data_type,
                   ", B type ", g.tensors[mm.w].data_type, ", compute type ", mm.compute_type,
                   "; the simulated GPU multiplies FLOAT, HALF or BFLOAT16 A and B of one type, ",
                   "computing in FLOAT");
  } else if (c.conv >= 0) {
    const dnn::Op& conv = g.ops[c.conv];
    const bool f64 = g.tensors[conv.x].data_type == dnn::kDouble;
    if (g.tensors[conv.x].data_type != g.tensors[conv.w].data_type)
      return error(ErrorCode::kNotSupported, "convolution with X and W of different types");
    if (f64 != (conv.compute_type == dnn::kDouble) ||
        (conv.compute_type != dnn::kFloat && conv.compute_type != dnn::kDouble &&
         conv.compute_type != dnn::kHalf))
      return error(ErrorCode::kNotSupported, "convolution compute type ", conv.compute_type,
                   " for data type ", g.tensors[conv.x].data_type,
                   "; the simulated GPU computes FLOAT (or HALF) for FLOAT/HALF/BFLOAT16 data, "
                   "DOUBLE for DOUBLE");
  }
  const dnn::Tensor& out = g.tensors[c.output];
  const dnn::Tensor& first = c.conv >= 0 ? g.tensors[g.ops[c.conv].y] : g.tensors[c.source];
  bool same = out.rank == first.rank;
  for (int i = 0; same && i < out.rank; ++i) same = out.dims[i] == first.dims[i];
  if (!same)
    return error(ErrorCode::kNotSupported, "the pointwise chain changes the tensor's dimensions");
  return Status();
}

Status run_op_graph(const dnn::OpGraph& g, std::span<const dnn::Bound> bound) {
  HIBER_ASSIGN_OR_RETURN(Chain c, chain_of(g));
  std::vector<View> views(g.tensors.size());
  for (size_t i = 0; i < g.tensors.size(); ++i) views[i] = View(g.tensors[i], bound[i].ptr);
  const View& out = views[c.output];
  const bool f64 = out.type == kHostF64;

  // The chain's value for one output coordinate, from the convolution's (or source's) value.
  auto finish = [&](const int64_t* coord, double v) {
    for (int p : c.pointwise) {
      const dnn::Op& op = g.ops[p];
      const double b = op.b >= 0 ? views[op.b].load(coord) : 0.0;
      v = keep(apply_pointwise(op, v, b), f64);
    }
    return v;
  };

  if (c.conv < 0) {
    const View& src = views[c.source];
    for_each(out.rank, out.dims,
             [&](const int64_t* coord) { out.store(coord, finish(coord, src.load(coord))); });
    return Status();
  }

  if (g.ops[c.conv].kind == dnn::OpKind::kMatmul) {
    // C[.., m, n] = sum over k of A[.., m, k] * B[.., k, n], accumulated in FLOAT in k order.
    const dnn::Op& op = g.ops[c.conv];
    const View& a = views[op.x];
    const View& b = views[op.w];
    const dnn::Tensor& tc = g.tensors[op.y];
    const int r = tc.rank;
    const int64_t depth = a.dims[r - 1];
    for_each(r, tc.dims, [&](const int64_t* coord) {
      int64_t ac[dnn::kMaxDims], bc[dnn::kMaxDims];
      std::copy(coord, coord + r, ac);
      std::copy(coord, coord + r, bc);
      float acc = 0;
      for (int64_t k = 0; k < depth; ++k) {
        ac[r - 1] = k;
        bc[r - 2] = k;
        acc += static_cast<float>(a.load(ac)) * static_cast<float>(b.load(bc));
      }
      out.store(coord, finish(coord, keep(acc, false)));
    });
    return Status();
  }
  const dnn::Op& op = g.ops[c.conv];
  const View& x = views[op.x];
  const View& w = views[op.w];
  const dnn::Tensor& ty = g.tensors[op.y];
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
  const View& y_out = ty.is_virtual ? out : views[op.y];
  const double beta = ty.is_virtual ? 0.0 : op.beta;
  for_each(ty.rank, ty.dims, [&](const int64_t* coord) {
    const int64_t n = coord[0], k = coord[1];
    int64_t o[3] = {0, 0, 0};
    for (int i = 0; i < s; ++i) o[3 - s + i] = coord[2 + i];
    const int64_t group = k / filters_per_group;
    const std::byte* xb = x.base;
    const std::byte* wb = w.base;
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
            const double xv = load_element(xb, x.type, xc + i0 * xs[0] + i1 * xs[1] + i2 * xs[2]);
            const double wv = load_element(wb, w.type, wc + g0 * ws[0] + g1 * ws[1] + g2 * ws[2]);
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
    const double v = keep(blend(acc, op.alpha, beta, y_out, coord), f64);
    out.store(coord, finish(coord, v));
  });
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
