// The session's library handles and the dispatch of library calls to the checks of their
// library (server/library_calls.h): handles are the session's own, operations belong to the
// handle's library, arguments are bounded.
#include "server/library_calls.h"

#include <gtest/gtest.h>

#include "library_ops/blas_ops.h"

namespace hiber::server {
namespace {

constexpr uint8_t kBlas = static_cast<uint8_t>(library_ops::Library::kBlas);
constexpr uint8_t kDnn = static_cast<uint8_t>(library_ops::Library::kDnn);

library_ops::blas::Gemm small_gemm() {
  library_ops::blas::Gemm g;
  g.m = 4;
  g.n = 3;
  g.k = 2;
  g.lda = 4;
  g.ldb = 2;
  g.ldc = 4;
  g.a = 0x1000;
  g.b = 0x2000;
  g.c = 0x3000;
  g.compute_type = 68;  // CUBLAS_COMPUTE_32F
  return g;
}

TEST(LibraryCallsTest, HandlesAreTheSessionsOwn) {
  LibraryCalls calls;
  const wire::LibraryHandle h(7);
  ASSERT_TRUE(calls.create_handle(h, kBlas).ok());
  EXPECT_EQ(*calls.library(h), library_ops::Library::kBlas);
  // Created twice, or never: refused.
  EXPECT_EQ(calls.create_handle(h, kBlas).code(), ErrorCode::kInvalidValue);
  const Result<LibraryAccess> foreign =
      calls.check_call(wire::LibraryHandle(8), 1, library_ops::op_bytes(small_gemm()));
  EXPECT_EQ(foreign.status().code(), ErrorCode::kInvalidHandle);
  EXPECT_NE(foreign.status().message().find("was not created by this session"), std::string::npos)
      << foreign.status();
  ASSERT_TRUE(calls.destroy_handle(h).ok());
  EXPECT_EQ(calls.destroy_handle(h).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(calls.check_call(h, 1, library_ops::op_bytes(small_gemm())).status().code(),
            ErrorCode::kInvalidHandle);
}

TEST(LibraryCallsTest, RefusesUnknownLibrariesAndTheReservedHandle) {
  LibraryCalls calls;
  EXPECT_EQ(calls.create_handle(wire::LibraryHandle(1), 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(calls.create_handle(wire::LibraryHandle(1), 9).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(calls.create_handle(wire::LibraryHandle(0), kBlas).code(), ErrorCode::kInvalidValue);
}

TEST(LibraryCallsTest, AnOperationMustBelongToTheHandlesLibrary) {
  LibraryCalls calls;
  const wire::LibraryHandle dnn(3);
  ASSERT_TRUE(calls.create_handle(dnn, kDnn).ok());
  const Result<LibraryAccess> gemm_on_dnn =
      calls.check_call(dnn, static_cast<uint16_t>(library_ops::LibraryOp::kBlasGemm),
                       library_ops::op_bytes(small_gemm()));
  EXPECT_EQ(gemm_on_dnn.status().code(), ErrorCode::kInvalidValue) << gemm_on_dnn.status();
}

TEST(LibraryCallsTest, AGemmsOperandsAreItsMatrices) {
  LibraryCalls calls;
  const wire::LibraryHandle h(5);
  ASSERT_TRUE(calls.create_handle(h, kBlas).ok());
  const Result<LibraryAccess> access =
      calls.check_call(h, static_cast<uint16_t>(library_ops::LibraryOp::kBlasGemm),
                       library_ops::op_bytes(small_gemm()));
  ASSERT_TRUE(access.ok()) << access.status();
  ASSERT_EQ(access->operands.size(), 3u);
  // A: 4 x 2 floats, B: 2 x 3, C: 4 x 3 (written).
  EXPECT_EQ(access->operands[0].ptr, 0x1000u);
  EXPECT_EQ(access->operands[0].bytes, 4u * 2 * 4);
  EXPECT_FALSE(access->operands[0].write);
  EXPECT_EQ(access->operands[1].bytes, 2u * 3 * 4);
  EXPECT_EQ(access->operands[2].bytes, 4u * 3 * 4);
  EXPECT_TRUE(access->operands[2].write);
  EXPECT_FALSE(access->through_pointers);
}

TEST(LibraryCallsTest, RefusesArgumentsOfTheWrongSizeOrBeyondTheLimit) {
  LibraryCalls calls;
  const wire::LibraryHandle h(5);
  ASSERT_TRUE(calls.create_handle(h, kBlas).ok());
  const std::vector<std::byte> short_args(10);
  EXPECT_EQ(calls.check_call(h, 1, short_args).status().code(), ErrorCode::kInvalidValue);
  const std::vector<std::byte> huge(wire::kMaxLibraryArgBytes + 1);
  EXPECT_EQ(calls.check_call(h, 1, huge).status().code(), ErrorCode::kInvalidValue);
}

TEST(LibraryCallsTest, BoundsTheHandlesOfOneSession) {
  LibraryCalls calls;
  for (uint64_t i = 1; i <= wire::kMaxLibraryHandles; ++i) {
    ASSERT_TRUE(calls.create_handle(wire::LibraryHandle(i), kBlas).ok());
  }
  EXPECT_EQ(calls.create_handle(wire::LibraryHandle(wire::kMaxLibraryHandles + 1), kBlas).code(),
            ErrorCode::kOutOfMemory);
}

}  // namespace
}  // namespace hiber::server
