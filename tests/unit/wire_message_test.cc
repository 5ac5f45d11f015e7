// read_message: framing checks and reader limits on untrusted bytes; frame_pieces/frame_bytes.
#include "wire/message.h"

#include <capnp/any.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "wire/limits.h"
#include "wire/schema/calls.capnp.h"

namespace hiber::wire {
namespace {

Message to_message(std::span<const std::byte> bytes) {
  Message message;
  std::memcpy(message.resize(bytes.size()).data(), bytes.data(), bytes.size());
  return message;
}

// A batch spread over several segments (the builder's first segment is tiny).
std::vector<std::byte> batch_bytes(int calls) {
  capnp::MallocMessageBuilder builder(4, capnp::AllocationStrategy::FIXED_SIZE);
  auto batch = builder.initRoot<proto::Batch>();
  batch.setFirstSeq(100);
  auto list = batch.initCalls(calls);
  for (int i = 0; i < calls; ++i) {
    auto launch = list[i].initLaunchKernel();
    launch.setFunction(i);
    const std::byte params[12] = {std::byte{1}, std::byte{2}};
    launch.setParams(
        capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(params), sizeof(params)));
  }
  return frame_bytes(builder);
}

Status read_batch(const Message& message, int* calls = nullptr) {
  return read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) {
    if (calls) *calls = static_cast<int>(batch.getCalls().size());
    for (auto call : batch.getCalls()) {
      if (call.which() == proto::Call::LAUNCH_KERNEL)
        (void)call.getLaunchKernel().getParams().size();
    }
    return Status();
  });
}

TEST(MessageTest, ResizeKeepsThePrefixAndIsWordAligned) {
  Message message;
  auto bytes = message.resize(5);
  std::memcpy(bytes.data(), "hello", 5);
  EXPECT_EQ(message.words().size(), 1u);
  message.resize(100);
  EXPECT_EQ(std::memcmp(message.bytes().data(), "hello", 5), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(message.bytes().data()) % 8, 0u);
  EXPECT_EQ(message.size(), 100u);
}

TEST(MessageTest, FramedMultiSegmentMessageRoundTrips) {
  const auto bytes = batch_bytes(50);
  const Message message = to_message(bytes);
  int calls = 0;
  ASSERT_TRUE(read_batch(message, &calls).ok());
  EXPECT_EQ(calls, 50);
  uint32_t segments;
  std::memcpy(&segments, bytes.data(), 4);
  EXPECT_GT(segments + 1, 2u) << "the test wants several segments";
}

TEST(MessageTest, FramePiecesMatchFrameBytes) {
  capnp::MallocMessageBuilder builder(4, capnp::AllocationStrategy::FIXED_SIZE);
  builder.initRoot<proto::Batch>().initCalls(3)[1].initPing().setValue(77);
  WordBuffer table;
  std::vector<std::byte> joined;
  for (auto piece : frame_pieces(builder, table))
    joined.insert(joined.end(), piece.begin(), piece.end());
  EXPECT_EQ(joined, frame_bytes(builder));
}

TEST(MessageTest, EmptyMessageIsInvalid) {
  const Status status = read_batch(Message());
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(status.message(), "batch: empty message");
}

TEST(MessageTest, EveryTruncationIsInvalid) {
  const auto bytes = batch_bytes(10);
  for (size_t cut = 1; cut < bytes.size(); ++cut) {
    const Status status = read_batch(to_message(std::span(bytes).first(cut)));
    ASSERT_EQ(status.code(), ErrorCode::kInvalidValue) << "cut at " << cut;
    ASSERT_EQ(status.message().rfind("batch: ", 0), 0u) << status;
  }
}

TEST(MessageTest, TrailingBytesAreInvalid) {
  auto bytes = batch_bytes(2);
  bytes.resize(bytes.size() + 8);
  const Status status = read_batch(to_message(bytes));
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("segment table describes"), std::string::npos) << status;
}

TEST(MessageTest, WrongFramingIsInvalid) {
  auto bytes = batch_bytes(2);
  const auto with_u32 = [&](size_t index, uint32_t value) {
    auto copy = bytes;
    std::memcpy(copy.data() + 4 * index, &value, 4);
    return read_batch(to_message(copy));
  };
  Status status = with_u32(0, kMaxSegments);  // kMaxSegments + 1 segments
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("segments; at most"), std::string::npos) << status;

  status = with_u32(0, 0xffffffff);  // a count that wraps to zero in 32 bits
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue) << status;

  status = with_u32(1, 0xffffffff);  // a segment far larger than the message
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("segment table describes"), std::string::npos) << status;

  uint32_t segments;
  std::memcpy(&segments, bytes.data(), 4);
  status = with_u32(0, segments + 200);  // the table runs past the sizes we have
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue) << status;
}

TEST(MessageTest, SeededGarbageNeverCrashes) {
  std::mt19937_64 random(301);
  int invalid = 0;
  constexpr int kRounds = 3000;
  for (int round = 0; round < kRounds; ++round) {
    const size_t words = 1 + random() % 64;
    std::vector<uint64_t> garbage(words);
    for (auto& w : garbage) w = random() % 3 == 0 ? random() : random() % 4096;
    if (round % 2 == 0) {
      // A correct single-segment table, so the reader gets to interpret the garbage.
      garbage[0] = (words - 1) << 32;
    }
    const Status status = read_batch(to_message(std::as_bytes(std::span(garbage))));
    ASSERT_TRUE(status.ok() || status.code() == ErrorCode::kInvalidValue) << status;
    invalid += !status.ok();
  }
  EXPECT_GT(invalid, kRounds / 4);
}

TEST(MessageTest, TraversalLimitStopsAmplification) {
  // Reading the same list over and over costs traversal budget each time; a hostile message
  // uses overlapping pointers to the same effect.
  const Message message = to_message(batch_bytes(100));
  const Status status =
      read_message<proto::Batch>(message, "batch", [](proto::Batch::Reader batch) {
        uint64_t sum = 0;
        for (int i = 0; i < 10; ++i) {
          for (auto call : batch.getCalls()) sum += call.getLaunchKernel().getParams().size();
        }
        return sum > 0 ? Status() : Status(ErrorCode::kUnknown, "unreachable");
      });
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("traversal limit"), std::string::npos) << status;
}

// A chain of `depth` structs, each holding the next in its only pointer.
std::vector<std::byte> nested_structs(int depth) {
  capnp::MallocMessageBuilder builder;
  capnp::AnyPointer::Builder pointer = builder.initRoot<capnp::AnyPointer>();
  for (int d = 0; d < depth; ++d) {
    pointer = pointer.initAsAnyStruct(0, 1).getPointerSection()[0];
  }
  return frame_bytes(builder);
}

Status walk_nested(const Message& message, int* depth) {
  return read_message<capnp::AnyPointer>(message, "nested", [&](capnp::AnyPointer::Reader root) {
    *depth = 0;
    for (capnp::AnyPointer::Reader pointer = root; !pointer.isNull(); ++*depth) {
      pointer = pointer.getAs<capnp::AnyStruct>().getPointerSection()[0];
    }
    return Status();
  });
}

TEST(MessageTest, NestingLimitIsEnforced) {
  int depth = 0;
  ASSERT_TRUE(walk_nested(to_message(nested_structs(kNestingLimit - 1)), &depth).ok());
  EXPECT_EQ(depth, kNestingLimit - 1);
  const Status status = walk_nested(to_message(nested_structs(3 * kNestingLimit)), &depth);
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("too deeply-nested"), std::string::npos) << status;
}

TEST(MessageTest, TheCallbacksOwnStatusIsReturned) {
  const Status status = read_message<proto::Batch>(
      to_message(batch_bytes(1)), "batch",
      [](proto::Batch::Reader) { return Status(ErrorCode::kNotSupported, "no"); });
  EXPECT_EQ(status, Status(ErrorCode::kNotSupported, "no"));
}

}  // namespace
}  // namespace hiber::wire
