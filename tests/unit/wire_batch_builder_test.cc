// BatchBuilder: every call kind round-trips, batches carry no slack, memory is reused.
#include "wire/batch_builder.h"

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "wire/message.h"

// Counts heap allocations made through operator new (what capnp, kj and std use).
namespace {
std::atomic<uint64_t> g_allocations{0};
}  // namespace

// These replace the global operators, so malloc/free pair correctly; GCC cannot see that.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t bytes) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t bytes) { return operator new(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace hiber::wire {
namespace {

using capnp::DynamicStruct;
using capnp::StructSchema;

Message join(std::span<const std::span<const std::byte>> pieces) {
  size_t total = 0;
  for (auto piece : pieces) total += piece.size();
  Message message;
  auto out = message.resize(total);
  size_t at = 0;
  for (auto piece : pieces) {
    std::memcpy(out.data() + at, piece.data(), piece.size());
    at += piece.size();
  }
  return message;
}

// Fills every field of call kind `kind` (a union member of Call) by reflection, with values
// derived from `seed`, so that each kind, present and future, is covered.
uint64_t value_for(uint64_t seed, uint32_t field) { return seed * 1000003 + field * 7919 + 1; }

std::string text_for(uint64_t seed, size_t bytes) {
  std::string s(bytes, 'a');
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>('a' + (seed + i) % 26);
  return s;
}

void fill(proto::Call::Builder call, StructSchema::Field kind, uint64_t seed, size_t blob_bytes) {
  DynamicStruct::Builder dynamic = call;
  call.setReply(seed % 2 == 0);
  if (!kind.getProto().isGroup()) {
    dynamic.set(kind, capnp::VOID);
    return;
  }
  DynamicStruct::Builder group = dynamic.init(kind).as<DynamicStruct>();
  for (auto field : group.getSchema().getFields()) {
    const uint64_t v = value_for(seed, field.getIndex());
    switch (field.getType().which()) {
      case capnp::schema::Type::BOOL: group.set(field, v % 2 == 1); break;
      case capnp::schema::Type::UINT8: group.set(field, static_cast<uint8_t>(v)); break;
      case capnp::schema::Type::UINT16: group.set(field, static_cast<uint16_t>(v)); break;
      case capnp::schema::Type::INT32: group.set(field, static_cast<int32_t>(v)); break;
      case capnp::schema::Type::UINT32: group.set(field, static_cast<uint32_t>(v)); break;
      case capnp::schema::Type::UINT64: group.set(field, v); break;
      case capnp::schema::Type::TEXT: {
        const std::string s = text_for(seed, blob_bytes % 200 + 1);
        group.set(field, capnp::Text::Reader(s.c_str(), s.size()));
        break;
      }
      case capnp::schema::Type::DATA: {
        const std::string s = text_for(seed, blob_bytes);
        group.set(field,
                  capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(s.data()), s.size()));
        break;
      }
      default:
        FAIL() << "calls.capnp has a field type this test does not know: "
               << field.getProto().getName().cStr();
    }
  }
}

void check(proto::Call::Reader call, StructSchema::Field kind, uint64_t seed, size_t blob_bytes) {
  DynamicStruct::Reader dynamic = call;
  ASSERT_EQ(call.getReply(), seed % 2 == 0);
  KJ_IF_MAYBE (which, dynamic.which()) {
    ASSERT_EQ(which->getIndex(), kind.getIndex()) << "call kind";
  } else {
    FAIL() << "no union member set";
  }
  if (!kind.getProto().isGroup()) return;
  DynamicStruct::Reader group = dynamic.get(kind).as<DynamicStruct>();
  for (auto field : group.getSchema().getFields()) {
    const uint64_t v = value_for(seed, field.getIndex());
    const auto value = group.get(field);
    const std::string name = field.getProto().getName().cStr();
    switch (field.getType().which()) {
      case capnp::schema::Type::BOOL: EXPECT_EQ(value.as<bool>(), v % 2 == 1) << name; break;
      case capnp::schema::Type::UINT8:
        EXPECT_EQ(value.as<uint8_t>(), static_cast<uint8_t>(v)) << name;
        break;
      case capnp::schema::Type::UINT16:
        EXPECT_EQ(value.as<uint16_t>(), static_cast<uint16_t>(v)) << name;
        break;
      case capnp::schema::Type::INT32:
        EXPECT_EQ(value.as<int32_t>(), static_cast<int32_t>(v)) << name;
        break;
      case capnp::schema::Type::UINT32:
        EXPECT_EQ(value.as<uint32_t>(), static_cast<uint32_t>(v)) << name;
        break;
      case capnp::schema::Type::UINT64: EXPECT_EQ(value.as<uint64_t>(), v) << name; break;
      case capnp::schema::Type::TEXT:
        EXPECT_EQ(std::string(value.as<capnp::Text>().cStr()), text_for(seed, blob_bytes % 200 + 1))
            << name;
        break;
      case capnp::schema::Type::DATA: {
        const auto data = value.as<capnp::Data>();
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.begin()), data.size()),
                  text_for(seed, blob_bytes))
            << name;
        break;
      }
      default: FAIL() << name;
    }
  }
}

std::vector<StructSchema::Field> call_kinds() {
  std::vector<StructSchema::Field> kinds;
  for (auto field : capnp::Schema::from<proto::Call>().getUnionFields()) kinds.push_back(field);
  return kinds;
}

TEST(BatchBuilderTest, EveryCallKindRoundTrips) {
  const auto kinds = call_kinds();
  ASSERT_EQ(kinds.size(), 32u) << "calls.capnp changed: check this test still covers it";
  BatchBuilder builder(64);
  builder.reset(1000);
  for (size_t k = 0; k < kinds.size(); ++k) fill(builder.add_call(), kinds[k], k, 100 + k);
  EXPECT_EQ(builder.size(), kinds.size());
  const Message message = join(builder.finish());
  const Status status =
      read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) {
        EXPECT_EQ(batch.getFirstSeq(), 1000u);
        // getCalls() once: every call of it charges the whole list to the traversal limit.
        const auto calls = batch.getCalls();
        EXPECT_EQ(calls.size(), kinds.size());
        for (size_t k = 0; k < kinds.size(); ++k) check(calls[k], kinds[k], k, 100 + k);
        return Status();
      });
  ASSERT_TRUE(status.ok()) << status;
}

TEST(BatchBuilderTest, TypedAccessorsSeeTheData) {
  BatchBuilder builder(8);
  builder.reset(1);
  auto launch = builder.add_call().initLaunchKernel();
  launch.setFunction(42);
  launch.setGridX(3);
  const std::byte params[] = {std::byte{9}, std::byte{8}, std::byte{7}};
  launch.setParams(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(params), 3));
  builder.add_call().initFunctionGet().setName("_Z6kernelPf");
  const Message message = join(builder.finish());
  ASSERT_TRUE(read_message<proto::Batch>(message, "batch", [](proto::Batch::Reader batch) {
                const auto calls = batch.getCalls();
                EXPECT_EQ(calls[0].getLaunchKernel().getFunction(), 42u);
                EXPECT_EQ(calls[0].getLaunchKernel().getGridX(), 3u);
                EXPECT_EQ(calls[0].getLaunchKernel().getParams().size(), 3u);
                EXPECT_EQ(calls[0].getLaunchKernel().getParams()[2], 7);
                EXPECT_EQ(std::string(calls[1].getFunctionGet().getName().cStr()), "_Z6kernelPf");
                return Status();
              }).ok());
}

// What MallocMessageBuilder produces for a batch of fixed-size calls: the same layout as ours.
std::vector<std::byte> reference_pings(uint64_t first_seq, uint32_t count) {
  capnp::MallocMessageBuilder reference(16 + 8 * count);  // one segment
  auto batch = reference.initRoot<proto::Batch>();
  batch.setFirstSeq(first_seq);
  auto calls = batch.initCalls(count);
  for (uint32_t i = 0; i < count; ++i) {
    calls[i].setReply(i % 3 == 0);
    calls[i].initPing().setValue(first_seq + i);
  }
  return frame_bytes(reference);
}

void add_pings(BatchBuilder& builder, uint64_t first_seq, uint32_t count) {
  builder.reset(first_seq);
  for (uint32_t i = 0; i < count; ++i) {
    auto call = builder.add_call();
    call.setReply(i % 3 == 0);
    call.initPing().setValue(first_seq + i);
  }
}

TEST(BatchBuilderTest, TruncationLeavesNoSlack) {
  BatchBuilder builder(4096);
  add_pings(builder, 7, 1);
  const uint64_t estimate = builder.encoded_bytes();
  const Message message = join(builder.finish());
  // Table word, root pointer, Batch struct, list tag, one 8-word call.
  EXPECT_EQ(message.size(), 8u * (1 + 1 + 2 + 1 + 8));
  EXPECT_EQ(estimate, message.size());
  EXPECT_EQ(builder.encoded_bytes(), message.size());
  const auto reference = reference_pings(7, 1);
  ASSERT_EQ(message.size(), reference.size());
  EXPECT_EQ(std::memcmp(message.bytes().data(), reference.data(), reference.size()), 0);
}

TEST(BatchBuilderTest, EncodedBytesBoundsMultiSegmentBatches) {
  BatchBuilder builder(128);
  builder.reset(1);
  for (int i = 0; i < 10; ++i) {
    auto launch = builder.add_call().initLaunchKernel();
    const std::string params(5000, 'x');
    launch.setParams(
        capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(params.data()), params.size()));
  }
  const uint64_t estimate = builder.encoded_bytes();
  const Message message = join(builder.finish());
  EXPECT_GE(estimate, message.size());
  EXPECT_LE(estimate, message.size() + 64);
}

TEST(BatchBuilderTest, ReuseAcrossBatchesKeepsEveryBatchExact) {
  const auto kinds = call_kinds();
  std::mt19937_64 random(301);
  BatchBuilder builder(256);
  for (uint64_t round = 0; round < 300; ++round) {
    if (round % 5 == 4) {
      // A plain batch after dirty ones: byte-identical to a fresh builder's, so every word the
      // previous batches wrote was zeroed again.
      const uint32_t count = 1 + static_cast<uint32_t>(random() % 256);
      add_pings(builder, round, count);
      const Message message = join(builder.finish());
      const auto reference = reference_pings(round, count);
      ASSERT_EQ(message.size(), reference.size()) << round;
      ASSERT_EQ(std::memcmp(message.bytes().data(), reference.data(), reference.size()), 0)
          << round;
      continue;
    }
    builder.reset(round);
    const uint32_t count = 1 + static_cast<uint32_t>(random() % 256);
    std::vector<std::pair<size_t, size_t>> added;  // (kind, blob bytes)
    for (uint32_t i = 0; i < count; ++i) {
      const size_t kind = random() % kinds.size();
      const size_t blob = random() % 4 == 0 ? random() % 32764 : random() % 64;
      fill(builder.add_call(), kinds[kind], round * 1000 + i, blob);
      added.emplace_back(kind, blob);
    }
    if (round % 7 == 3) continue;  // abandoned without finish(): reset must still clean up
    const Message message = join(builder.finish());
    const Status status =
        read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) {
          EXPECT_EQ(batch.getFirstSeq(), round);
          const auto calls = batch.getCalls();
          EXPECT_EQ(calls.size(), count);
          for (uint32_t i = 0; i < count; ++i) {
            check(calls[i], kinds[added[i].first], round * 1000 + i, added[i].second);
          }
          return Status();
        });
    ASSERT_TRUE(status.ok()) << "round " << round << ": " << status;
  }
}

uint64_t allocations_for_batches(BatchBuilder& builder, int batches, bool with_params) {
  const std::string params(256, 'p');
  const uint64_t before = g_allocations.load();
  for (int b = 0; b < batches; ++b) {
    builder.reset(b);
    for (int i = 0; i < 64; ++i) {
      auto call = builder.add_call();
      if (with_params) {
        auto launch = call.initLaunchKernel();
        launch.setFunction(i);
        launch.setParams(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(params.data()),
                                             params.size()));
      } else {
        call.initPing().setValue(i);
      }
    }
    (void)builder.finish();
  }
  return g_allocations.load() - before;
}

TEST(BatchBuilderTest, SteadyStateAllocatesNothing) {
  BatchBuilder builder(64);
  allocations_for_batches(builder, 10, false);  // warm up
  EXPECT_EQ(allocations_for_batches(builder, 1000, false), 0u);
}

TEST(BatchBuilderTest, SecondSegmentCostsOnlyCapnpBookkeeping) {
  // Data and Text go to a second segment. Its memory is ours and reused, but capnp's
  // BuilderArena allocates its multi-segment bookkeeping per message: a few allocations per
  // batch, however many calls carry data.
  BatchBuilder builder(64);
  allocations_for_batches(builder, 10, true);
  const uint64_t per_batch = allocations_for_batches(builder, 100, true) / 100;
  std::cout << "allocations per batch with a second segment: " << per_batch << "\n";
  EXPECT_LE(per_batch, 6u);
  EXPECT_EQ(allocations_for_batches(builder, 100, true), 100 * per_batch);
}

}  // namespace
}  // namespace hiber::wire
