// The handshake's content as plain C++ values, and its encoding (wire/schema/handshake.capnp).
// I/O-free: frames go over the socket through wire/socket_frame.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "common/status.h"
#include "wire/channel_layout.h"
#include "wire/message.h"

namespace hiber::wire {

struct ProtocolVersion {
  uint16_t major = 0;
  uint16_t minor = 0;
};

// The version this build speaks (from handshake.capnp).
ProtocolVersion current_protocol_version();

struct Hello {
  ProtocolVersion version;
  std::string function_id;
  std::string auth_token;
  uint64_t requested_quota_bytes = 0;
  // (1.7) Which of the function's instances this process is; "": it names none.
  std::string instance;
  // (1.12) The token of a session to resume (SessionInfo::resume_token of an earlier hiberd);
  // "": a new session.
  std::string resume_token;
};

// A device range [va, va + bytes).
struct DeviceRange {
  uint64_t va = 0;
  uint64_t bytes = 0;
  bool operator==(const DeviceRange&) const = default;
};

struct Grant {
  uint64_t va_base = 0;
  uint64_t va_bytes = 0;
  uint64_t quota_bytes = 0;
  uint64_t allocation_granularity = 0;
  // The largest single allocation the session can be served (the quota, bounded by the smallest
  // GPU's pool); 0: not told (any size up to the quota is tried).
  uint64_t largest_allocation_bytes = 0;
};

struct DeviceInfo {
  uint32_t ordinal = 0;
  std::string name;
  std::vector<uint8_t> uuid;  // 16 bytes
  std::string pci_bus_id;
  uint64_t total_memory_bytes = 0;
  std::vector<int32_t> attributes;  // indexed by CUdevice_attribute; 0 where not known
};

// Everything a Welcome says.
struct SessionInfo {
  uint64_t session_id = 0;
  ProtocolVersion server_version;
  Grant grant;
  ChannelLayout layout;
  std::vector<DeviceInfo> devices;
  NodeConfig node;
  // (1.12) The token that resumes this session after hiberd restarts; "": it cannot be resumed.
  std::string resume_token;
  // This session resumed an earlier one (Hello.resume_token), and hiberd brought these blocks
  // back with their contents (a model's); any other block the client had is not in the session.
  bool resumed = false;
  std::vector<DeviceRange> restored;
};

// Client side.
Result<std::vector<std::byte>> encode_hello_frame(const Hello& hello);
// A Welcome becomes a SessionInfo; a Rejection becomes its own code and message (with
// "hiberd rejected the session: " in front); anything malformed becomes kInvalidValue.
Result<SessionInfo> decode_hello_reply(const Message& frame);

// A function id as every part takes it (a Hello, a registration, a control request): 1 to
// kMaxFunctionIdBytes printable ASCII bytes, so that no id carries a newline or an escape
// sequence into a log or a terminal. kInvalidValue "<what>: ..." otherwise.
Status check_function_id(std::string_view id, std::string_view what);

// An instance key as every part takes it: empty (none), or 1 to kMaxInstanceKeyBytes printable
// ASCII bytes. kInvalidValue "<what>: ..." otherwise.
Status check_instance_key(std::string_view key, std::string_view what);

// A name a client gives (a kernel's) and hiberd may log or echo: 1 to `max_bytes` printable
// ASCII bytes, for the same reason. kInvalidValue "<what>: ..." naming `kind` otherwise.
Status check_printable_name(std::string_view name, size_t max_bytes, std::string_view kind,
                            std::string_view what);

// Server side. decode_hello checks every field against wire/limits.h; it does not judge the
// version or the token (the server does, so it can say why it refuses).
Result<Hello> decode_hello(const Message& frame);
Result<std::vector<std::byte>> encode_welcome_frame(const SessionInfo& session);
Result<std::vector<std::byte>> encode_rejection_frame(const Status& why);

}  // namespace hiber::wire
