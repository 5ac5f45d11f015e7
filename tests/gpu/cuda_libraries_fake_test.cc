// The CUDA backend's remoted-library calls (server/device/cuda_libraries.cc) against a fake
// libcuda.so.1 (fake_cuda.h) and a fake libcublas.so.13 (fake_cublas.h), on any machine: real
// handles per owner, client handle and GPU, created with the GPU's context current; the
// stream passed is the CUstream the device::Stream stands for; scalars by value in host pointer
// mode and by address in device pointer mode; every batch kind; settings applied only when they
// change; release destroying the handles; and a missing library refused at handle creation with
// a message naming it. Whether the real cuBLAS computes what it is asked is for the gpu tests
// (shim_programs_gpu_test runs tests/shim/programs/library_* natively and through hiberd).
#include <cublas_api.h>
#include <dlfcn.h>

#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/cuda_abi.h"
#include "library_ops/blas_ops.h"
#include "server/device/cuda_device.h"
#include "server/device/library.h"
#include "tests/gpu/fake_cublas.h"
#include "tests/gpu/fake_cuda.h"
#include "tests/gpu/fake_libraries.h"

namespace hiber::device {
namespace {

using library_ops::blas::BatchKind;
using library_ops::blas::Gemm;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The fake cuBLAS the backend opened from the folder it was given (nullptr before it did).
FakeCublas* fake_blas() {
  return loaded_fake<FakeCublas>(
      std::string(HIBER_FAKE_LIBCUBLAS_DIR) + "/" + cuda_abi::kCublasSoname, "fake_cublas");
}

Gemm sgemm() {
  Gemm g;
  g.a = 0x10000;
  g.b = 0x20000;
  g.c = 0x30000;
  g.m = 4;
  g.n = 5;
  g.k = 6;
  g.lda = 4;
  g.ldb = 6;
  g.ldc = 4;
  g.a_type = g.b_type = g.c_type = CUDA_R_32F;
  g.compute_type = CUBLAS_COMPUTE_32F;
  g.algo = CUBLAS_GEMM_DEFAULT;
  const float alpha = 2.5f, beta = 0.5f;
  std::memcpy(g.alpha.bytes, &alpha, sizeof alpha);
  std::memcpy(g.beta.bytes, &beta, sizeof beta);
  return g;
}

template <typename T>
T scalar(const std::byte* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

CUstream cu(Stream s) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(s.id)); }

class CudaLibrariesFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(load_fake_driver());
    Result<std::unique_ptr<Device>> created =
        create_cuda_device(options_with_folder(HIBER_FAKE_LIBCUBLAS_DIR));
    ASSERT_TRUE(created.ok()) << created.status();
    device_ = std::move(created).value();
    driver_ = fake_driver();
    ASSERT_NE(driver_, nullptr);
    blas_ = device_->library(library_ops::Library::kBlas);
    ASSERT_NE(blas_, nullptr);
    Status available = blas_->check_available();
    ASSERT_TRUE(available.ok()) << available;
    cublas_ = fake_blas();
    ASSERT_NE(cublas_, nullptr) << "the backend did not open the fake libcublas.so.13";
    {
      std::lock_guard lock(cublas_->mutex);
      cublas_->created.clear();
      cublas_->destroyed.clear();
      cublas_->gemms.clear();
      cublas_->set_stream_calls = 0;
      cublas_->wrong_context_calls.clear();
    }
    {
      std::lock_guard lock(driver_->mutex);
      driver_->wrong_context_calls.clear();
    }
    for (int gpu : {0, 1}) {
      Result<Stream> s = device_->create_stream(gpu, 0);
      ASSERT_TRUE(s.ok()) << s.status();
      streams_[gpu] = *s;
    }
  }

  void TearDown() override {
    if (device_ == nullptr) return;
    for (Stream s : streams_) EXPECT_TRUE(device_->destroy_stream(s).ok());
    device_.reset();  // destroys the handles still kept
    {
      std::lock_guard lock(cublas_->mutex);
      EXPECT_THAT(cublas_->wrong_context_calls, ElementsAre())
          << "cuBLAS calls made without the handle's GPU's context current";
      EXPECT_EQ(cublas_->created.size(), cublas_->destroyed.size()) << "handles leaked";
    }
    std::lock_guard lock(driver_->mutex);
    EXPECT_THAT(driver_->wrong_context_calls, ElementsAre());
  }

  Status run(Stream s, uint64_t owner, uint64_t handle, const Gemm& g) {
    const LibraryCall call{owner, library_ops::LibraryHandle(handle),
                           library_ops::LibraryOp::kBlasGemm, library_ops::op_bytes(g)};
    return blas_->run(s, call);
  }

  std::vector<FakeCublasGemm> gemms() {
    std::lock_guard lock(cublas_->mutex);
    return cublas_->gemms;
  }
  std::vector<FakeCublasHandleEvent> created() {
    std::lock_guard lock(cublas_->mutex);
    return cublas_->created;
  }
  std::vector<FakeCublasHandleEvent> destroyed() {
    std::lock_guard lock(cublas_->mutex);
    return cublas_->destroyed;
  }

  std::unique_ptr<Device> device_;
  FakeCuda* driver_ = nullptr;
  FakeCublas* cublas_ = nullptr;
  LibraryBackend* blas_ = nullptr;
  Stream streams_[2];
};

TEST_F(CudaLibrariesFakeTest, OneRealHandlePerOwnerClientHandleAndGpu) {
  const Gemm g = sgemm();
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());  // the same handle again
  ASSERT_EQ(created().size(), 1u);
  EXPECT_EQ(created()[0].gpu, 0);

  // The function moved to GPU 1 (late binding): a fresh handle, made in GPU 1's context.
  ASSERT_TRUE(run(streams_[1], 1, 7, g).ok());
  ASSERT_EQ(created().size(), 2u);
  EXPECT_EQ(created()[1].gpu, 1);
  // Another session's handle with the same number, and another handle of the same session.
  ASSERT_TRUE(run(streams_[0], 2, 7, g).ok());
  ASSERT_TRUE(run(streams_[0], 1, 8, g).ok());
  ASSERT_EQ(created().size(), 4u);

  const auto calls = gemms();
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[0].handle, calls[1].handle);
  EXPECT_EQ(calls[0].handle, created()[0].handle);
  EXPECT_EQ(calls[2].handle, created()[1].handle);
  EXPECT_EQ(calls[3].handle, created()[2].handle);
  EXPECT_EQ(calls[4].handle, created()[3].handle);
  EXPECT_EQ(calls[2].gpu, 1);
}

TEST_F(CudaLibrariesFakeTest, RunsOnTheMappedStreamAndSetsItOnlyWhenItChanges) {
  Result<Stream> other = device_->create_stream(0, 0);
  ASSERT_TRUE(other.ok()) << other.status();
  const Gemm g = sgemm();
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());
  ASSERT_TRUE(run(*other, 1, 7, g).ok());
  ASSERT_TRUE(run(streams_[1], 1, 7, g).ok());
  const auto calls = gemms();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0].stream, cu(streams_[0]));
  EXPECT_EQ(calls[1].stream, cu(streams_[0]));
  EXPECT_EQ(calls[2].stream, cu(*other));
  EXPECT_EQ(calls[3].stream, cu(streams_[1]));
  EXPECT_EQ(calls[3].gpu, 1);
  {
    std::lock_guard lock(cublas_->mutex);
    EXPECT_EQ(cublas_->set_stream_calls, 3) << "a warm call on the same stream sets nothing";
  }
  EXPECT_TRUE(device_->destroy_stream(*other).ok());
}

TEST_F(CudaLibrariesFakeTest, HostScalarsByValueDeviceScalarsByAddress) {
  Gemm host = sgemm();
  ASSERT_TRUE(run(streams_[0], 1, 7, host).ok());

  Gemm dev = sgemm();
  dev.pointer_mode = 1;
  dev.alpha_ptr = 0xA000;
  dev.beta_ptr = 0xB000;
  ASSERT_TRUE(run(streams_[0], 1, 7, dev).ok());

  Gemm dgemm = sgemm();
  dgemm.a_type = dgemm.b_type = dgemm.c_type = CUDA_R_64F;
  dgemm.compute_type = CUBLAS_COMPUTE_64F;
  const double alpha = -1.25, beta = 3.0;
  std::memcpy(dgemm.alpha.bytes, &alpha, sizeof alpha);
  std::memcpy(dgemm.beta.bytes, &beta, sizeof beta);
  ASSERT_TRUE(run(streams_[0], 1, 7, dgemm).ok());

  const auto calls = gemms();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].pointer_mode, CUBLAS_POINTER_MODE_HOST);
  EXPECT_EQ(scalar<float>(calls[0].alpha), 2.5f);
  EXPECT_EQ(scalar<float>(calls[0].beta), 0.5f);
  EXPECT_EQ(calls[1].pointer_mode, CUBLAS_POINTER_MODE_DEVICE);
  EXPECT_EQ(calls[1].alpha_ptr, 0xA000u);
  EXPECT_EQ(calls[1].beta_ptr, 0xB000u);
  EXPECT_EQ(calls[2].pointer_mode, CUBLAS_POINTER_MODE_HOST) << "back to host mode";
  EXPECT_EQ(scalar<double>(calls[2].alpha), -1.25);
  EXPECT_EQ(scalar<double>(calls[2].beta), 3.0);
  EXPECT_EQ(calls[2].compute_type, CUBLAS_COMPUTE_64F);
  EXPECT_EQ(calls[2].a_type, CUDA_R_64F);
}

TEST_F(CudaLibrariesFakeTest, EveryBatchKindReachesItsCall) {
  Gemm single = sgemm();
  single.transa = CUBLAS_OP_T;
  single.lda = 6;
  single.algo = CUBLAS_GEMM_DEFAULT_TENSOR_OP;
  ASSERT_TRUE(run(streams_[0], 1, 7, single).ok());

  Gemm strided = sgemm();
  strided.batch = BatchKind::kStrided;
  strided.batch_count = 3;
  strided.stride_a = 24;
  strided.stride_b = 30;
  strided.stride_c = 20;
  ASSERT_TRUE(run(streams_[0], 1, 7, strided).ok());

  Gemm arrays = sgemm();
  arrays.batch = BatchKind::kPointerArray;
  arrays.batch_count = 5;
  arrays.a = 0x40000;  // device arrays of device pointers
  arrays.b = 0x50000;
  arrays.c = 0x60000;
  arrays.a_type = arrays.b_type = CUDA_R_16F;
  ASSERT_TRUE(run(streams_[0], 1, 7, arrays).ok());

  const auto calls = gemms();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].call, "cublasGemmEx");
  EXPECT_EQ(calls[0].transa, CUBLAS_OP_T);
  EXPECT_EQ(calls[0].transb, CUBLAS_OP_N);
  EXPECT_EQ(calls[0].lda, 6);
  EXPECT_EQ(calls[0].algo, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
  EXPECT_EQ(calls[0].a, 0x10000u);
  EXPECT_EQ(calls[0].c, 0x30000u);
  EXPECT_EQ(calls[0].m, 4);
  EXPECT_EQ(calls[0].n, 5);
  EXPECT_EQ(calls[0].k, 6);

  EXPECT_EQ(calls[1].call, "cublasGemmStridedBatchedEx");
  EXPECT_EQ(calls[1].batch_count, 3);
  EXPECT_EQ(calls[1].stride_a, 24);
  EXPECT_EQ(calls[1].stride_b, 30);
  EXPECT_EQ(calls[1].stride_c, 20);

  EXPECT_EQ(calls[2].call, "cublasGemmBatchedEx");
  EXPECT_EQ(calls[2].batch_count, 5);
  EXPECT_EQ(calls[2].a, 0x40000u);
  EXPECT_EQ(calls[2].b, 0x50000u);
  EXPECT_EQ(calls[2].c, 0x60000u);
  EXPECT_EQ(calls[2].a_type, CUDA_R_16F);
  EXPECT_EQ(calls[2].c_type, CUDA_R_32F);
}

TEST_F(CudaLibrariesFakeTest, AppliesWorkspaceMathAndAtomicsModesFromEachCall) {
  Gemm g = sgemm();
  g.workspace = 0xC0000;
  g.workspace_bytes = 1 << 20;
  g.math_mode = CUBLAS_TF32_TENSOR_OP_MATH;
  g.atomics_mode = CUBLAS_ATOMICS_ALLOWED;
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());
  Gemm own = sgemm();  // no workspace of the client's: cuBLAS's own, default modes
  ASSERT_TRUE(run(streams_[0], 1, 7, own).ok());
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());

  const auto calls = gemms();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].workspace, 0xC0000u);
  EXPECT_EQ(calls[0].workspace_bytes, size_t{1} << 20);
  EXPECT_EQ(calls[0].math_mode, CUBLAS_TF32_TENSOR_OP_MATH);
  EXPECT_EQ(calls[0].atomics_mode, CUBLAS_ATOMICS_ALLOWED);
  EXPECT_EQ(calls[1].workspace_bytes, 0u);
  EXPECT_EQ(calls[1].math_mode, CUBLAS_DEFAULT_MATH);
  EXPECT_EQ(calls[1].atomics_mode, CUBLAS_ATOMICS_NOT_ALLOWED);
  EXPECT_EQ(calls[2].workspace, 0xC0000u);
  EXPECT_EQ(calls[2].workspace_bytes, size_t{1} << 20);
  EXPECT_EQ(calls[2].stream, cu(streams_[0]));
}

TEST_F(CudaLibrariesFakeTest, ReleaseDestroysTheHandlesOnTheirOwnGpus) {
  const Gemm g = sgemm();
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());
  ASSERT_TRUE(run(streams_[1], 1, 7, g).ok());
  ASSERT_TRUE(run(streams_[0], 1, 8, g).ok());
  ASSERT_TRUE(run(streams_[1], 2, 7, g).ok());
  const auto made = created();
  ASSERT_EQ(made.size(), 4u);

  blas_->release(1, library_ops::LibraryHandle(7));  // cublasDestroy of client handle 7
  auto gone = destroyed();
  ASSERT_EQ(gone.size(), 2u);
  for (const FakeCublasHandleEvent& d : gone) {
    EXPECT_TRUE(d.handle == made[0].handle || d.handle == made[1].handle);
    EXPECT_EQ(d.gpu, d.handle == made[0].handle ? 0 : 1) << "destroyed in its GPU's context";
  }

  blas_->release(1, std::nullopt);  // the session ends
  gone = destroyed();
  ASSERT_EQ(gone.size(), 3u);
  EXPECT_EQ(gone[2].handle, made[2].handle);

  // A released handle used again gets a fresh real handle.
  ASSERT_TRUE(run(streams_[0], 1, 7, g).ok());
  EXPECT_EQ(created().size(), 5u);
  // Session 2's handle lives on until its own release (or the device's destruction, TearDown).
  blas_->release(2, std::nullopt);
  EXPECT_EQ(destroyed().size(), 4u);
}

TEST_F(CudaLibrariesFakeTest, RefusesWhatTheThirtyTwoBitApiCannotTake) {
  Gemm g = sgemm();
  g.ldc = int64_t{1} << 32;
  Status s = run(streams_[0], 1, 7, g);
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_THAT(s.message(), HasSubstr("ldc"));
  EXPECT_TRUE(gemms().empty());

  const std::byte short_args[8] = {};
  const LibraryCall call{1, library_ops::LibraryHandle(7), library_ops::LibraryOp::kBlasGemm,
                         short_args};
  EXPECT_EQ(blas_->run(streams_[0], call).code(), ErrorCode::kInvalidValue);
}

TEST(CudaLibrariesMissing, AHandleOfAMissingLibraryFailsNamingIt) {
  ASSERT_NO_FATAL_FAILURE(load_fake_driver());
  Result<std::unique_ptr<Device>> created =
      create_cuda_device(options_with_folder("/nonexistent/hiber-libs"));
  ASSERT_TRUE(created.ok()) << created.status() << " (the device itself needs no library)";
  std::unique_ptr<Device> device = std::move(created).value();

  LibraryBackend* blas = device->library(library_ops::Library::kBlas);
  ASSERT_NE(blas, nullptr);
  Status s = blas->check_available();
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_THAT(s.message(), HasSubstr(cuda_abi::kCublasSoname));
  EXPECT_THAT(s.message(), HasSubstr(std::string("/nonexistent/hiber-libs/") +
                                     cuda_abi::kCublasSoname + " (no such file)"));
  EXPECT_THAT(s.message(), HasSubstr("--cuda_library_path"));
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line";

  Result<Stream> stream = device->create_stream(0, 0);
  ASSERT_TRUE(stream.ok());
  const Gemm g = sgemm();
  const LibraryCall call{1, library_ops::LibraryHandle(7), library_ops::LibraryOp::kBlasGemm,
                         library_ops::op_bytes(g)};
  EXPECT_EQ(blas->run(*stream, call).code(), ErrorCode::kNotSupported);
  blas->release(1, std::nullopt);  // nothing to release, nothing opened

  LibraryBackend* dnn = device->library(library_ops::Library::kDnn);
  ASSERT_NE(dnn, nullptr);
  Status d = dnn->check_available();
  EXPECT_EQ(d.code(), ErrorCode::kNotSupported);
  EXPECT_THAT(d.message(), HasSubstr(cuda_abi::kCudnnSoname));
  EXPECT_TRUE(device->destroy_stream(*stream).ok());
}

}  // namespace
}  // namespace hiber::device
