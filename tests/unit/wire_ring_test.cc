// The SPSC ring: ordering, wrap-around, back-pressure, fragmentation, and a consumer that
// survives any corruption a hostile producer can write.
#include "wire/ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace hiber::wire {
namespace {

using namespace std::chrono_literals;

// A ring in private page-aligned memory: the header page, then the data.
class TestRing {
 public:
  explicit TestRing(uint64_t capacity, uint64_t max_message_bytes = 1 << 20)
      : memory_(static_cast<std::byte*>(std::aligned_alloc(4096, 4096 + capacity))) {
    std::memset(memory_, 0, 4096 + capacity);
    view_ = RingView{reinterpret_cast<RingHeader*>(memory_), memory_ + 4096, capacity,
                     max_message_bytes};
    init_ring(view_);
  }
  ~TestRing() { std::free(memory_); }

  RingView view() const { return view_; }
  RingHeader& header() { return *view_.header; }

  // Writes a raw record at ring offset `offset` (for forging).
  void put(uint64_t offset, uint32_t length, uint32_t flags,
           std::span<const std::byte> payload = {}) {
    const RecordHeader h{length, flags};
    std::memcpy(view_.data + offset, &h, sizeof(h));
    if (!payload.empty())
      std::memcpy(view_.data + offset + sizeof(h), payload.data(), payload.size());
  }
  void publish(uint64_t tail) { view_.header->tail.store(tail); }

 private:
  std::byte* memory_;
  RingView view_;
};

// Deterministic content for message `index` of `size` bytes.
std::vector<std::byte> content(uint64_t index, size_t size) {
  std::vector<std::byte> bytes(size);
  uint64_t x = index * 0x9e3779b97f4a7c15ull + size;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return bytes;
}

Status write_all(RingProducer& producer, std::span<const std::byte> bytes) {
  const std::span<const std::byte> pieces[] = {bytes};
  return producer.write(pieces, [] { return true; });
}

bool same(const Message& message, const std::vector<std::byte>& expected) {
  return message.size() == expected.size() &&
         std::memcmp(message.bytes().data(), expected.data(), expected.size()) == 0;
}

TEST(RingTest, WrapsAroundAtEveryAlignment) {
  TestRing ring(4096);
  RingProducer producer(ring.view());
  RingConsumer consumer(ring.view());
  std::set<uint64_t> record_offsets;
  Message message;
  // Random sizes move record starts through every 8-byte slot, and records of up to a quarter
  // of the ring need padding before them at many offsets.
  std::mt19937_64 random(301);
  for (uint64_t i = 0; i < 20000; ++i) {
    const size_t size = 1 + random() % 1000;
    record_offsets.insert(ring.header().tail.load() % 4096);
    const auto bytes = content(i, size);
    ASSERT_TRUE(write_all(producer, bytes).ok());
    if (i % 3 == 2) continue;  // sometimes let two messages queue up
    for (int k = 0; k < (i % 3 == 1 ? 2 : 1) && consumer.has_data(); ++k) {
      ASSERT_TRUE(consumer.try_read(message).ok());
    }
  }
  // Every 8-byte slot but 8 and 16: records restart at 0 after padding, and the smallest
  // record (header, length, one byte of data) is 24 bytes.
  for (uint64_t o = 0; o < 4096; o += 8) {
    EXPECT_EQ(record_offsets.count(o), o == 8 || o == 16 ? 0u : 1u) << "offset " << o;
  }
}

TEST(RingTest, ContentSurvivesWrapAround) {
  TestRing ring(4096);
  RingProducer producer(ring.view());
  RingConsumer consumer(ring.view());
  Message message;
  for (uint64_t i = 0; i < 3000; ++i) {
    const auto bytes = content(i, 1 + (i * 53) % 1500);  // some fragmented
    ASSERT_TRUE(write_all(producer, bytes).ok());
    ASSERT_TRUE(consumer.try_read(message).ok()) << i;
    ASSERT_TRUE(same(message, bytes)) << "message " << i;
  }
  EXPECT_EQ(consumer.try_read(message).code(), ErrorCode::kNotReady);
}

TEST(RingTest, LargeMessagesAreCutIntoQuarterRingRecords) {
  // The example in docs/wire-format.md.
  TestRing ring(4096);
  RingProducer producer(ring.view());
  const auto bytes = content(3, 3000);
  ASSERT_TRUE(write_all(producer, bytes).ok());
  const auto header_at = [&](uint64_t offset) {
    RecordHeader h;
    std::memcpy(&h, ring.view().data + offset, sizeof(h));
    return std::make_pair(h.length, h.flags);
  };
  EXPECT_EQ(header_at(0), std::make_pair(8u + 1008u, uint32_t{kRecordFirst}));
  EXPECT_EQ(header_at(1024), std::make_pair(1016u, 0u));
  EXPECT_EQ(header_at(2048), std::make_pair(976u, uint32_t{kRecordLast}));
  EXPECT_EQ(ring.header().tail.load(), 2048u + 8 + 976);
  RingConsumer consumer(ring.view());
  Message message;
  ASSERT_TRUE(consumer.try_read(message).ok());
  EXPECT_TRUE(same(message, bytes));
}

TEST(RingTest, GatherWritesConcatenatePieces) {
  TestRing ring(4096);
  RingProducer producer(ring.view());
  RingConsumer consumer(ring.view());
  const auto bytes = content(1, 3000);
  const std::span<const std::byte> all(bytes);
  const std::span<const std::byte> pieces[] = {all.subspan(0, 5), all.subspan(5, 0),
                                               all.subspan(5, 1500), all.subspan(1505)};
  std::thread reader([&] {
    Message message;
    ASSERT_TRUE(consumer
                    .read(
                        message, [] { return false; }, 10s)
                    .ok());
    EXPECT_TRUE(same(message, bytes));
  });
  ASSERT_TRUE(producer.write(pieces, [] { return true; }).ok());
  reader.join();
}

// A slow consumer: the producer fills the ring and must wait; nothing is lost or reordered.
TEST(RingTest, FullRingBlocksTheProducerWithoutLoss) {
  TestRing ring(4096);
  constexpr uint64_t kMessages = 3000;
  std::atomic<uint64_t> max_used{0};
  std::thread consumer_thread([&] {
    RingConsumer consumer(ring.view());
    Message message;
    for (uint64_t i = 0; i < kMessages; ++i) {
      const uint64_t used = ring.header().tail.load() - ring.header().head.load();
      if (used > max_used) max_used = used;
      if (i % 200 == 0) std::this_thread::sleep_for(2ms);
      ASSERT_TRUE(consumer
                      .read(
                          message, [] { return false; }, 10s)
                      .ok())
          << i;
      ASSERT_TRUE(same(message, content(i, 1 + (i * 7919) % 900))) << "message " << i;
    }
  });
  RingProducer producer(ring.view());
  for (uint64_t i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(write_all(producer, content(i, 1 + (i * 7919) % 900)).ok());
  }
  consumer_thread.join();
  EXPECT_GT(max_used.load(), 4096u / 2) << "the ring never filled up";
}

TEST(RingTest, MessageLargerThanTheRingGoesThroughInFragments) {
  TestRing ring(4096, 64 << 10);
  const auto big = content(42, 3 * 4096 + 123);
  const auto small = content(43, 10);
  std::thread consumer_thread([&] {
    RingConsumer consumer(ring.view());
    Message message;
    for (int round = 0; round < 20; ++round) {
      ASSERT_TRUE(consumer
                      .read(
                          message, [] { return false; }, 10s)
                      .ok());
      ASSERT_TRUE(same(message, big)) << round;
      ASSERT_TRUE(consumer
                      .read(
                          message, [] { return false; }, 10s)
                      .ok());
      ASSERT_TRUE(same(message, small)) << round;
    }
  });
  RingProducer producer(ring.view());
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(write_all(producer, big).ok());
    ASSERT_TRUE(write_all(producer, small).ok());
  }
  consumer_thread.join();
}

TEST(RingTest, MessageAboveTheLimitIsRejectedAndNothingIsWritten) {
  TestRing ring(4096, 1000);
  RingProducer producer(ring.view());
  RingConsumer consumer(ring.view());
  const Status status = write_all(producer, content(1, 1001));
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("exceeds the channel's limit of 1000"), std::string::npos)
      << status;
  EXPECT_EQ(ring.header().tail.load(), 0u);
  EXPECT_EQ(write_all(producer, {}).code(), ErrorCode::kInvalidValue);

  const auto fits = content(2, 1000);
  ASSERT_TRUE(write_all(producer, fits).ok());
  Message message;
  ASSERT_TRUE(consumer.try_read(message).ok());
  EXPECT_TRUE(same(message, fits));
}

TEST(RingTest, ManyChannelsAtOnce) {
  constexpr int kPairs = 8;
  constexpr uint64_t kMessages = 1500;
  std::vector<std::unique_ptr<TestRing>> rings;
  for (int i = 0; i < kPairs; ++i) rings.push_back(std::make_unique<TestRing>(8192));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kPairs; ++p) {
    threads.emplace_back([&, p] {
      RingProducer producer(rings[p]->view());
      for (uint64_t i = 0; i < kMessages; ++i) {
        if (!write_all(producer, content(i * kPairs + p, 1 + (i * 131 + p) % 3000)).ok()) ++bad;
      }
    });
    threads.emplace_back([&, p] {
      RingConsumer consumer(rings[p]->view());
      Message message;
      for (uint64_t i = 0; i < kMessages; ++i) {
        if (!consumer
                 .read(
                     message, [] { return false; }, 20s)
                 .ok() ||
            !same(message, content(i * kPairs + p, 1 + (i * 131 + p) % 3000))) {
          ++bad;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(RingTest, ReadTimesOutAndIsCancelled) {
  TestRing ring(4096);
  RingConsumer consumer(ring.view());
  Message message;
  EXPECT_EQ(consumer
                .read(
                    message, [] { return false; }, 10ms)
                .code(),
            ErrorCode::kTimeout);
  EXPECT_EQ(consumer
                .read(
                    message, [] { return true; }, 10s)
                .code(),
            ErrorCode::kDeinitialized);
}

TEST(RingTest, BlockedProducerStopsWhenItCannotContinue) {
  TestRing ring(4096);
  RingProducer producer(ring.view());
  const auto bytes = content(1, 1000);
  // Full: not even one more record of this size fits (1016 bytes, no padding needed).
  while (producer.free_bytes() >= 1016) ASSERT_TRUE(write_all(producer, bytes).ok());
  std::atomic<bool> go_on{true};
  std::thread stopper([&] {
    std::this_thread::sleep_for(30ms);
    go_on = false;
    ring_always(ring.header().not_full);
  });
  const std::span<const std::byte> pieces[] = {bytes};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {
    const Status status = producer.write(pieces, [&] { return go_on.load(); });
    if (!status.ok()) {
      EXPECT_EQ(status.code(), ErrorCode::kDeinitialized);
      break;
    }
  }
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(RingTest, ProducerInterruptRunsWhileWaiting) {
  TestRing ring(4096);
  RingProducer producer(ring.view());
  const auto bytes = content(1, 1000);
  // Full: not even one more record of this size fits (1016 bytes, no padding needed).
  while (producer.free_bytes() >= 1016) ASSERT_TRUE(write_all(producer, bytes).ok());
  // The ring stays full until while_waiting() consumes: it must run promptly once interrupt()
  // says so, not only after a sleep slice.
  RingConsumer consumer(ring.view());
  std::atomic<bool> poke{false};
  int drained = 0;
  std::atomic<std::chrono::steady_clock::time_point> poked_at{};
  std::thread poker([&] {
    std::this_thread::sleep_for(20ms);
    poked_at = std::chrono::steady_clock::now();
    poke = true;
    ring_always(ring.header().not_full);
  });
  const std::span<const std::byte> pieces[] = {bytes};
  ASSERT_TRUE(producer
                  .write(
                      pieces, [] { return true; },
                      [&] {
                        if (!poke) return;
                        Message m;
                        while (consumer.try_read(m).ok()) ++drained;
                      },
                      [&] { return poke.load(); })
                  .ok());
  poker.join();
  EXPECT_GT(drained, 0);
  // Measured from the poke, so a slow start of the poker thread on a loaded machine is not
  // counted.
  EXPECT_LT(std::chrono::steady_clock::now() - poked_at.load(), kProducerWaitSlice);
}

// --- A hostile producer -----------------------------------------------------------------

class CorruptRingTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kCapacity = 4096;
  CorruptRingTest() : ring_(kCapacity, 10000), consumer_(ring_.view()) {}

  // Expects the consumer to report corruption mentioning `what`, and to keep reporting it.
  void expect_corrupt(std::string_view what) {
    const Status first = consumer_.try_read(message_);
    EXPECT_EQ(first.code(), ErrorCode::kInvalidValue) << first;
    EXPECT_NE(first.message().find("corrupt ring"), std::string::npos) << first;
    EXPECT_NE(first.message().find(what), std::string::npos) << first;
    EXPECT_EQ(consumer_.try_read(message_), first) << "corruption must be sticky";
  }

  // A valid first fragment of a `total`-byte message carrying `chunk` bytes, at `offset`.
  void put_first(uint64_t offset, uint64_t total, uint32_t chunk, uint32_t flags = kRecordFirst) {
    std::vector<std::byte> payload(8 + chunk);
    std::memcpy(payload.data(), &total, 8);
    ring_.put(offset, 8 + chunk, flags, payload);
  }

  TestRing ring_;
  RingConsumer consumer_;
  Message message_;
};

TEST_F(CorruptRingTest, TailMoreThanTheCapacityAhead) {
  ring_.publish(kCapacity + 8);
  expect_corrupt("producer's position 4104");
}

TEST_F(CorruptRingTest, TailBehindTheHead) {
  ring_.put(0, 8, kRecordFirst | kRecordLast);  // not even read
  ring_.publish(uint64_t{0} - 8);
  expect_corrupt("not a record boundary");
}

TEST_F(CorruptRingTest, TailNotARecordBoundary) {
  ring_.publish(12);
  expect_corrupt("producer's position 12");
}

TEST_F(CorruptRingTest, UnknownFlags) {
  put_first(0, 8, 8, kRecordFirst | kRecordLast | (1u << 7));
  ring_.publish(24);
  expect_corrupt("unknown flags");
}

TEST_F(CorruptRingTest, PaddingWithALength) {
  ring_.put(0, 16, kRecordPadding);
  ring_.publish(kCapacity);
  expect_corrupt("padding record at position 0");
}

TEST_F(CorruptRingTest, PaddingMixedWithOtherFlags) {
  ring_.put(0, 0, kRecordPadding | kRecordFirst);
  ring_.publish(kCapacity);
  expect_corrupt("expected only the padding flag");
}

TEST_F(CorruptRingTest, PaddingLongerThanARecordCouldNeed) {
  ring_.put(0, 0, kRecordPadding);  // would skip the whole ring
  ring_.publish(kCapacity);
  expect_corrupt("padding is only needed before a record");
}

TEST_F(CorruptRingTest, PaddingPastThePublishedBytes) {
  // Honest records up to near the end, then padding whose extent was not published.
  RingProducer producer(ring_.view());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(write_all(producer, content(i, 1000 - 8)).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(consumer_.try_read(message_).ok());
  const uint64_t tail = ring_.header().tail.load();  // 4 records of 1008 bytes: 64 left to the end
  ASSERT_EQ(tail, 4032u);
  ring_.put(tail % kCapacity, 0, kRecordPadding);
  ring_.publish(tail + 8);
  expect_corrupt("only 8 bytes are published");
}

TEST_F(CorruptRingTest, RecordLargerThanAQuarterOfTheRing) {
  put_first(0, 2000, 2000 - 8, kRecordFirst | kRecordLast);
  ring_.publish(2016);
  expect_corrupt("records are at most 1024 bytes");
}

TEST_F(CorruptRingTest, RecordCrossingTheEnd) {
  RingProducer producer(ring_.view());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(write_all(producer, content(i, 1000 - 8)).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(consumer_.try_read(message_).ok());
  ring_.put(4032, 108, kRecordFirst | kRecordLast);  // a 120-byte record from 4032: past 4096
  ring_.publish(4032 + 120);
  expect_corrupt("crosses the end of the ring");
}

TEST_F(CorruptRingTest, RecordPastThePublishedBytes) {
  put_first(0, 100, 100, kRecordFirst | kRecordLast);
  ring_.publish(64);
  expect_corrupt("extends past the 64 published bytes");
}

TEST_F(CorruptRingTest, FirstRecordTooShortForTheLength) {
  ring_.put(0, 8, kRecordFirst | kRecordLast);
  ring_.publish(16);
  expect_corrupt("too few for the message length");
}

TEST_F(CorruptRingTest, MessageAboveTheLimit) {
  put_first(0, 20000, 100);
  ring_.publish(8 + 8 + 104);
  expect_corrupt("claims 20000 bytes; the limit is 10000");
}

TEST_F(CorruptRingTest, WholeMessageWithTheWrongLength) {
  put_first(0, 99, 100, kRecordFirst | kRecordLast);
  ring_.publish(8 + 8 + 104);
  expect_corrupt("claims 99 bytes but its only record carries 100");
}

TEST_F(CorruptRingTest, FirstFragmentHoldingTheWholeMessage) {
  put_first(0, 100, 100);
  ring_.publish(8 + 8 + 104);
  expect_corrupt("claims 100 bytes but its first fragment carries 100");
}

TEST_F(CorruptRingTest, FragmentWithoutAFirst) {
  ring_.put(0, 16, kRecordLast);
  ring_.publish(24);
  expect_corrupt("continues no message");
}

TEST_F(CorruptRingTest, NewMessageInsideAnother) {
  put_first(0, 1000, 100);
  put_first(120, 50, 50, kRecordFirst | kRecordLast);
  ring_.publish(120 + 72);
  expect_corrupt("a message starts at position 120 after 100 of the previous message's 1000");
}

TEST_F(CorruptRingTest, EmptyFragment) {
  put_first(0, 1000, 100);
  ring_.put(120, 0, 0);
  ring_.publish(128);
  expect_corrupt("empty fragment at position 120");
}

TEST_F(CorruptRingTest, LastFragmentShortOfTheTotal) {
  put_first(0, 1000, 100);
  ring_.put(120, 200, kRecordLast);
  ring_.publish(120 + 208);
  expect_corrupt("message ends at position 120 after 300 of its 1000 bytes");
}

TEST_F(CorruptRingTest, FragmentsExceedingTheTotal) {
  put_first(0, 150, 100);
  ring_.put(120, 200, kRecordLast);
  ring_.publish(120 + 208);
  expect_corrupt("brings the message to 300 bytes, more than its 150");
}

TEST_F(CorruptRingTest, CompleteMessageNotMarkedLast) {
  put_first(0, 300, 100);
  ring_.put(120, 200, 0);
  ring_.publish(120 + 208);
  expect_corrupt("completes the message's 300 bytes but is not marked last");
}

TEST_F(CorruptRingTest, FragmentedMessageArrivesInPieces) {
  // Not corruption: a message whose fragments are published one at a time.
  const auto bytes = content(9, 150);
  std::vector<std::byte> first(8 + 100);
  const uint64_t total = 150;
  std::memcpy(first.data(), &total, 8);
  std::memcpy(first.data() + 8, bytes.data(), 100);
  ring_.put(0, 108, kRecordFirst, first);
  ring_.publish(120);
  EXPECT_EQ(consumer_.try_read(message_).code(), ErrorCode::kNotReady);
  EXPECT_EQ(ring_.header().head.load(), 120u) << "the fragment is consumed at once";
  ring_.put(120, 50, kRecordLast, std::span(bytes).subspan(100));
  ring_.publish(120 + 64);
  ASSERT_TRUE(consumer_.try_read(message_).ok());
  EXPECT_TRUE(same(message_, bytes));
}

TEST_F(CorruptRingTest, RandomGarbageNeverCrashes) {
  std::mt19937_64 random(301);
  for (int round = 0; round < 2000; ++round) {
    TestRing ring(kCapacity, 10000);
    RingConsumer consumer(ring.view());
    auto* words = reinterpret_cast<uint64_t*>(ring.view().data);
    for (uint64_t i = 0; i < kCapacity / 8; ++i) {
      // Mostly small values, so lengths and flags are sometimes plausible.
      words[i] = random() % 4 == 0 ? random() : random() % 64 + ((random() % 8) << 32);
    }
    ring.publish((random() % (kCapacity / 8 + 2)) * 8);
    Message message;
    for (int reads = 0; reads < 20; ++reads) {
      const Status status = consumer.try_read(message);
      if (status.code() == ErrorCode::kInvalidValue || status.code() == ErrorCode::kNotReady) break;
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_LE(message.size(), 10000u);
    }
  }
}

TEST(RingProducerTest, ImpossibleConsumerPositionIsReported) {
  TestRing ring(4096);
  RingProducer producer(ring.view());
  ring.header().head.store(64);  // ahead of the producer's 0
  EXPECT_EQ(producer.free_bytes(), 0u);
  const Status status = write_all(producer, content(1, 10));
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue) << status;
  EXPECT_NE(status.message().find("consumer's position 64"), std::string::npos) << status;
}

}  // namespace
}  // namespace hiber::wire
