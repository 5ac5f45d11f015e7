// cuBLASLt on the CUDA backend (server/device/cuda_blaslt.cc) against a fake libcuda.so.1
// (fake_cuda.h) and a fake libcublasLt.so.13 (fake_cublaslt.h), on any machine:
//   - the real descriptors built from an LtProblem carry its attributes (types, transposes,
//     epilogue, bias type, layouts with ld, batch count and strided offset), and the preference
//     its workspace limit; the per-call bias pointer and bias batch stride are set at each matmul;
//   - the heuristic's answer has the sim's format (library_ops::blas::LtHeuristicResult), and the
//   algo a
//     matmul passes back through its key is byte for byte the one the real heuristic returned;
//   - an algo from an earlier hiberd is re-chosen (same index of a fresh heuristic), or refused
//     clearly when there is no such index; a forged one is refused;
//   - the matmul runs on the mapped CUstream, with host scalars by value, device ones by address;
//   - handles per (owner, client handle, GPU), made and destroyed in their GPU's context, and
//     release destroying them with every descriptor;
//   - a missing libcublasLt.so.13 refuses the handle (check_available), naming the file.
// Whether the real cuBLASLt computes what it is asked is for the gpu tests.
#include <cublasLt.h>
#include <dlfcn.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/cuda_abi.h"
#include "library_ops/blas_ops.h"
#include "server/device/cuda_device.h"
#include "server/device/library.h"
#include "tests/gpu/fake_cublaslt.h"
#include "tests/gpu/fake_cuda.h"
#include "tests/gpu/fake_libraries.h"

namespace hiber::device {
namespace {

using library_ops::blas::LtHeuristic;
using library_ops::blas::LtHeuristicResult;
using library_ops::blas::LtMatmul;
using library_ops::blas::LtProblem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The fake cuBLASLt the backend opened from the folder it was given (nullptr before it did).
FakeCublasLt* fake_lt() {
  return loaded_fake<FakeCublasLt>(
      std::string(HIBER_FAKE_LIBCUBLAS_DIR) + "/" + cuda_abi::kCublasLtSoname, "fake_cublaslt");
}

// D (4 x 5) = GELU(alpha * A^T B + beta * C + bias), 3 strided batches, A stored 6 x 4 with
// ld 8, D with ld 7 > m (as a slice of a wider matrix), fp32 in, compute and scale.
LtProblem problem() {
  LtProblem p;
  p.a = {6, 4, 8, 40, CUDA_R_32F, 3, CUBLASLT_ORDER_COL, 0};
  p.b = {6, 5, 6, 30, CUDA_R_32F, 3, CUBLASLT_ORDER_COL, 0};
  p.c = {4, 5, 4, 20, CUDA_R_32F, 3, CUBLASLT_ORDER_COL, 0};
  p.d = {4, 5, 7, 35, CUDA_R_32F, 3, CUBLASLT_ORDER_COL, 0};
  p.compute_type = CUBLAS_COMPUTE_32F_FAST_TF32;
  p.scale_type = CUDA_R_32F;
  p.epilogue = library_ops::blas::kEpilogueGeluBias;
  p.bias_type = CUDA_R_16F;
  p.transa = CUBLAS_OP_T;
  p.transb = CUBLAS_OP_N;
  return p;
}

LtMatmul matmul(const LtProblem& p) {
  LtMatmul mm;
  mm.problem = p;
  mm.a = 0x10000;
  mm.b = 0x20000;
  mm.c = 0x30000;
  mm.d = 0x40000;
  mm.bias = 0x50000;
  mm.bias_batch_stride = 4;
  mm.workspace = 0x60000;
  mm.workspace_bytes = 1 << 20;
  const float alpha = 2.5f, beta = 0.5f;
  std::memcpy(mm.alpha.bytes, &alpha, sizeof alpha);
  std::memcpy(mm.beta.bytes, &beta, sizeof beta);
  return mm;
}

template <typename T>
T scalar(const std::byte* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

CUstream cu(Stream s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s.id)); }

bool same_bytes(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

class CudaBlasLtFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(load_fake_driver());
    driver_ = fake_driver();
    ASSERT_NE(driver_, nullptr);
    ASSERT_NO_FATAL_FAILURE(start());
    lt_ = fake_lt();
    ASSERT_NE(lt_, nullptr) << "the backend did not open the fake libcublasLt.so.13";
    {
      std::lock_guard lock(lt_->mutex);
      lt_->created.clear();
      lt_->destroyed.clear();
      lt_->heuristics.clear();
      lt_->matmuls.clear();
      lt_->wrong_context_calls.clear();
      lt_->descs_created = 0;
      lt_->algos_offered = 3;
    }
    std::lock_guard lock(driver_->mutex);
    driver_->wrong_context_calls.clear();
  }

  // A device (a hiberd) with its kBlas backend opened and a stream on each of the two GPUs.
  void start() {
    Result<std::unique_ptr<Device>> created =
        create_cuda_device(options_with_folder(HIBER_FAKE_LIBCUBLAS_DIR));
    ASSERT_TRUE(created.ok()) << created.status();
    device_ = std::move(created).value();
    blas_ = device_->library(library_ops::Library::kBlas);
    ASSERT_NE(blas_, nullptr);
    Status available = blas_->check_available();
    ASSERT_TRUE(available.ok()) << available;
    for (int gpu : {0, 1}) {
      Result<Stream> s = device_->create_stream(gpu, 0);
      ASSERT_TRUE(s.ok()) << s.status();
      streams_[gpu] = *s;
    }
  }

  // Destroys the device (what a hiberd exit does): every handle and descriptor goes.
  void stop() {
    for (Stream s : streams_) EXPECT_TRUE(device_->destroy_stream(s).ok());
    device_.reset();
    blas_ = nullptr;
  }

  void TearDown() override {
    if (device_ != nullptr) stop();
    std::lock_guard lock(lt_->mutex);
    EXPECT_THAT(lt_->wrong_context_calls, ElementsAre())
        << "cuBLASLt calls made without the handle's GPU's context current";
    EXPECT_EQ(lt_->created.size(), lt_->destroyed.size()) << "handles leaked";
    EXPECT_EQ(lt_->descs_live, 0) << "matmul descriptors leaked";
    EXPECT_EQ(lt_->layouts_live, 0) << "layouts leaked";
    EXPECT_EQ(lt_->preferences_live, 0) << "preferences leaked";
    std::lock_guard driver_lock(driver_->mutex);
    EXPECT_THAT(driver_->wrong_context_calls, ElementsAre());
  }

  Result<std::vector<LtHeuristicResult>> heuristic(int gpu, uint64_t owner, uint64_t handle,
                                                   const LtHeuristic& h) {
    const LibraryCall call{owner, library_ops::LibraryHandle(handle),
                           library_ops::LibraryOp::kLtHeuristic, library_ops::op_bytes(h)};
    HIBER_ASSIGN_OR_RETURN(std::vector<std::byte> bytes,
                           blas_->answer(device_->shared_context(gpu), call));
    EXPECT_EQ(bytes.size() % sizeof(LtHeuristicResult), 0u);
    std::vector<LtHeuristicResult> results(bytes.size() / sizeof(LtHeuristicResult));
    if (!results.empty()) std::memcpy(results.data(), bytes.data(), bytes.size());
    return results;
  }

  Status run(Stream s, uint64_t owner, uint64_t handle, const LtMatmul& mm) {
    const LibraryCall call{owner, library_ops::LibraryHandle(handle),
                           library_ops::LibraryOp::kLtMatmul, library_ops::op_bytes(mm)};
    return blas_->run(s, call);
  }

  std::vector<FakeLtHeuristic> heuristics() {
    std::lock_guard lock(lt_->mutex);
    return lt_->heuristics;
  }
  std::vector<FakeLtMatmul> matmuls() {
    std::lock_guard lock(lt_->mutex);
    return lt_->matmuls;
  }
  std::vector<FakeLtHandleEvent> created() {
    std::lock_guard lock(lt_->mutex);
    return lt_->created;
  }
  std::vector<FakeLtHandleEvent> destroyed() {
    std::lock_guard lock(lt_->mutex);
    return lt_->destroyed;
  }

  std::unique_ptr<Device> device_;
  FakeCuda* driver_ = nullptr;
  FakeCublasLt* lt_ = nullptr;
  LibraryBackend* blas_ = nullptr;
  Stream streams_[2];
};

void expect_layout(const FakeLtLayout& got, const library_ops::blas::LtLayout& want,
                   const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.type, want.type);
  EXPECT_EQ(got.rows, static_cast<uint64_t>(want.rows));
  EXPECT_EQ(got.cols, static_cast<uint64_t>(want.cols));
  EXPECT_EQ(got.ld, want.ld);
  EXPECT_EQ(got.order, CUBLASLT_ORDER_COL);
  EXPECT_EQ(got.batch_count, want.batch_count);
  EXPECT_EQ(got.batch_offset, want.batch_offset);
}

TEST_F(CudaBlasLtFakeTest, TheHeuristicSeesTheProblemAndAnswersInTheWireFormat) {
  LtHeuristic h;
  h.problem = problem();
  h.max_workspace_bytes = 4 << 20;
  // PyTorch's alignments for operands that are not 256-byte aligned (views, slices).
  h.min_alignment[0] = 16;
  h.min_alignment[1] = 8;
  h.min_alignment[3] = 4;
  // PyTorch's mask for fp16 with reduced-precision reductions disallowed.
  h.reduction_scheme_mask = 2 | 0;  // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | _NONE
  h.requested = 4;                  // the fake offers 3
  auto results = heuristic(1, 1, 7, h);
  ASSERT_TRUE(results.ok()) << results.status();

  const auto queries = heuristics();
  ASSERT_EQ(queries.size(), 1u);
  const FakeLtHeuristic& q = queries[0];
  EXPECT_EQ(q.gpu, 1) << "asked with the GPU's context current";
  EXPECT_EQ(q.desc.compute_type, CUBLAS_COMPUTE_32F_FAST_TF32);
  EXPECT_EQ(q.desc.scale_type, CUDA_R_32F);
  EXPECT_EQ(q.desc.transa, CUBLAS_OP_T);
  EXPECT_EQ(q.desc.transb, CUBLAS_OP_N);
  EXPECT_FALSE(q.desc.transc_set);
  EXPECT_EQ(q.desc.epilogue, CUBLASLT_EPILOGUE_GELU_BIAS);
  EXPECT_EQ(q.desc.bias_type, CUDA_R_16F);
  EXPECT_EQ(q.desc.pointer_mode, CUBLASLT_POINTER_MODE_HOST);
  expect_layout(q.a, h.problem.a, "A");
  expect_layout(q.b, h.problem.b, "B");
  expect_layout(q.c, h.problem.c, "C");
  expect_layout(q.d, h.problem.d, "D");
  EXPECT_EQ(q.max_workspace, uint64_t{4} << 20);
  EXPECT_EQ(q.min_alignment[0], 16u) << "the caller's alignments reach the real heuristic";
  EXPECT_EQ(q.min_alignment[1], 8u);
  EXPECT_EQ(q.min_alignment[2], 256u);
  EXPECT_EQ(q.min_alignment[3], 4u);
  EXPECT_EQ(q.reduction_mask, 2u) << "the caller's reduction schemes reach the real heuristic";
  EXPECT_EQ(q.requested, 4);

  // What the sim answers: one LtHeuristicResult per algorithm, the id readable by the client.
  ASSERT_EQ(results->size(), 3u);
  for (size_t i = 0; i < results->size(); ++i) {
    const LtHeuristicResult& r = (*results)[i];
    EXPECT_EQ(r.algo.id, 100 + static_cast<int>(i)) << "CUBLASLT_ALGO_CONFIG_ID of the real algo";
    EXPECT_EQ(r.algo.magic, library_ops::blas::kLtAlgoMagic);
    EXPECT_EQ(r.algo.problem, library_ops::blas::lt_problem_hash(h.problem));
    EXPECT_EQ(r.workspace_bytes, i * 1024);
    EXPECT_EQ(std::bit_cast<float>(r.waves_bits), 0.5f + static_cast<float>(i));
  }

  // No algorithm for the problem: the library's NOT_SUPPORTED, as the sim refuses.
  {
    std::lock_guard lock(lt_->mutex);
    lt_->algos_offered = 0;
  }
  h.problem.d.ld = 4;  // another problem
  auto none = heuristic(1, 1, 7, h);
  EXPECT_EQ(none.status().code(), ErrorCode::kNotSupported);
  EXPECT_THAT(none.status().message(), HasSubstr("Fake GPU"));
}

TEST_F(CudaBlasLtFakeTest, TheMatmulRunsTheAlgoTheHeuristicReturned) {
  LtHeuristic h;
  h.problem = problem();
  h.max_workspace_bytes = 1 << 20;
  h.requested = 3;
  auto results = heuristic(0, 1, 7, h);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);

  LtMatmul mm = matmul(h.problem);
  mm.algo = (*results)[1].algo;  // the client's copy of result 1
  mm.has_algo = 1;
  ASSERT_TRUE(run(streams_[0], 1, 7, mm).ok());
  LtMatmul no_algo = matmul(h.problem);  // algo = NULL: the library chooses
  no_algo.bias = 0x58000;
  no_algo.bias_batch_stride = 0;
  ASSERT_TRUE(run(streams_[0], 1, 7, no_algo).ok());

  const auto queries = heuristics();
  ASSERT_EQ(queries.size(), 1u) << "the kept algorithm needs no second heuristic";
  const auto calls = matmuls();
  ASSERT_EQ(calls.size(), 2u);
  const FakeLtMatmul& m = calls[0];
  ASSERT_TRUE(m.has_algo);
  EXPECT_TRUE(same_bytes(m.algo, queries[0].returned[1])) << "all 64 bytes of the real algo";
  EXPECT_EQ(m.handle, queries[0].handle) << "the same real handle";
  EXPECT_EQ(m.gpu, 0);
  EXPECT_EQ(m.stream, cu(streams_[0])) << "the mapped CUstream";
  EXPECT_EQ(m.desc.epilogue, CUBLASLT_EPILOGUE_GELU_BIAS);
  EXPECT_EQ(m.desc.bias, 0x50000u);
  EXPECT_EQ(m.desc.bias_batch_stride, 4);
  EXPECT_EQ(m.desc.bias_type, CUDA_R_16F);
  EXPECT_EQ(m.desc.transa, CUBLAS_OP_T);
  expect_layout(m.a, h.problem.a, "A");
  expect_layout(m.d, h.problem.d, "D");
  EXPECT_EQ(m.pa, 0x10000u);
  EXPECT_EQ(m.pb, 0x20000u);
  EXPECT_EQ(m.pc, 0x30000u);
  EXPECT_EQ(m.pd, 0x40000u);
  EXPECT_EQ(m.workspace, 0x60000u);
  EXPECT_EQ(m.workspace_bytes, size_t{1} << 20);

  EXPECT_FALSE(calls[1].has_algo);
  EXPECT_EQ(calls[1].desc.bias, 0x58000u) << "the bias pointer is set per call";
  EXPECT_EQ(calls[1].desc.bias_batch_stride, 0);
  std::lock_guard lock(lt_->mutex);
  EXPECT_EQ(lt_->descs_created, 1) << "one problem, one set of descriptors, kept";
  EXPECT_EQ(lt_->created.size(), 1u);
}

TEST_F(CudaBlasLtFakeTest, HostScalarsByValueDeviceScalarsByAddress) {
  LtProblem p = problem();
  p.epilogue = library_ops::blas::kEpilogueDefault;
  ASSERT_TRUE(run(streams_[0], 1, 7, matmul(p)).ok());

  LtProblem dev = p;
  dev.pointer_mode = CUBLASLT_POINTER_MODE_DEVICE;
  LtMatmul dmm = matmul(dev);
  dmm.alpha_ptr = 0xA000;
  dmm.beta_ptr = 0xB000;
  ASSERT_TRUE(run(streams_[0], 1, 7, dmm).ok());

  LtProblem f64 = p;
  for (library_ops::blas::LtLayout* l : {&f64.a, &f64.b, &f64.c, &f64.d}) l->type = CUDA_R_64F;
  f64.compute_type = CUBLAS_COMPUTE_64F;
  f64.scale_type = CUDA_R_64F;
  LtMatmul d64 = matmul(f64);
  const double alpha = -1.25, beta = 3.0;
  std::memcpy(d64.alpha.bytes, &alpha, sizeof alpha);
  std::memcpy(d64.beta.bytes, &beta, sizeof beta);
  ASSERT_TRUE(run(streams_[0], 1, 7, d64).ok());

  const auto calls = matmuls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].desc.pointer_mode, CUBLASLT_POINTER_MODE_HOST);
  EXPECT_EQ(scalar<float>(calls[0].alpha), 2.5f);
  EXPECT_EQ(scalar<float>(calls[0].beta), 0.5f);
  EXPECT_EQ(calls[0].desc.epilogue, CUBLASLT_EPILOGUE_DEFAULT);
  EXPECT_EQ(calls[0].desc.bias, 0u) << "no bias epilogue, no bias pointer";
  EXPECT_EQ(calls[1].desc.pointer_mode, CUBLASLT_POINTER_MODE_DEVICE);
  EXPECT_EQ(calls[1].alpha_ptr, 0xA000u);
  EXPECT_EQ(calls[1].beta_ptr, 0xB000u);
  EXPECT_EQ(calls[2].desc.pointer_mode, CUBLASLT_POINTER_MODE_HOST);
  EXPECT_EQ(calls[2].desc.compute_type, CUBLAS_COMPUTE_64F);
  EXPECT_EQ(calls[2].desc.scale_type, CUDA_R_64F);
  EXPECT_EQ(calls[2].a.type, CUDA_R_64F);
  EXPECT_EQ(scalar<double>(calls[2].alpha), -1.25);
  EXPECT_EQ(scalar<double>(calls[2].beta), 3.0);
}

TEST_F(CudaBlasLtFakeTest, AnAlgoFromAnEarlierHiberdIsReChosenByIndex) {
  LtHeuristic h;
  h.problem = problem();
  h.max_workspace_bytes = 2 << 20;
  h.requested = 3;
  auto results = heuristic(0, 1, 7, h);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);

  // hiberd restarts; the client still holds (and caches) the algo of result 2.
  stop();
  ASSERT_NO_FATAL_FAILURE(start());
  LtMatmul mm = matmul(h.problem);
  mm.algo = (*results)[2].algo;
  mm.has_algo = 1;
  ASSERT_TRUE(run(streams_[1], 1, 7, mm).ok());
  ASSERT_TRUE(run(streams_[1], 1, 7, mm).ok());

  auto queries = heuristics();
  ASSERT_EQ(queries.size(), 2u) << "one re-run, then the re-chosen algo is kept";
  EXPECT_EQ(queries[1].gpu, 1);
  EXPECT_EQ(queries[1].max_workspace, uint64_t{2} << 20) << "the same preference";
  EXPECT_EQ(queries[1].requested, 3);
  auto calls = matmuls();
  ASSERT_EQ(calls.size(), 2u);
  for (const FakeLtMatmul& m : calls) {
    ASSERT_TRUE(m.has_algo);
    EXPECT_TRUE(same_bytes(m.algo, queries[1].returned[2])) << "result 2 of the fresh heuristic";
    EXPECT_FALSE(same_bytes(m.algo, queries[0].returned[2]));
  }

  // Restarted again, on a library that now offers fewer algorithms: refused, naming why.
  stop();
  ASSERT_NO_FATAL_FAILURE(start());
  {
    std::lock_guard lock(lt_->mutex);
    lt_->algos_offered = 2;
  }
  Status s = run(streams_[0], 1, 7, mm);
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_THAT(s.message(), HasSubstr("heuristic result 2"));
  EXPECT_THAT(s.message(), HasSubstr("offers only 2"));
  EXPECT_EQ(matmuls().size(), 2u) << "nothing ran";
}

TEST_F(CudaBlasLtFakeTest, AnAlgoNotMadeByThisBackendIsRefused) {
  LtMatmul mm = matmul(problem());
  mm.has_algo = 1;
  mm.algo.id = 1;  // a simulated GPU's (no key in backend[])
  mm.algo.magic = library_ops::blas::kLtAlgoMagic;
  Status s = run(streams_[0], 1, 7, mm);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidValue);
  EXPECT_THAT(s.message(), HasSubstr("not returned by this GPU server"));

  LtHeuristic h;
  h.problem = problem();
  auto results = heuristic(0, 1, 7, h);
  ASSERT_TRUE(results.ok()) << results.status();
  mm.algo = (*results)[0].algo;
  mm.algo.backend[3] = 1000;  // results requested: out of range
  EXPECT_EQ(run(streams_[0], 1, 7, mm).code(), ErrorCode::kInvalidValue);
  EXPECT_TRUE(matmuls().empty());
}

TEST_F(CudaBlasLtFakeTest, HandlesPerOwnerClientHandleAndGpuReleasedOnTheirGpus) {
  const LtMatmul mm = matmul(problem());
  ASSERT_TRUE(run(streams_[0], 1, 7, mm).ok());
  ASSERT_TRUE(run(streams_[0], 1, 7, mm).ok());  // the same handle again
  ASSERT_TRUE(run(streams_[1], 1, 7, mm).ok());  // moved to GPU 1: a fresh handle there
  ASSERT_TRUE(run(streams_[0], 1, 8, mm).ok());
  ASSERT_TRUE(run(streams_[1], 2, 7, mm).ok());  // another session's handle 7
  LtHeuristic h;
  h.problem = problem();
  ASSERT_TRUE(heuristic(0, 1, 7, h).ok());
  const auto made = created();
  ASSERT_EQ(made.size(), 4u);
  EXPECT_EQ(made[0].gpu, 0);
  EXPECT_EQ(made[1].gpu, 1);
  const auto calls = matmuls();
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[0].handle, calls[1].handle);
  EXPECT_EQ(calls[2].handle, made[1].handle);
  EXPECT_EQ(heuristics()[0].handle, made[0].handle) << "the query uses the session's handle";

  blas_->release(1, library_ops::LibraryHandle(7));  // cublasDestroy of client handle 7
  auto gone = destroyed();
  ASSERT_EQ(gone.size(), 2u);
  for (const FakeLtHandleEvent& d : gone) {
    EXPECT_TRUE(d.handle == made[0].handle || d.handle == made[1].handle);
    EXPECT_EQ(d.gpu, d.handle == made[0].handle ? 0 : 1) << "destroyed in its GPU's context";
  }
  blas_->release(1, std::nullopt);  // the session ends
  EXPECT_EQ(destroyed().size(), 3u);
  blas_->release(2, std::nullopt);
  EXPECT_EQ(destroyed().size(), 4u);
  std::lock_guard lock(lt_->mutex);
  EXPECT_EQ(lt_->descs_live, 0) << "release destroys the descriptors with their handle";
  EXPECT_EQ(lt_->layouts_live, 0);
  EXPECT_EQ(lt_->preferences_live, 0);
}

TEST_F(CudaBlasLtFakeTest, AShortArgumentStructIsRefused) {
  const std::byte short_args[8] = {};
  const LibraryCall call{1, library_ops::LibraryHandle(7), library_ops::LibraryOp::kLtMatmul,
                         short_args};
  EXPECT_EQ(blas_->run(streams_[0], call).code(), ErrorCode::kInvalidValue);
  const LibraryCall query{1, library_ops::LibraryHandle(7), library_ops::LibraryOp::kLtHeuristic,
                          short_args};
  EXPECT_EQ(blas_->answer(device_->shared_context(0), query).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_TRUE(created().empty()) << "nothing made for a refused call";
}

TEST(CudaBlasLtMissing, AHandleWithoutLibcublasLtFailsNamingIt) {
  ASSERT_NO_FATAL_FAILURE(load_fake_driver());
  // libcublas.so.13 is there (a link to the fake), libcublasLt.so.13 is not.
  Result<std::unique_ptr<Device>> created =
      create_cuda_device(options_with_folder(HIBER_FAKE_NO_LT_DIR));
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Device> device = std::move(created).value();
  LibraryBackend* blas = device->library(library_ops::Library::kBlas);
  ASSERT_NE(blas, nullptr);
  Status s = blas->check_available();
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_THAT(s.message(), HasSubstr(cuda_abi::kCublasLtSoname));
  EXPECT_THAT(s.message(), HasSubstr(std::string(HIBER_FAKE_NO_LT_DIR) + "/" +
                                     cuda_abi::kCublasLtSoname + " (no such file)"));
  EXPECT_THAT(s.message(), HasSubstr("--cuda_library_path"));

  Result<Stream> stream = device->create_stream(0, 0);
  ASSERT_TRUE(stream.ok());
  const LtMatmul mm = matmul(problem());
  const LibraryCall call{1, library_ops::LibraryHandle(7), library_ops::LibraryOp::kLtMatmul,
                         library_ops::op_bytes(mm)};
  EXPECT_EQ(blas->run(*stream, call).code(), ErrorCode::kNotSupported);
  blas->release(1, std::nullopt);
  EXPECT_TRUE(device->destroy_stream(*stream).ok());
}

}  // namespace
}  // namespace hiber::device
