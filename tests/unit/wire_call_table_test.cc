// The call table: it covers the schema's Call union exactly, and each call's struct round-trips
// through Cap'n Proto.
#include <capnp/message.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <type_traits>

#include "library_ops/library_ops.h"
#include "wire/call_codec.h"

namespace hiber::wire {
namespace {

static_assert(!std::is_convertible_v<StreamHandle, EventHandle>,
              "handles of different kinds must not mix");
static_assert(!std::is_convertible_v<uint64_t, StreamHandle>, "a handle is made explicitly");

TEST(CallTable, NamesEveryCallOfTheSchema) {
  const auto fields = capnp::Schema::from<proto::Call>().getUnionFields();
  size_t table_calls = 0;
#define HIBER_COUNT(Name, name, WHICH, where, timing, shape, handler, fields) ++table_calls;
  HIBER_CALLS(HIBER_COUNT, HIBER_CALL_IGNORED)
#undef HIBER_COUNT
  EXPECT_EQ(table_calls, fields.size());
  for (auto field : fields) {
    const auto which = static_cast<proto::Call::Which>(field.getProto().getDiscriminantValue());
    EXPECT_EQ(call_name(which), field.getProto().getName().cStr());
  }
  EXPECT_EQ(call_name(static_cast<proto::Call::Which>(60000)), "unknown");
}

TEST(CallTable, GpuCallsAreTheOnesThatQueueDeviceWork) {
  EXPECT_TRUE(runs_on_gpu(proto::Call::MEMCPY_HTO_D));
  EXPECT_TRUE(runs_on_gpu(proto::Call::LAUNCH_KERNEL));
  EXPECT_TRUE(runs_on_gpu(proto::Call::EVENT_RECORD));
  EXPECT_TRUE(runs_on_gpu(proto::Call::STREAM_WAIT_EVENT));
  EXPECT_FALSE(runs_on_gpu(proto::Call::MEM_ALLOCATE));
  EXPECT_FALSE(runs_on_gpu(proto::Call::STREAM_SYNCHRONIZE));
  EXPECT_FALSE(runs_on_gpu(proto::Call::DEVICE_SYNCHRONIZE));
  EXPECT_EQ(calls::StreamSynchronize::kTiming, Timing::kSync);
  EXPECT_EQ(calls::StreamQuery::kTiming, Timing::kAsync);
}

TEST(CallTable, ALibraryCallThatOnlyDefinesSessionStateRunsNoGpuWork) {
  auto library_call = [](library_ops::LibraryOp op) {
    auto message = std::make_unique<capnp::MallocMessageBuilder>();
    auto call = message->initRoot<proto::Call>();
    call.initLibraryCall().setOp(static_cast<uint16_t>(op));
    return message;
  };
  auto define = library_call(library_ops::LibraryOp::kDnnDefineGraph);
  auto execute = library_call(library_ops::LibraryOp::kDnnExecute);
  EXPECT_FALSE(runs_on_gpu(define->getRoot<proto::Call>().asReader()));
  EXPECT_TRUE(runs_on_gpu(execute->getRoot<proto::Call>().asReader()));
  EXPECT_TRUE(runs_on_gpu(proto::Call::LIBRARY_CALL));
}

template <typename T>
T round_trip(const T& args) {
  capnp::MallocMessageBuilder message;
  auto call = message.initRoot<proto::Call>();
  fill_call(call, args);
  return read_call<T>(call.asReader());
}

TEST(CallTable, ArgumentsRoundTrip) {
  const auto copy = round_trip(calls::MemcpyHtoD{.stream = StreamHandle(7),
                                                 .dst = 0x1000,
                                                 .src_offset = 64,
                                                 .bytes = 128,
                                                 .staging_end = 192});
  EXPECT_EQ(copy.stream, StreamHandle(7));
  EXPECT_EQ(copy.dst, 0x1000u);
  EXPECT_EQ(copy.src_offset, 64u);
  EXPECT_EQ(copy.bytes, 128u);
  EXPECT_EQ(copy.staging_end, 192u);

  const auto record =
      round_trip(calls::EventRecord{.stream = StreamHandle(3), .event = EventHandle(4)});
  EXPECT_EQ(record.stream, StreamHandle(3));
  EXPECT_EQ(record.event, EventHandle(4));

  const auto get = round_trip(calls::FunctionGet{
      .function = FunctionHandle(9), .module = ModuleHandle(8), .name = "_Z1kv"});
  EXPECT_EQ(get.function, FunctionHandle(9));
  EXPECT_EQ(get.module, ModuleHandle(8));
  EXPECT_EQ(get.name, "_Z1kv");

  const std::array<std::byte, 3> params = {std::byte{1}, std::byte{2}, std::byte{3}};
  capnp::MallocMessageBuilder message;
  auto call = message.initRoot<proto::Call>();
  fill_call(call, calls::LaunchKernel{.stream = StreamHandle(1),
                                      .function = FunctionHandle(2),
                                      .grid_x = 4,
                                      .block_x = 32,
                                      .shared_mem_bytes = 16,
                                      .params = params});
  const auto launch = read_call<calls::LaunchKernel>(call.asReader());
  EXPECT_EQ(launch.grid_x, 4u);
  EXPECT_EQ(launch.grid_y, 0u);
  EXPECT_EQ(launch.block_x, 32u);
  EXPECT_EQ(launch.shared_mem_bytes, 16u);
  ASSERT_EQ(launch.params.size(), params.size());
  EXPECT_EQ(launch.params[2], std::byte{3});

  capnp::MallocMessageBuilder sync_message;
  auto sync = sync_message.initRoot<proto::Call>();
  fill_call(sync, calls::DeviceSynchronize{});
  EXPECT_EQ(sync.which(), proto::Call::DEVICE_SYNCHRONIZE);
}

TEST(CallTable, StagingEndOnlyWhereTheCallNamesOne) {
  capnp::MallocMessageBuilder message;
  auto call = message.initRoot<proto::Call>();
  fill_call(call, calls::MemcpyDtoH{.stream = StreamHandle(), .bytes = 8, .staging_end = 4096});
  EXPECT_EQ(staging_end(call.asReader()), 4096u);
  fill_call(call, calls::ModuleLoad{.module = ModuleHandle(1), .staging_end = 77});
  EXPECT_EQ(staging_end(call.asReader()), 77u);
  fill_call(call, calls::MemcpyDtoD{.bytes = 8});
  EXPECT_EQ(staging_end(call.asReader()), 0u);
}

}  // namespace
}  // namespace hiber::wire
