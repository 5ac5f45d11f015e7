// HandleTable: client handles are checked, and each client stream or event gets a device object
// on each GPU where it is put to work.
#include "server/handle_table.h"

#include <gtest/gtest.h>

#include <memory>

#include "server/device/sim_device.h"

namespace hiber::server {
namespace {

using wire::EventHandle;
using wire::StreamHandle;

class HandleTableTest : public testing::Test {
 protected:
  void SetUp() override {
    device::SimDeviceOptions options;
    for (GpuSpec& gpu : options.node.gpus) gpu.memory_bytes = 64 << 20;
    auto device = device::SimDevice::create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    ASSERT_GE(device_->gpu_count(), 2);
    table_ = std::make_unique<HandleTable>(*device_, device_->gpu_count());
  }
  void TearDown() override {
    if (table_) table_->destroy_all();
  }

  std::unique_ptr<device::SimDevice> device_;
  std::unique_ptr<HandleTable> table_;
};

TEST_F(HandleTableTest, RefusesReservedAndDuplicateHandles) {
  EXPECT_EQ(table_->add_stream(StreamHandle(0), 0).code(), ErrorCode::kInvalidValue);
  EXPECT_TRUE(table_->add_stream(StreamHandle(5), 0).ok());
  EXPECT_EQ(table_->add_stream(StreamHandle(5), 0).code(), ErrorCode::kInvalidValue);
  // Handles of different kinds live apart: event 5 is not stream 5.
  EXPECT_TRUE(table_->add_event(EventHandle(5), false).ok());
  EXPECT_EQ(table_->event(EventHandle(6)).status().code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(table_->stream(StreamHandle(6)).status().code(), ErrorCode::kInvalidHandle);
}

TEST_F(HandleTableTest, TheDefaultStreamAlwaysExistsAndCannotBeRemoved) {
  auto stream = table_->stream(StreamHandle());
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(table_->remove_stream(StreamHandle()).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table_->client_streams().size(), 1u);
}

TEST_F(HandleTableTest, AStreamGetsOneDeviceStreamPerGpuItWorksOn) {
  ASSERT_TRUE(table_->add_stream(StreamHandle(1), 0).ok());
  auto on0 = table_->work_stream(StreamHandle(1), 0);
  ASSERT_TRUE(on0.ok());
  auto again = table_->work_stream(StreamHandle(1), 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(on0->id, again->id);
  auto on1 = table_->work_stream(StreamHandle(1), 1);
  ASSERT_TRUE(on1.ok());
  EXPECT_EQ(on1->gpu, 1);
  EXPECT_NE(on0->id, on1->id);
  EXPECT_EQ((*table_->stream(StreamHandle(1)))->last_gpu, 1);
  EXPECT_EQ(table_->all_streams().size(), 2u);

  auto removed = table_->remove_stream(StreamHandle(1));
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->per_gpu[0].has_value());
  EXPECT_TRUE(removed->per_gpu[1].has_value());
  for (const auto& s : removed->per_gpu) {
    if (s) {
      EXPECT_TRUE(device_->destroy_stream(*s).ok());
    }
  }
  EXPECT_TRUE(table_->all_streams().empty());
}

TEST_F(HandleTableTest, AnEventGetsADeviceEventOnFirstUseOnAGpu) {
  ASSERT_TRUE(table_->add_event(EventHandle(2), true).ok());
  ClientEvent* event = *table_->event(EventHandle(2));
  EXPECT_FALSE(event->last_gpu.has_value()) << "never recorded";
  auto first = table_->event_on(*event, 1);
  ASSERT_TRUE(first.ok());
  auto second = table_->event_on(*event, 1);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->id, second->id);
  EXPECT_EQ(first->gpu, 1);
  EXPECT_FALSE(event->per_gpu[0].has_value());
}

// After GPU 1's shared context is reset, the table forgets its objects there (never passing
// them to the device again) and makes new ones in the fresh context on next use; GPU 0's stay.
TEST_F(HandleTableTest, ForgettingAGpuDropsItsObjectsThereAndOnlyThere) {
  ASSERT_TRUE(table_->add_stream(StreamHandle(1), 0).ok());
  ASSERT_TRUE(table_->add_event(EventHandle(2), false).ok());
  auto on0 = table_->work_stream(StreamHandle(1), 0);
  auto on1 = table_->work_stream(StreamHandle(1), 1);
  ClientEvent* event = *table_->event(EventHandle(2));
  auto event_on1 = table_->event_on(*event, 1);
  ASSERT_TRUE(on0.ok() && on1.ok() && event_on1.ok() && table_->swap_stream(1).ok());
  event->last_gpu = 1;
  ASSERT_TRUE(device_->reset_shared_context(1).ok());

  table_->forget_gpu(1);
  ClientStream* stream = *table_->stream(StreamHandle(1));
  EXPECT_FALSE(stream->per_gpu[1].has_value());
  EXPECT_FALSE(stream->last_gpu.has_value()) << "its latest work there drained";
  EXPECT_FALSE(event->per_gpu[1].has_value());
  EXPECT_FALSE(event->last_gpu.has_value()) << "complete";
  ASSERT_TRUE(stream->per_gpu[0].has_value());
  EXPECT_EQ(stream->per_gpu[0]->id, on0->id);
  EXPECT_EQ(table_->all_streams().size(), 1u) << "GPU 1's swap stream is forgotten too";
  EXPECT_EQ(device_->query_stream(*on1).code(), ErrorCode::kInvalidHandle)
      << "the old stream is gone with its context";

  auto again = table_->work_stream(StreamHandle(1), 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->context, device_->shared_context(1).id);
  EXPECT_TRUE(device_->query_stream(*again).ok());
  table_->destroy_all();
}

}  // namespace
}  // namespace hiber::server
