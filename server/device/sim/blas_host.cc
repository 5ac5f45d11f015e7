#include "server/device/sim/blas_host.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "library_ops/blas_ops.h"
#include "server/device/sim/numeric.h"
#include "server/device/sim_device.h"

namespace hiber::device::sim {
namespace {

using library_ops::blas::BatchKind;
using library_ops::blas::Gemm;
using library_ops::blas::LtHeuristic;
using library_ops::blas::LtMatmul;
using library_ops::blas::LtProblem;

constexpr int32_t kCompute16F = 64;
constexpr int32_t kCompute64F = 70;
constexpr int32_t kCompute64FPedantic = 71;

// The compute types whose arithmetic the host reproduces for `data` inputs: fp64 data in fp64;
// fp32 data in fp32 (TF32 and the other fast modes are allowed to be more exact, and the host is);
// fp16 and bf16 data in fp32 (or, for fp16, the 16F types, also accumulated in fp32 here).
bool supported(int32_t compute_type, int32_t data, int32_t output) {
  const bool f64 = compute_type == kCompute64F || compute_type == kCompute64FPedantic ||
                   compute_type == kHostF64;
  if (data == kHostF64) return f64 && output == kHostF64;
  if (f64) return false;
  const bool f16_compute =
      compute_type == kCompute16F || compute_type == 65 || compute_type == kHostF16;
  if (f16_compute) return data == kHostF16 && output == kHostF16;
  const bool f32_compute = (compute_type >= 68 && compute_type <= 69) ||
                           (compute_type >= 74 && compute_type <= 77) || compute_type == kHostF32;
  if (!f32_compute) return false;
  if (data == kHostF32) return output == kHostF32;
  return output == data || output == kHostF32;  // fp16/bf16 in, same or fp32 out
}

// The scale type's value at `p` (host bytes, or a device address under pointer mode device).
double scalar(const void* p, int32_t compute_type) {
  if (compute_type == kCompute64F || compute_type == kCompute64FPedantic ||
      compute_type == kHostF64)
    return *static_cast<const double*>(p);
  if (compute_type == kCompute16F || compute_type == 65 || compute_type == kHostF16)
    return half_to_float(*static_cast<const uint16_t*>(p));
  return *static_cast<const float*>(p);
}

template <typename Acc>
void gemm_one(const Gemm& g, const std::byte* a, const std::byte* b, std::byte* c, double alpha,
              double beta) {
  const bool ta = g.transa != 0;
  const bool tb = g.transb != 0;
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      Acc acc = 0;
      for (int64_t l = 0; l < g.k; ++l) {
        const int64_t ai = ta ? l + i * g.lda : i + l * g.lda;
        const int64_t bi = tb ? j + l * g.ldb : l + j * g.ldb;
        acc += static_cast<Acc>(load_element(a, g.a_type, ai)) *
               static_cast<Acc>(load_element(b, g.b_type, bi));
      }
      const int64_t ci = i + j * g.ldc;
      // beta == 0: C is not read, so NaNs in it do not propagate (as BLAS specifies).
      Acc out = static_cast<Acc>(alpha) * acc;
      if (beta != 0)
        out += static_cast<Acc>(beta) * static_cast<Acc>(load_element(c, g.c_type, ci));
      store_element(c, g.c_type, ci, static_cast<double>(out));
    }
  }
}

Status run_gemm(const Gemm& g) {
  const double alpha = g.pointer_mode == 1
                           ? scalar(reinterpret_cast<const void*>(g.alpha_ptr), g.compute_type)
                           : scalar(g.alpha.bytes, g.compute_type);
  const double beta = g.pointer_mode == 1
                          ? scalar(reinterpret_cast<const void*>(g.beta_ptr), g.compute_type)
                          : scalar(g.beta.bytes, g.compute_type);
  const int64_t a_size = static_cast<int64_t>(*library_ops::blas::element_bytes(g.a_type, "A"));
  const int64_t b_size = static_cast<int64_t>(*library_ops::blas::element_bytes(g.b_type, "B"));
  const int64_t c_size = static_cast<int64_t>(*library_ops::blas::element_bytes(g.c_type, "C"));
  const int32_t batches = g.batch == BatchKind::kSingle ? 1 : g.batch_count;
  const bool f64 = g.c_type == kHostF64;
  for (int32_t i = 0; i < batches; ++i) {
    const std::byte* a;
    const std::byte* b;
    std::byte* c;
    if (g.batch == BatchKind::kPointerArray) {
      a = reinterpret_cast<const std::byte*>(reinterpret_cast<const uint64_t*>(g.a)[i]);
      b = reinterpret_cast<const std::byte*>(reinterpret_cast<const uint64_t*>(g.b)[i]);
      c = reinterpret_cast<std::byte*>(reinterpret_cast<const uint64_t*>(g.c)[i]);
    } else {
      a = reinterpret_cast<const std::byte*>(g.a) + i * g.stride_a * a_size;
      b = reinterpret_cast<const std::byte*>(g.b) + i * g.stride_b * b_size;
      c = reinterpret_cast<std::byte*>(g.c) + i * g.stride_c * c_size;
    }
    if (f64) {
      gemm_one<double>(g, a, b, c, alpha, beta);
    } else {
      gemm_one<float>(g, a, b, c, alpha, beta);
    }
  }
  return Status();
}

// cuBLASLt's GELU epilogue: the tanh approximation (as PyTorch's gelu(approximate="tanh"), the
// only GELU it fuses into cuBLASLt), computed in float as the epilogue is.
float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// The scale type the host reproduces for `compute_type`: half for the 16F types, double for the
// 64F ones, float otherwise (as cuBLASLt requires of CUBLASLT_MATMUL_DESC_SCALE_TYPE for them).
int32_t lt_scale_type(int32_t compute_type) {
  if (compute_type == kCompute16F || compute_type == 65) return kHostF16;
  if (compute_type == kCompute64F || compute_type == kCompute64FPedantic) return kHostF64;
  return kHostF32;
}

double lt_scalar(const void* p, int32_t scale_type) {
  return scale_type == kHostF64   ? *static_cast<const double*>(p)
         : scale_type == kHostF16 ? half_to_float(*static_cast<const uint16_t*>(p))
                                  : *static_cast<const float*>(p);
}

// Whether the host runs `p` exactly as cuBLASLt computes it; why not otherwise.
Status lt_supported(const LtProblem& p) {
  if (p.a.type != p.b.type || p.c.type != p.d.type || !is_host_type(p.a.type) ||
      !is_host_type(p.d.type) || !supported(p.compute_type, p.a.type, p.d.type) ||
      p.scale_type != lt_scale_type(p.compute_type) ||
      ((p.epilogue & library_ops::blas::kEpilogueBias) && !is_host_type(p.bias_type)))
    return error(ErrorCode::kNotSupported, "cuBLASLt matmul with A type ", p.a.type, ", B type ",
                 p.b.type, ", C type ", p.c.type, ", D type ", p.d.type, ", compute type ",
                 p.compute_type, ", scale type ", p.scale_type, " and bias type ", p.bias_type,
                 ": the simulated GPU runs fp32, fp64, fp16 and bf16 matmuls (fp16/bf16 with "
                 "fp32 accumulation) with the compute type's own scale type");
  return Status();
}

template <typename Acc>
void lt_one(const LtMatmul& mm, const std::byte* a, const std::byte* b, const std::byte* c,
            std::byte* d, const std::byte* bias, double alpha, double beta) {
  const LtProblem& p = mm.problem;
  const int64_t m = p.d.rows, n = p.d.cols, k = p.transa ? p.a.rows : p.a.cols;
  const bool ta = p.transa != 0;
  const bool tb = p.transb != 0;
  const bool has_bias = (p.epilogue & library_ops::blas::kEpilogueBias) != 0;
  const int32_t activation = p.epilogue & ~library_ops::blas::kEpilogueBias;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      Acc acc = 0;
      for (int64_t l = 0; l < k; ++l) {
        const int64_t ai = ta ? l + i * p.a.ld : i + l * p.a.ld;
        const int64_t bi = tb ? j + l * p.b.ld : l + j * p.b.ld;
        acc += static_cast<Acc>(load_element(a, p.a.type, ai)) *
               static_cast<Acc>(load_element(b, p.b.type, bi));
      }
      Acc out = static_cast<Acc>(alpha) * acc;
      // beta == 0: C is not read (NaNs in it do not propagate).
      if (beta != 0)
        out += static_cast<Acc>(beta) * static_cast<Acc>(load_element(c, p.c.type, i + j * p.c.ld));
      if (has_bias) out += static_cast<Acc>(load_element(bias, p.bias_type, i));  // one per row
      if (activation == library_ops::blas::kEpilogueRelu) {
        out = out > 0 ? out : Acc{0};
      } else if (activation == library_ops::blas::kEpilogueGelu) {
        out = static_cast<Acc>(gelu_tanh(static_cast<float>(out)));
      }
      store_element(d, p.d.type, i + j * p.d.ld, static_cast<double>(out));
    }
  }
}

Status run_lt_matmul(const LtMatmul& mm) {
  const LtProblem& p = mm.problem;
  const double alpha =
      lt_scalar(p.pointer_mode == 1 ? reinterpret_cast<const void*>(mm.alpha_ptr) : mm.alpha.bytes,
                p.scale_type);
  const double beta =
      lt_scalar(p.pointer_mode == 1 ? reinterpret_cast<const void*>(mm.beta_ptr) : mm.beta.bytes,
                p.scale_type);
  const auto size = [](int32_t type) {
    return static_cast<int64_t>(*library_ops::blas::element_bytes(type, ""));
  };
  const bool has_bias = (p.epilogue & library_ops::blas::kEpilogueBias) != 0;
  for (int32_t i = 0; i < p.d.batch_count; ++i) {
    const auto* a =
        reinterpret_cast<const std::byte*>(mm.a) + i * p.a.batch_offset * size(p.a.type);
    const auto* b =
        reinterpret_cast<const std::byte*>(mm.b) + i * p.b.batch_offset * size(p.b.type);
    const auto* c =
        reinterpret_cast<const std::byte*>(mm.c) + i * p.c.batch_offset * size(p.c.type);
    auto* d = reinterpret_cast<std::byte*>(mm.d) + i * p.d.batch_offset * size(p.d.type);
    const std::byte* bias = has_bias ? reinterpret_cast<const std::byte*>(mm.bias) +
                                           i * mm.bias_batch_stride * size(p.bias_type)
                                     : nullptr;
    if (p.d.type == kHostF64) {
      lt_one<double>(mm, a, b, c, d, bias, alpha, beta);
    } else {
      lt_one<float>(mm, a, b, c, d, bias, alpha, beta);
    }
  }
  return Status();
}

// The one algorithm of the simulated GPU.
constexpr int32_t kSimLtAlgoId = 1;

class SimBlas final : public LibraryBackend {
 public:
  explicit SimBlas(SimDevice& device) : device_(device) {}

  Status run(Stream stream, const LibraryCall& call) override {
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    return library_ops::dispatch<Status, library_ops::Library::kBlas, library_ops::Kind::kCall>(
        call.op, call.args, "the simulated GPU",
        library_ops::Handlers{
            [&](OpTag<LibraryOp::kBlasGemm>, const Gemm& g) { return gemm(stream, g); },
            [&](OpTag<LibraryOp::kLtMatmul>, const LtMatmul& mm) {
              return lt_matmul(stream, mm);
            }});
  }

  Result<std::vector<std::byte>> answer(Context, const LibraryCall& call) override {
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    return library_ops::dispatch<Result<std::vector<std::byte>>, library_ops::Library::kBlas,
                                 library_ops::Kind::kQuery>(
        call.op, call.args, "the simulated GPU",
        library_ops::Handlers{
            [](OpTag<LibraryOp::kLtHeuristic>, const LtHeuristic& h) { return lt_heuristic(h); }});
  }

  // The host implementations keep nothing per handle.
  void release(uint64_t, std::optional<library_ops::LibraryHandle>) override {}
  void forget_context(Context) override {}

 private:
  // One algorithm for every problem the host runs; none (kNotSupported) for the rest, as
  // cuBLASLt answers for a problem no algorithm of it runs. The preference's alignments and
  // reduction schemes allow it whatever they are: the host reads any address and reduces in
  // one pass in the compute type (no split-K, so CUBLASLT_REDUCTION_SCHEME_NONE holds).
  static Result<std::vector<std::byte>> lt_heuristic(const LtHeuristic& h) {
    HIBER_RETURN_IF_ERROR(library_ops::blas::check_lt_problem(h.problem).status());
    HIBER_RETURN_IF_ERROR(lt_supported(h.problem));
    library_ops::blas::LtHeuristicResult result;
    result.algo.id = kSimLtAlgoId;
    result.algo.magic = library_ops::blas::kLtAlgoMagic;
    result.algo.problem = library_ops::blas::lt_problem_hash(h.problem);
    result.workspace_bytes = 0;  // the host needs none
    result.waves_bits = std::bit_cast<uint32_t>(1.0f);
    const auto bytes = library_ops::op_bytes(result);
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  }

  Status lt_matmul(Stream stream, const LtMatmul& mm) {
    HIBER_ASSIGN_OR_RETURN(library_ops::blas::LtDims dims,
                           library_ops::blas::check_lt_problem(mm.problem));
    HIBER_RETURN_IF_ERROR(lt_supported(mm.problem));
    if (mm.has_algo && mm.algo.id != kSimLtAlgoId)
      return error(ErrorCode::kNotSupported, "cuBLASLt matmul: algo ", mm.algo.id,
                   " is not one of the simulated GPU's");
    if (dims.m == 0 || dims.n == 0) return Status();
    const LtProblem& p = mm.problem;
    const auto extent = [](const library_ops::blas::LtLayout& l) {
      return *library_ops::blas::batched_extent(
          {l.rows, l.cols, l.ld, *library_ops::blas::element_bytes(l.type, ""), ""}, l.batch_count,
          l.batch_offset);
    };
    std::vector<SimDevice::Operand> operands = {{mm.a, dims.k > 0 ? extent(p.a) : 0},
                                                {mm.b, dims.k > 0 ? extent(p.b) : 0},
                                                {mm.c, extent(p.c)},
                                                {mm.d, extent(p.d)}};
    if (p.epilogue & library_ops::blas::kEpilogueBias) {
      // One bias per row of D, per batch bias_batch_stride elements apart.
      HIBER_ASSIGN_OR_RETURN(uint64_t bias_bytes,
                             library_ops::blas::batched_extent(
                                 {dims.m, 1, std::max<int64_t>(1, dims.m),
                                  *library_ops::blas::element_bytes(p.bias_type, ""), "bias"},
                                 dims.batch_count, mm.bias_batch_stride));
      operands.push_back({mm.bias, bias_bytes});
    }
    return device_.enqueue_host_work(stream, operands, "cuBLASLt matmul",
                                     [mm] { return run_lt_matmul(mm); });
  }

  Status gemm(Stream stream, const Gemm& g) {
    if (g.a_type != g.b_type || !is_host_type(g.a_type) || !is_host_type(g.c_type) ||
        !supported(g.compute_type, g.a_type, g.c_type))
      return error(ErrorCode::kNotSupported, "cuBLAS gemm with A type ", g.a_type, ", B type ",
                   g.b_type, ", C type ", g.c_type, " and compute type ", g.compute_type,
                   ": the simulated GPU runs fp32, fp64, fp16 and bf16 GEMMs (fp16/bf16 with fp32 "
                   "accumulation)");
    if (g.m == 0 || g.n == 0 || (g.batch != BatchKind::kSingle && g.batch_count == 0))
      return Status();
    std::vector<SimDevice::Operand> operands;
    const auto elements = [](int32_t type) { return *library_ops::blas::element_bytes(type, ""); };
    if (g.batch == BatchKind::kPointerArray) {
      const uint64_t array = uint64_t{8} * static_cast<uint64_t>(g.batch_count);
      operands = {{g.a, array}, {g.b, array}, {g.c, array}};
    } else {
      const int64_t batches = g.batch == BatchKind::kStrided ? g.batch_count : 1;
      const bool ta = g.transa != 0;
      const bool tb = g.transb != 0;
      HIBER_ASSIGN_OR_RETURN(uint64_t a_bytes,
                             library_ops::blas::batched_extent(
                                 {ta ? g.k : g.m, ta ? g.m : g.k, g.lda, elements(g.a_type), "A"},
                                 batches, g.stride_a));
      HIBER_ASSIGN_OR_RETURN(uint64_t b_bytes,
                             library_ops::blas::batched_extent(
                                 {tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, elements(g.b_type), "B"},
                                 batches, g.stride_b));
      HIBER_ASSIGN_OR_RETURN(uint64_t c_bytes,
                             library_ops::blas::batched_extent(
                                 {g.m, g.n, g.ldc, elements(g.c_type), "C"}, batches, g.stride_c));
      operands = {{g.a, g.k > 0 ? a_bytes : 0}, {g.b, g.k > 0 ? b_bytes : 0}, {g.c, c_bytes}};
    }
    return device_.enqueue_host_work(stream, operands, "cuBLAS gemm", [g] { return run_gemm(g); });
  }

  SimDevice& device_;
};

}  // namespace

std::unique_ptr<LibraryBackend> make_blas_backend(SimDevice& device) {
  return std::make_unique<SimBlas>(device);
}

}  // namespace hiber::device::sim
