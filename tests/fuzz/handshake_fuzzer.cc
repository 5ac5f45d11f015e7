// The handshake (wire/handshake.h) from socket bytes: hiberd's side (a FrameReader, then
// decode_hello, as Daemon::on_hello does) and the client's side (decode_hello_reply, as
// ClientChannel::connect does) read the same frame.
//
// Promises checked: neither side crashes, leaks or hangs; a Hello that decodes satisfies every
// rule a client's encoder enforces, and re-encodes to a frame that decodes to the same Hello;
// a Welcome that decodes re-encodes to a frame that is a fixed point (decode, encode gives the
// same bytes); a Rejection is never a success.
#include "tests/fuzz/fuzz_frames.h"
#include "wire/handshake.h"
#include "wire/limits.h"

namespace hiber {
namespace {

void check_hello(const wire::Message& frame) {
  Result<wire::Hello> hello = wire::decode_hello(frame);
  if (!hello.ok()) {
    CHECK_EQ(static_cast<int>(hello.status().code()), static_cast<int>(ErrorCode::kInvalidValue))
        << hello.status();
    return;
  }
  CHECK(wire::check_function_id(hello->function_id, "fuzz").ok());
  CHECK_LE(hello->auth_token.size(), wire::kMaxAuthTokenBytes);
  Result<std::vector<std::byte>> again = wire::encode_hello_frame(*hello);
  CHECK(again.ok()) << "a Hello hiberd accepts cannot be encoded: " << again.status();
  Result<wire::Hello> back = wire::decode_hello(fuzz::payload_of(*again));
  CHECK(back.ok()) << back.status();
  CHECK_EQ(back->version.major, hello->version.major);
  CHECK_EQ(back->version.minor, hello->version.minor);
  CHECK_EQ(back->function_id, hello->function_id);
  CHECK_EQ(back->auth_token, hello->auth_token);
  CHECK_EQ(back->requested_quota_bytes, hello->requested_quota_bytes);
}

void check_reply(const wire::Message& frame) {
  Result<wire::SessionInfo> reply = wire::decode_hello_reply(frame);
  if (!reply.ok()) {
    CHECK(!reply.status().ok());
    return;
  }
  Result<std::vector<std::byte>> once = wire::encode_welcome_frame(*reply);
  if (!once.ok()) {
    // Re-encoding may spend more words than a compact sender did, and then not fit a frame.
    CHECK(once.status().message().find("frame limit") != std::string::npos) << once.status();
    return;
  }
  Result<wire::SessionInfo> back = wire::decode_hello_reply(fuzz::payload_of(*once));
  CHECK(back.ok()) << "a re-encoded Welcome does not decode: " << back.status();
  Result<std::vector<std::byte>> twice = wire::encode_welcome_frame(*back);
  CHECK(twice.ok()) << twice.status();
  CHECK(fuzz::same_bytes(*once, *twice)) << "a Welcome changed through decode and encode";
}

}  // namespace
}  // namespace hiber

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hiber::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hiber::wire::FrameReader whole, pieces;
  const hiber::wire::Message* frame =
      hiber::fuzz::read_frame(hiber::fuzz::bytes_of(data, size), whole, pieces);
  if (frame == nullptr) return 0;
  hiber::check_hello(*frame);
  hiber::check_reply(*frame);
  return 0;
}
