// cuBLAS and cuBLASLt on the simulated GPU and hiberd's checks of them:
//   - the host GEMM (fp32, fp64, fp16, bf16 x transposes x strided batches) and Lt matmul (every
//     epilogue) against a reference written here independently, in double;
//   - server/blas_checks.cc: operand extents from the shapes (incl. bias and D, ld > rows), and
//     bad values refused (negative sizes, ld too small, unknown enums, wrong argument size).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "library_ops/blas_ops.h"
#include "server/device/library.h"
#include "server/device/sim/numeric.h"
#include "server/device/sim_device.h"
#include "server/library_calls.h"
#include "tests/unit/device_contract.h"

namespace hiber::device {
namespace {

using library_ops::blas::BatchKind;
using library_ops::blas::Gemm;
using library_ops::blas::LtHeuristic;
using library_ops::blas::LtLayout;
using library_ops::blas::LtMatmul;

constexpr int32_t kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 14;
constexpr int32_t kCompute32F = 68, kCompute64F = 70;

// A value of `type` as stored, and back: the reference sees exactly what the device stores.
double round_to(int32_t type, double v) {
  switch (type) {
    case kF32: return static_cast<float>(v);
    case kF16: return sim::half_to_float(sim::float_to_half(static_cast<float>(v)));
    case kBF16: return sim::bf16_to_float(sim::float_to_bf16(static_cast<float>(v)));
  }
  return v;
}
size_t type_bytes(int32_t type) { return type == kF64 ? 8 : type == kF32 ? 4 : 2; }

std::vector<std::byte> encode(int32_t type, const std::vector<double>& v) {
  std::vector<std::byte> bytes(v.size() * type_bytes(type));
  for (size_t i = 0; i < v.size(); ++i) sim::store_element(bytes.data(), type, i, v[i]);
  return bytes;
}
std::vector<double> decode(int32_t type, const std::vector<std::byte>& bytes) {
  std::vector<double> v(bytes.size() / type_bytes(type));
  for (size_t i = 0; i < v.size(); ++i) v[i] = sim::load_element(bytes.data(), type, i);
  return v;
}

// Small values (multiples of 1/8 in [-2, 2]), exact in every type here.
std::vector<double> values(size_t n, int seed) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 7 + seed * 13) % 33) / 8.0 - 2.0;
  return v;
}

class SimBlasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HIBER_ASSERT_OK_AND_ASSIGN(device_, SimDevice::create(SimDeviceOptions{}));
    HIBER_ASSERT_OK_AND_ASSIGN(stream_, device_->create_stream(0, 0));
    const uint64_t bytes = 8 << 20;
    HIBER_ASSERT_OK_AND_ASSIGN(base_, device_->reserve_address_range(bytes, 0));
    HIBER_ASSERT_OK_AND_ASSIGN(memory_, device_->create_physical(0, bytes));
    HIBER_ASSERT_OK(device_->map(base_, bytes, memory_, 0));
    const int gpus[] = {0};
    HIBER_ASSERT_OK(device_->set_access(base_, bytes, gpus));
    blas_ = device_->library(library_ops::Library::kBlas);
    ASSERT_NE(blas_, nullptr);
  }

  // Device memory holding `bytes`, 256-byte aligned, from a bump allocator.
  DevicePtr upload(const std::vector<std::byte>& bytes) {
    const DevicePtr p = base_ + next_;
    next_ += (bytes.size() + 255) / 256 * 256 + 256;
    EXPECT_TRUE(device_->copy_host_to_device(stream_, p, bytes.data(), bytes.size()).ok());
    EXPECT_TRUE(device_->synchronize_stream(stream_).ok());
    return p;
  }
  std::vector<std::byte> download(DevicePtr p, size_t bytes) {
    std::vector<std::byte> out(bytes);
    EXPECT_TRUE(device_->copy_device_to_host(stream_, out.data(), p, bytes).ok());
    EXPECT_TRUE(device_->synchronize_stream(stream_).ok());
    return out;
  }
  template <typename Args>
  Status run(library_ops::LibraryOp op, const Args& args) {
    LibraryCall call{.owner = 1,
                     .handle = library_ops::LibraryHandle(1),
                     .op = op,
                     .args = library_ops::op_bytes(args)};
    HIBER_RETURN_IF_ERROR(blas_->run(stream_, call));
    return device_->synchronize_stream(stream_);
  }

  std::unique_ptr<SimDevice> device_;
  Stream stream_{};
  DevicePtr base_ = 0;
  PhysicalMemory memory_{};
  uint64_t next_ = 0;
  LibraryBackend* blas_ = nullptr;
};

template <typename T>
void set_scalar(library_ops::blas::Scalar* s, T v) {
  std::memcpy(s->bytes, &v, sizeof(v));
}

// C = alpha op(A) op(B) + beta C, per batch, in double: the reference.
void reference_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
                    const double* b, int ldb, double beta, double* c, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l)
        s += (ta ? a[l + i * lda] : a[i + l * lda]) * (tb ? b[j + l * ldb] : b[l + j * ldb]);
      c[i + j * ldc] = alpha * s + (beta == 0 ? 0 : beta * c[i + j * ldc]);
    }
}

TEST_F(SimBlasTest, GemmEveryTypeTransposeAndStridedBatch) {
  const int m = 13, n = 7, k = 9, batches = 3;
  for (int32_t type : {kF32, kF64, kF16, kBF16}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
        const int64_t sa = int64_t{lda} * (ta ? m : k) + 5, sb = int64_t{ldb} * (tb ? k : n),
                      sc = int64_t{ldc} * n + 1;
        std::vector<double> a = values(sa * batches, 1), b = values(sb * batches, 2),
                            c = values(sc * batches, 3);
        for (auto* v : {&a, &b, &c})
          for (double& x : *v) x = round_to(type, x);
        Gemm g;
        g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
        g.transa = static_cast<uint8_t>(ta), g.transb = static_cast<uint8_t>(tb);
        g.a_type = g.b_type = g.c_type = type;
        g.compute_type = type == kF64 ? kCompute64F : kCompute32F;
        g.batch = BatchKind::kStrided, g.batch_count = batches;
        g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
        const double alpha = 1.5, beta = -0.5;
        if (type == kF64) {
          set_scalar(&g.alpha, alpha), set_scalar(&g.beta, beta);
        } else {
          set_scalar(&g.alpha, float(alpha)), set_scalar(&g.beta, float(beta));
        }
        g.a = upload(encode(type, a)), g.b = upload(encode(type, b));
        g.c = upload(encode(type, c));
        HIBER_ASSERT_OK(run(library_ops::LibraryOp::kBlasGemm, g));
        const std::vector<double> got = decode(type, download(g.c, c.size() * type_bytes(type)));
        std::vector<double> want = c;
        for (int i = 0; i < batches; ++i)
          reference_gemm(ta, tb, m, n, k, alpha, a.data() + i * sa, lda, b.data() + i * sb, ldb,
                         beta, want.data() + i * sc, ldc);
        // The inputs are multiples of 1/8 below 2: every product and sum of 9 is exact in fp32,
        // so fp32 and fp64 agree exactly; fp16/bf16 round once, at the store.
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], round_to(type, want[i]))
              << "type " << type << " ta " << ta << " tb " << tb << " at " << i;
      }
    }
  }
}

TEST_F(SimBlasTest, GemmPointerArrayBatch) {
  const int m = 5, n = 4, k = 3;
  std::vector<double> a = values(m * k, 1), b = values(k * n, 2), c0 = values(m * n, 3);
  const DevicePtr da = upload(encode(kF32, a)), db = upload(encode(kF32, b));
  const DevicePtr c1 = upload(encode(kF32, c0)), c2 = upload(encode(kF32, c0));
  const uint64_t as[] = {da, da}, bs[] = {db, db}, cs[] = {c2, c1};
  const auto bytes_of = [](const uint64_t(&p)[2]) {
    std::vector<std::byte> out(sizeof(p));
    std::memcpy(out.data(), p, sizeof(p));
    return out;
  };
  Gemm g;
  g.m = m, g.n = n, g.k = k, g.lda = m, g.ldb = k, g.ldc = m;
  g.a_type = g.b_type = g.c_type = kF32, g.compute_type = kCompute32F;
  g.batch = BatchKind::kPointerArray, g.batch_count = 2;
  g.a = upload(bytes_of(as)), g.b = upload(bytes_of(bs)), g.c = upload(bytes_of(cs));
  set_scalar(&g.alpha, 1.0f), set_scalar(&g.beta, 1.0f);
  HIBER_ASSERT_OK(run(library_ops::LibraryOp::kBlasGemm, g));
  std::vector<double> want = c0;
  reference_gemm(false, false, m, n, k, 1, a.data(), m, b.data(), k, 1, want.data(), m);
  EXPECT_EQ(decode(kF32, download(c1, want.size() * 4)), want);
  EXPECT_EQ(decode(kF32, download(c2, want.size() * 4)), want);
}

// The GELU cuBLASLt computes: the tanh approximation.
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

LtLayout layout(int32_t type, int64_t rows, int64_t cols, int64_t ld, int32_t batches = 1,
                int64_t offset = 0) {
  LtLayout l;
  l.type = type, l.rows = rows, l.cols = cols, l.ld = ld;
  l.batch_count = batches, l.batch_offset = offset;
  return l;
}

TEST_F(SimBlasTest, LtMatmulEpiloguesWithBiasPerRowAndLdAboveRows) {
  const int m = 6, n = 5, k = 4, ldc = 9;  // ld exceeds the row count
  for (int32_t type : {kF32, kF16, kBF16}) {
    for (int32_t epilogue : {1, 2, 4, 6, 32, 36}) {
      std::vector<double> a = values(k * m, 1), b = values(k * n, 2), c = values(ldc * n, 3),
                          bias = values(m, 4);
      for (auto* v : {&a, &b, &c, &bias})
        for (double& x : *v) x = round_to(type, x);
      LtMatmul mm;
      mm.problem.a = layout(type, k, m, k);  // stored k x m, transposed
      mm.problem.b = layout(type, k, n, k);
      mm.problem.c = layout(type, m, n, ldc);
      mm.problem.d = layout(type, m, n, ldc);
      mm.problem.transa = 1;
      mm.problem.compute_type = kCompute32F, mm.problem.scale_type = kF32;
      mm.problem.epilogue = epilogue, mm.problem.bias_type = type;
      set_scalar(&mm.alpha, 0.5f), set_scalar(&mm.beta, 0.25f);
      mm.a = upload(encode(type, a)), mm.b = upload(encode(type, b));
      mm.c = upload(encode(type, c));
      mm.d = upload(encode(type, std::vector<double>(c.size(), 7.0)));  // rows past m: untouched
      mm.bias = upload(encode(type, bias));
      HIBER_ASSERT_OK(run(library_ops::LibraryOp::kLtMatmul, mm));
      const std::vector<double> got = decode(type, download(mm.d, c.size() * type_bytes(type)));
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < ldc; ++i) {
          if (i >= m) {
            ASSERT_EQ(got[i + j * ldc], 7.0);
            continue;
          }
          double v = 0;
          for (int l = 0; l < k; ++l) v += a[l + i * k] * b[l + j * k];
          v = 0.5 * v + 0.25 * c[i + j * ldc];
          if (epilogue & 4) v += bias[i];
          if ((epilogue & ~4) == 2) v = std::max(v, 0.0);
          if ((epilogue & ~4) == 32) v = gelu_tanh(v);
          // fp32: exact but for GELU's float tanh (a few ulp of values below 8: 1e-5). fp16 and
          // bf16: one rounding of the result (2^-11 and 2^-8 relative), which GELU's float
          // error can move across a rounding boundary: one unit of the last place.
          const double ulp =
              type == kF32 ? 1e-5 : std::ldexp(std::fabs(v) + 1e-3, type == kF16 ? -10 : -7);
          ASSERT_NEAR(got[i + j * ldc], v, ulp)
              << "type " << type << " epilogue " << epilogue << " at " << i << "," << j;
        }
      }
    }
  }
}

TEST_F(SimBlasTest, LtMatmulStridedBatchWithBiasBatchStride) {
  const int m = 3, n = 2, k = 2, batches = 2;
  std::vector<double> a = values(m * k * batches, 1), b = values(k * n * batches, 2),
                      bias = values(m * batches + 1, 4);
  LtMatmul mm;
  mm.problem.a = layout(kF32, m, k, m, batches, m * k);
  mm.problem.b = layout(kF32, k, n, k, batches, k * n);
  mm.problem.c = layout(kF32, m, n, m, batches, m * n);
  mm.problem.d = mm.problem.c;
  mm.problem.compute_type = kCompute32F, mm.problem.scale_type = kF32;
  mm.problem.epilogue = 4, mm.problem.bias_type = kF32;
  set_scalar(&mm.alpha, 1.0f), set_scalar(&mm.beta, 0.0f);
  mm.a = upload(encode(kF32, a)), mm.b = upload(encode(kF32, b));
  // beta = 0: C is not read, so NaNs in it do not show.
  mm.c = upload(encode(kF32, std::vector<double>(m * n * batches, NAN)));
  mm.d = upload(encode(kF32, std::vector<double>(m * n * batches, 0)));
  mm.bias = upload(encode(kF32, bias));
  mm.bias_batch_stride = m + 1;
  HIBER_ASSERT_OK(run(library_ops::LibraryOp::kLtMatmul, mm));
  const std::vector<double> got = decode(kF32, download(mm.d, m * n * batches * 4));
  for (int s = 0; s < batches; ++s)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double v = bias[s * (m + 1) + i];
        for (int l = 0; l < k; ++l) v += a[s * m * k + i + l * m] * b[s * k * n + l + j * k];
        EXPECT_EQ(got[s * m * n + i + j * m], v) << s << " " << i << " " << j;
      }
}

TEST_F(SimBlasTest, LtHeuristicAnswersOneAlgoForWhatItRunsAndNoneOtherwise) {
  LtHeuristic h;
  h.problem.a = layout(kF16, 4, 4, 4);
  h.problem.b = h.problem.c = h.problem.d = h.problem.a;
  h.problem.compute_type = kCompute32F, h.problem.scale_type = kF32;
  LibraryCall call{.owner = 1,
                   .handle = library_ops::LibraryHandle(1),
                   .op = library_ops::LibraryOp::kLtHeuristic,
                   .args = library_ops::op_bytes(h)};
  HIBER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> answer,
                             blas_->answer(device_->shared_context(0), call));
  ASSERT_EQ(answer.size(), sizeof(library_ops::blas::LtHeuristicResult));
  library_ops::blas::LtHeuristicResult result;
  std::memcpy(static_cast<void*>(&result), answer.data(), sizeof(result));
  EXPECT_EQ(result.algo.magic, library_ops::blas::kLtAlgoMagic);
  EXPECT_EQ(result.algo.problem, library_ops::blas::lt_problem_hash(h.problem));
  // int8 data: not a type the host runs.
  h.problem.a.type = h.problem.b.type = 3;
  EXPECT_EQ(blas_->answer(device_->shared_context(0), call).status().code(),
            ErrorCode::kNotSupported);
}

// ---- hiberd's checks ----

Gemm valid_gemm() {
  Gemm g;
  g.m = 8, g.n = 4, g.k = 2, g.lda = 10, g.ldb = 2, g.ldc = 8;
  g.a = 0x1000, g.b = 0x2000, g.c = 0x3000;
  g.a_type = g.b_type = g.c_type = kF32, g.compute_type = kCompute32F;
  return g;
}

TEST(BlasChecks, GemmOperandsSpanTheirShapes) {
  Gemm g = valid_gemm();
  HIBER_ASSERT_OK_AND_ASSIGN(
      server::LibraryAccess access,
      server::check_blas_call(library_ops::LibraryOp::kBlasGemm, library_ops::op_bytes(g)));
  ASSERT_EQ(access.operands.size(), 3u);
  EXPECT_EQ(access.operands[0].bytes, (1 * 10 + 8) * 4u);  // A: 8 x 2, ld 10
  EXPECT_EQ(access.operands[1].bytes, (3 * 2 + 2) * 4u);   // B: 2 x 4
  EXPECT_EQ(access.operands[2].bytes, 8 * 4 * 4u);         // C, written
  EXPECT_TRUE(access.operands[2].write);
  EXPECT_FALSE(access.through_pointers);
  g.batch = BatchKind::kStrided, g.batch_count = 3, g.stride_c = 100;
  HIBER_ASSERT_OK_AND_ASSIGN(
      access, server::check_blas_call(library_ops::LibraryOp::kBlasGemm, library_ops::op_bytes(g)));
  EXPECT_EQ(access.operands[2].bytes, (2 * 100 + 32) * 4u);
  g.batch = BatchKind::kPointerArray;
  HIBER_ASSERT_OK_AND_ASSIGN(
      access, server::check_blas_call(library_ops::LibraryOp::kBlasGemm, library_ops::op_bytes(g)));
  EXPECT_TRUE(access.through_pointers);
  EXPECT_EQ(access.operands.back().bytes, 3 * 8u);  // the C pointer array
}

TEST(BlasChecks, BadGemmsAreRefused) {
  const auto code = [](const Gemm& g) {
    return server::check_blas_call(library_ops::LibraryOp::kBlasGemm, library_ops::op_bytes(g))
        .status()
        .code();
  };
  Gemm g = valid_gemm();
  g.m = -1;
  EXPECT_EQ(code(g), ErrorCode::kInvalidValue);
  g = valid_gemm(), g.lda = 7;  // below m
  EXPECT_EQ(code(g), ErrorCode::kInvalidValue);
  g = valid_gemm(), g.transa = 9;
  EXPECT_EQ(code(g), ErrorCode::kInvalidValue);
  g = valid_gemm(), g.a_type = 99;
  EXPECT_EQ(code(g), ErrorCode::kNotSupported);
  g = valid_gemm(), g.batch = static_cast<BatchKind>(7);
  EXPECT_EQ(code(g), ErrorCode::kInvalidValue);
  const std::vector<std::byte> short_args(sizeof(Gemm) - 1);
  EXPECT_EQ(server::check_blas_call(library_ops::LibraryOp::kBlasGemm, short_args).status().code(),
            ErrorCode::kInvalidValue);
}

LtMatmul valid_lt() {
  LtMatmul mm;
  mm.problem.a = layout(kF16, 16, 8, 16);  // transposed: op(A) 8 x 16
  mm.problem.transa = 1;
  mm.problem.b = layout(kF16, 16, 4, 16);
  mm.problem.c = layout(kF16, 8, 4, 12);
  mm.problem.d = layout(kF16, 8, 4, 12);
  mm.problem.compute_type = kCompute32F, mm.problem.scale_type = kF32;
  mm.problem.epilogue = 36, mm.problem.bias_type = kF16;
  mm.a = 0x1000, mm.b = 0x2000, mm.c = 0x3000, mm.d = 0x4000, mm.bias = 0x5000;
  return mm;
}

TEST(BlasChecks, LtMatmulOperandsIncludeBiasAndD) {
  LtMatmul mm = valid_lt();
  HIBER_ASSERT_OK_AND_ASSIGN(
      server::LibraryAccess access,
      server::check_blas_call(library_ops::LibraryOp::kLtMatmul, library_ops::op_bytes(mm)));
  ASSERT_EQ(access.operands.size(), 5u);
  EXPECT_EQ(access.operands[0].bytes, 16 * 8 * 2u);        // A
  EXPECT_EQ(access.operands[3].bytes, (3 * 12 + 8) * 2u);  // D: 8 x 4, ld 12
  EXPECT_TRUE(access.operands[3].write);
  EXPECT_EQ(access.operands[4].bytes, 8 * 2u);  // bias: one per row of D
}

TEST(BlasChecks, BadLtMatmulsAreRefused) {
  const auto code = [](const LtMatmul& mm) {
    return server::check_blas_call(library_ops::LibraryOp::kLtMatmul, library_ops::op_bytes(mm))
        .status()
        .code();
  };
  LtMatmul mm = valid_lt();
  mm.problem.d.ld = 7;  // below its 8 rows
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  mm = valid_lt(), mm.problem.b.rows = 15;  // k disagrees
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  mm = valid_lt(), mm.problem.c.rows = -8;
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  mm = valid_lt(), mm.problem.epilogue = 128 | 32;  // GELU_AUX
  EXPECT_EQ(code(mm), ErrorCode::kNotSupported);
  mm = valid_lt(), mm.bias = 0;
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  mm = valid_lt(), mm.problem.d.batch_count = 2;
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  mm = valid_lt(), mm.has_algo = 1;  // an algo hiberd never made
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  mm = valid_lt(), mm.problem.transc = 1;
  EXPECT_EQ(code(mm), ErrorCode::kInvalidValue);
  LtHeuristic h;
  h.problem = valid_lt().problem;
  h.requested = 0;
  EXPECT_EQ(server::check_blas_query(library_ops::LibraryOp::kLtHeuristic, library_ops::op_bytes(h))
                .code(),
            ErrorCode::kInvalidValue);
  h.requested = 1;
  HIBER_EXPECT_OK(
      server::check_blas_query(library_ops::LibraryOp::kLtHeuristic, library_ops::op_bytes(h)));
}

}  // namespace
}  // namespace hiber::device
