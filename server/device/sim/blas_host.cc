#include "server/device/sim/blas_host.h"

#include <vector>

#include "server/device/sim/numeric.h"
#include "server/device/sim_device.h"
#include "wire/blas_ops.h"

namespace hiber::device::sim {
namespace {

using wire::blas::BatchKind;
using wire::blas::Gemm;

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
  const int64_t a_size = static_cast<int64_t>(*wire::blas::element_bytes(g.a_type, "A"));
  const int64_t b_size = static_cast<int64_t>(*wire::blas::element_bytes(g.b_type, "B"));
  const int64_t c_size = static_cast<int64_t>(*wire::blas::element_bytes(g.c_type, "C"));
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

class SimBlas final : public LibraryBackend {
 public:
  explicit SimBlas(SimDevice& device) : device_(device) {}

  Status run(Stream stream, const LibraryCall& call) override {
    switch (call.op) {
      case wire::LibraryOp::kBlasGemm: return gemm(stream, call.args);
      default: break;
    }
    return error(ErrorCode::kNotSupported, "cuBLAS operation ", static_cast<unsigned>(call.op),
                 " has no host implementation on the simulated GPU");
  }

  Result<std::vector<std::byte>> answer(int, const LibraryCall& call) override {
    return error(ErrorCode::kNotSupported, "cuBLAS query ", static_cast<unsigned>(call.op),
                 " has no host implementation on the simulated GPU");
  }

  // The host implementations keep nothing per handle.
  void release(uint64_t, std::optional<wire::LibraryHandle>) override {}

 private:
  Status gemm(Stream stream, std::span<const std::byte> args) {
    HIBER_ASSIGN_OR_RETURN(Gemm g, wire::read_op<Gemm>(args, "cuBLAS gemm"));
    if (g.a_type != g.b_type || !is_host_type(g.a_type) || !is_host_type(g.c_type) ||
        !supported(g.compute_type, g.a_type, g.c_type))
      return error(ErrorCode::kNotSupported, "cuBLAS gemm with A type ", g.a_type, ", B type ",
                   g.b_type, ", C type ", g.c_type, " and compute type ", g.compute_type,
                   ": the simulated GPU runs fp32, fp64, fp16 and bf16 GEMMs (fp16/bf16 with fp32 "
                   "accumulation)");
    if (g.m == 0 || g.n == 0 || (g.batch != BatchKind::kSingle && g.batch_count == 0))
      return Status();
    std::vector<SimDevice::Operand> operands;
    const auto elements = [](int32_t type) { return *wire::blas::element_bytes(type, ""); };
    if (g.batch == BatchKind::kPointerArray) {
      const uint64_t array = uint64_t{8} * static_cast<uint64_t>(g.batch_count);
      operands = {{g.a, array}, {g.b, array}, {g.c, array}};
    } else {
      const int64_t batches = g.batch == BatchKind::kStrided ? g.batch_count : 1;
      const bool ta = g.transa != 0;
      const bool tb = g.transb != 0;
      HIBER_ASSIGN_OR_RETURN(uint64_t a_bytes,
                             wire::blas::batched_extent(
                                 {ta ? g.k : g.m, ta ? g.m : g.k, g.lda, elements(g.a_type), "A"},
                                 batches, g.stride_a));
      HIBER_ASSIGN_OR_RETURN(uint64_t b_bytes,
                             wire::blas::batched_extent(
                                 {tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, elements(g.b_type), "B"},
                                 batches, g.stride_b));
      HIBER_ASSIGN_OR_RETURN(uint64_t c_bytes,
                             wire::blas::batched_extent({g.m, g.n, g.ldc, elements(g.c_type), "C"},
                                                        batches, g.stride_c));
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
