// The runtime's current device and the driver's context stack are one state per thread, as
// CUDA documents them (cudaSetDevice, cuCtxSetCurrent, cuCtxPushCurrent/PopCurrent). The
// front-ends' entry points (runtime_api.cc, driver_api.cc) check arguments and call these; the
// program tests/shim/programs/runtime_gaps.cu walks the same interplay through the shim on the
// one device a function sees.
#include "client_shim/thread_context.h"

#include <gtest/gtest.h>

#include <thread>

namespace hiber::shim {
namespace {

class ThreadContextTest : public ::testing::Test {
 protected:
  // Each test starts as a new thread does.
  void SetUp() override {
    context_stack().clear();
    set_current_device(0);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(ThreadContextTest, ANewThreadStartsOnDeviceZerosPrimaryContext) {
  set_current_device(3);
  int device = -1;
  CUcontext context = nullptr;
  std::thread([&] {
    device = current_device();
    context = current_context();
  }).join();
  EXPECT_EQ(device, 0);
  EXPECT_EQ(context, primary_context(0));
  EXPECT_EQ(current_device(), 3) << "the other thread's state is its own";
}

TEST_F(ThreadContextTest, SetDeviceMakesItsPrimaryContextCurrent) {
  set_current_device(1);
  EXPECT_EQ(current_context(), primary_context(1));
  EXPECT_EQ(device_of(current_context()), 1);
}

TEST_F(ThreadContextTest, TheRuntimesDeviceFollowsPushAndPop) {
  set_current_device(1);
  push_context(primary_context(2));
  EXPECT_EQ(current_device(), 2);
  EXPECT_EQ(pop_context(), primary_context(2));
  EXPECT_EQ(current_device(), 1) << "back to the device cudaSetDevice chose";
  EXPECT_EQ(current_context(), primary_context(1));
  EXPECT_EQ(pop_context(), nullptr) << "nothing pushed";
}

TEST_F(ThreadContextTest, SetCurrentMovesTheRuntimeAndSetDeviceReplacesTheTop) {
  set_current_context(primary_context(2));
  EXPECT_EQ(current_device(), 2);
  set_current_device(1);  // replaces the top, as cuCtxSetCurrent would
  EXPECT_EQ(context_stack().size(), 1u);
  EXPECT_EQ(current_context(), primary_context(1));
  push_context(primary_context(0));
  set_current_device(3);
  ASSERT_EQ(context_stack().size(), 2u);
  EXPECT_EQ(context_stack()[0], primary_context(1)) << "only the top is replaced";
  EXPECT_EQ(current_device(), 3);
  set_current_context(nullptr);  // unbinds the top
  set_current_context(nullptr);
  EXPECT_TRUE(context_stack().empty());
  EXPECT_EQ(current_context(), primary_context(3)) << "the runtime's device's, implicitly";
}

TEST_F(ThreadContextTest, OnlyThePrimaryContextsAreContexts) {
  EXPECT_NE(as_primary(primary_context(kMaxDevices - 1)), nullptr);
  int not_a_context = 0;
  EXPECT_EQ(as_primary(reinterpret_cast<CUcontext>(&not_a_context)), nullptr);
  EXPECT_EQ(as_primary(nullptr), nullptr);
  for (int d = 0; d < kMaxDevices; ++d) EXPECT_EQ(device_of(primary_context(d)), d);
}

}  // namespace
}  // namespace hiber::shim
