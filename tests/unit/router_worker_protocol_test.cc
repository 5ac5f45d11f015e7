// router/worker_protocol.h: frames round-trip byte for byte, however the bytes arrive, and
// malformed lengths or headers make the stream unusable.
#include "router/worker_protocol.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace hiber::router {
namespace {

using nlohmann::json;

// The prefix written by hand (the reference for the encoder's layout).
std::string prefix(uint32_t header_bytes, uint64_t body_bytes) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(header_bytes >> (8 * i)));
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(body_bytes >> (8 * i)));
  return out;
}

std::string binary_body() {
  std::string body;
  for (int i = 0; i < 1000; ++i) body.push_back(static_cast<char>(i * 7));  // zeros included
  return body;
}

TEST(WorkerProtocol, EncodesTheDocumentedLayout) {
  const json header = {{"type", "hello"}, {"protocol", 1}};
  const std::string text = header.dump();
  const std::string body("a\0b", 3);
  EXPECT_EQ(encode_worker_frame(header, body), prefix(text.size(), 3) + text + body);
}

TEST(WorkerProtocol, RoundTripsInOneFeed) {
  const json header = {
      {"type", "invoke"}, {"id", "r-1"}, {"content_type", "x/y"}, {"deadline_ms", 250}};
  const std::string body = binary_body();
  const std::string frame = encode_worker_frame(header, body);
  WorkerFrameReader reader;
  EXPECT_EQ(reader.feed(frame), frame.size());
  ASSERT_TRUE(reader.error().ok()) << reader.error();
  ASSERT_TRUE(reader.complete());
  WorkerFrame out = reader.take();
  EXPECT_EQ(out.header, header);
  EXPECT_EQ(out.body, body);
  EXPECT_FALSE(reader.complete());
}

TEST(WorkerProtocol, RoundTripsByteAtATime) {
  WorkerFrameReader reader;
  for (int round = 0; round < 3; ++round) {  // the reader is reused after take()
    const json header = {{"type", "result"}, {"id", std::to_string(round)}, {"ok", true}};
    const std::string body = round == 1 ? std::string() : binary_body();
    const std::string frame = encode_worker_frame(header, body);
    for (size_t i = 0; i < frame.size(); ++i) {
      ASSERT_FALSE(reader.complete()) << "complete before byte " << i;
      ASSERT_EQ(reader.feed(std::string_view(frame).substr(i, 1)), 1u) << "byte " << i;
      ASSERT_TRUE(reader.error().ok()) << reader.error();
    }
    ASSERT_TRUE(reader.complete());
    WorkerFrame out = reader.take();
    EXPECT_EQ(out.header, header);
    EXPECT_EQ(out.body, body);
  }
}

TEST(WorkerProtocol, StopsAfterOneFrameOfTwoInABuffer) {
  const json first = {{"type", "invoke"}, {"id", "a"}};
  const json second = {{"type", "invoke"}, {"id", "b"}};
  const std::string a = encode_worker_frame(first, "first body");
  const std::string b = encode_worker_frame(second, std::string(5, '\0'));
  const std::string both = a + b;
  WorkerFrameReader reader;
  const size_t used = reader.feed(both);
  EXPECT_EQ(used, a.size());
  ASSERT_TRUE(reader.complete());
  EXPECT_EQ(reader.feed(std::string_view(both).substr(used)), 0u) << "consumed past a frame";
  WorkerFrame one = reader.take();
  EXPECT_EQ(one.header, first);
  EXPECT_EQ(one.body, "first body");
  EXPECT_EQ(reader.feed(std::string_view(both).substr(used)), b.size());
  ASSERT_TRUE(reader.complete());
  WorkerFrame two = reader.take();
  EXPECT_EQ(two.header, second);
  EXPECT_EQ(two.body, std::string(5, '\0'));
}

TEST(WorkerProtocol, AcceptsTheLargestHeader) {
  // A header of exactly kMaxWorkerHeaderBytes: {"p":"xxx..."}.
  const std::string padding(kMaxWorkerHeaderBytes - 8, 'x');
  const json header = {{"p", padding}};
  ASSERT_EQ(header.dump().size(), kMaxWorkerHeaderBytes);
  const std::string frame = encode_worker_frame(header, "");
  WorkerFrameReader reader;
  EXPECT_EQ(reader.feed(frame), frame.size());
  ASSERT_TRUE(reader.error().ok()) << reader.error();
  ASSERT_TRUE(reader.complete());
  EXPECT_EQ(reader.take().header, header);
}

TEST(WorkerProtocol, RejectsOversizeHeaderLength) {
  WorkerFrameReader reader;
  reader.feed(prefix(kMaxWorkerHeaderBytes + 1, 0) + "{}");
  EXPECT_EQ(reader.error().code(), ErrorCode::kInvalidValue);
  EXPECT_FALSE(reader.complete());
  EXPECT_EQ(reader.feed("{}"), 0u) << "a failed stream must consume nothing";
}

TEST(WorkerProtocol, RejectsEmptyHeader) {
  WorkerFrameReader reader;
  reader.feed(prefix(0, 0));
  EXPECT_EQ(reader.error().code(), ErrorCode::kInvalidValue);
}

TEST(WorkerProtocol, RejectsOversizeBodyLengthBeforeTheBodyArrives) {
  WorkerFrameReader reader;
  EXPECT_EQ(reader.feed(prefix(2, kMaxWorkerBodyBytes + 1)), kWorkerPrefixBytes);
  EXPECT_EQ(reader.error().code(), ErrorCode::kInvalidValue);
  EXPECT_FALSE(reader.complete());
}

TEST(WorkerProtocol, AcceptsTheLargestBodyLength) {
  WorkerFrameReader reader;
  reader.feed(prefix(2, kMaxWorkerBodyBytes) + "{}abc");
  EXPECT_TRUE(reader.error().ok()) << reader.error();
  EXPECT_FALSE(reader.complete());
}

TEST(WorkerProtocol, RejectsHeadersThatAreNotJsonObjects) {
  for (const std::string text : {"[1,2]", "\"hello\"", "42", "null", "{\"a\":", "not json"}) {
    WorkerFrameReader reader;
    reader.feed(prefix(text.size(), 3) + text + "abc");
    EXPECT_EQ(reader.error().code(), ErrorCode::kInvalidValue) << text;
    EXPECT_FALSE(reader.complete()) << text;
  }
}

TEST(WorkerProtocol, ReplacesInvalidUtf8InsteadOfThrowing) {
  const json header = {{"type", "result"}, {"error", std::string("bad \xff byte")}};
  const std::string frame = encode_worker_frame(header, "");
  WorkerFrameReader reader;
  reader.feed(frame);
  ASSERT_TRUE(reader.complete()) << reader.error();
  EXPECT_EQ(reader.take().header["error"], "bad \xEF\xBF\xBD byte");
}

}  // namespace
}  // namespace hiber::router
