#include "wire/handshake.h"

#include <capnp/message.h>

#include <bit>

#include "common/node_config_capnp.h"
#include "wire/limits.h"
#include "wire/schema/handshake.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::wire {
namespace {

Status invalid(std::string_view what, const std::string& reason) {
  return error(ErrorCode::kInvalidValue, what, ": ", reason);
}

// The same rules on both sides, so a client learns of a bad value before the server refuses it.
Status check_hello(const Hello& hello, std::string_view what) {
  HIBER_RETURN_IF_ERROR(check_function_id(hello.function_id, what));
  HIBER_RETURN_IF_ERROR(check_instance_key(hello.instance, what));
  if (hello.auth_token.size() > kMaxAuthTokenBytes) {
    return invalid(what, str_cat("the auth token has ", hello.auth_token.size(), " bytes; at most ",
                                 kMaxAuthTokenBytes, " are allowed"));
  }
  if (!hello.resume_token.empty()) {
    HIBER_RETURN_IF_ERROR(
        check_printable_name(hello.resume_token, kMaxResumeTokenBytes, "resume token", what));
  }
  return Status();
}

Status check_session(const SessionInfo& session, std::string_view what) {
  const Grant& grant = session.grant;
  if (grant.va_base + grant.va_bytes < grant.va_base) {
    return invalid(what, str_cat("the granted address range [", grant.va_base, ", +",
                                 grant.va_bytes, ") overflows"));
  }
  if (!std::has_single_bit(grant.allocation_granularity)) {
    return invalid(what, str_cat("allocation granularity ", grant.allocation_granularity,
                                 " is not a power of two"));
  }
  if (session.devices.size() > kMaxDevices) {
    return invalid(what, str_cat(session.devices.size(), " devices; at most ", kMaxDevices));
  }
  if (session.resume_token.size() > kMaxResumeTokenBytes) {
    return invalid(what, str_cat("a resume token of ", session.resume_token.size(),
                                 " bytes; at most ", kMaxResumeTokenBytes));
  }
  if (session.restored.size() > kMaxRestoredBlocks) {
    return invalid(what, str_cat(session.restored.size(), " restored blocks; at most ",
                                 kMaxRestoredBlocks));
  }
  for (const DeviceRange& block : session.restored) {
    if (block.bytes == 0 || block.va < grant.va_base ||
        block.va - grant.va_base > grant.va_bytes ||
        block.bytes > grant.va_bytes - (block.va - grant.va_base)) {
      return invalid(what, str_cat("restored block [", block.va, ", +", block.bytes,
                                   ") lies outside the granted address range"));
    }
  }
  for (const DeviceInfo& device : session.devices) {
    const std::string where = str_cat("device ", device.ordinal);
    if (device.uuid.size() != 16) {
      return invalid(what,
                     str_cat(where, " has a uuid of ", device.uuid.size(), " bytes instead of 16"));
    }
    if (device.name.size() > kMaxNameBytes || device.pci_bus_id.size() > kMaxNameBytes) {
      return invalid(what,
                     str_cat(where, " has a name or PCI bus id over ", kMaxNameBytes, " bytes"));
    }
    if (device.attributes.size() > kMaxDeviceAttributes) {
      return invalid(what, str_cat(where, " has ", device.attributes.size(),
                                   " attributes; at most ", kMaxDeviceAttributes));
    }
  }
  return Status();
}

ProtocolVersion version_from(proto::ProtocolVersion::Reader reader) {
  return ProtocolVersion{reader.getMajor(), reader.getMinor()};
}

void version_to(const ProtocolVersion& version, proto::ProtocolVersion::Builder builder) {
  builder.setMajor(version.major);
  builder.setMinor(version.minor);
}

std::string text(capnp::Text::Reader reader) { return std::string(reader.begin(), reader.size()); }

Status decode_welcome(proto::Welcome::Reader welcome, SessionInfo& out) {
  constexpr std::string_view kWhat = "hello reply";
  out.server_version = version_from(welcome.getVersion());
  out.session_id = welcome.getSessionId();

  const auto grant = welcome.getGrant();
  out.grant = Grant{grant.getVaBase(), grant.getVaBytes(), grant.getQuotaBytes(),
                    grant.getAllocationGranularity(), grant.getLargestAllocation()};

  const auto channel = welcome.getChannel();
  out.layout = ChannelLayout{
      .memfd_bytes = channel.getMemfdBytes(),
      .request_ring_offset = channel.getRequestRingOffset(),
      .request_ring_bytes = channel.getRequestRingBytes(),
      .completion_ring_offset = channel.getCompletionRingOffset(),
      .completion_ring_bytes = channel.getCompletionRingBytes(),
      .arena_offset = channel.getArenaOffset(),
      .arena_bytes = channel.getArenaBytes(),
      .max_message_bytes = channel.getMaxMessageBytes(),
  };

  // Sizes are checked before anything is copied, so a hostile count costs nothing.
  const auto devices = welcome.getDevices();
  if (devices.size() > kMaxDevices) {
    return invalid(kWhat, str_cat(devices.size(), " devices; at most ", kMaxDevices));
  }
  out.devices.clear();
  for (const auto device : devices) {
    if (device.getAttributes().size() > kMaxDeviceAttributes) {
      return invalid(kWhat,
                     str_cat("device ", device.getOrdinal(), " has ", device.getAttributes().size(),
                             " attributes; at most ", kMaxDeviceAttributes));
    }
    if (device.getName().size() > kMaxNameBytes || device.getPciBusId().size() > kMaxNameBytes ||
        device.getUuid().size() > kMaxNameBytes) {
      return invalid(kWhat, str_cat("device ", device.getOrdinal(), " has a field over ",
                                    kMaxNameBytes, " bytes"));
    }
    DeviceInfo& info = out.devices.emplace_back();
    info.ordinal = device.getOrdinal();
    info.name = text(device.getName());
    info.uuid.assign(device.getUuid().begin(), device.getUuid().end());
    info.pci_bus_id = text(device.getPciBusId());
    info.total_memory_bytes = device.getTotalMemoryBytes();
    info.attributes.reserve(device.getAttributes().size());
    for (const int32_t value : device.getAttributes()) info.attributes.push_back(value);
  }

  auto node = node_config_from_capnp(welcome.getNode());
  if (!node.ok()) return node.status().with_context(kWhat);
  out.node = std::move(node).value();

  const auto resume = welcome.getResume();
  if (resume.getToken().size() > kMaxResumeTokenBytes ||
      resume.getRestored().size() > kMaxRestoredBlocks) {
    return invalid(kWhat, str_cat("a resume token of ", resume.getToken().size(), " bytes or ",
                                  resume.getRestored().size(), " restored blocks exceeds its limit"));
  }
  out.resume_token = text(resume.getToken());
  out.resumed = resume.getResumed();
  out.restored.clear();
  for (const auto block : resume.getRestored())
    out.restored.push_back(DeviceRange{block.getVa(), block.getBytes()});
  return check_session(out, kWhat);
}

Status decode_rejection(proto::Rejection::Reader rejection, Status& out) {
  if (rejection.getCode() == 0) return invalid("hello reply", "a rejection with code 0 (success)");
  out = Status(static_cast<ErrorCode>(rejection.getCode()),
               "hiberd rejected the session: " + text(rejection.getMessage()));
  return Status();
}

}  // namespace

ProtocolVersion current_protocol_version() {
  return ProtocolVersion{proto::PROTOCOL_MAJOR, proto::PROTOCOL_MINOR};
}

Result<std::vector<std::byte>> encode_hello_frame(const Hello& hello) {
  HIBER_RETURN_IF_ERROR(check_hello(hello, "hello"));
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::Hello>();
  version_to(hello.version, root.initVersion());
  root.setFunctionId(hello.function_id);
  root.setAuthToken(capnp::Data::Reader(
      reinterpret_cast<const capnp::byte*>(hello.auth_token.data()), hello.auth_token.size()));
  root.setRequestedQuotaBytes(hello.requested_quota_bytes);
  if (!hello.instance.empty()) root.setInstance(hello.instance);
  if (!hello.resume_token.empty()) root.setResumeToken(hello.resume_token);
  return encode_frame(message);
}

Status check_printable_name(std::string_view name, size_t max_bytes, std::string_view kind,
                            std::string_view what) {
  if (name.empty()) return invalid(what, str_cat("the ", kind, " is empty"));
  if (name.size() > max_bytes) {
    return invalid(what, str_cat("the ", kind, " has ", name.size(), " bytes; at most ", max_bytes,
                                 " are allowed"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c > 0x7e) {
      return invalid(what,
                     str_cat("the ", kind, " has a non-printable byte ", int{c}, " at offset ", i));
    }
  }
  return Status();
}

Status check_function_id(std::string_view id, std::string_view what) {
  return check_printable_name(id, kMaxFunctionIdBytes, "function id", what);
}

Status check_instance_key(std::string_view key, std::string_view what) {
  if (key.empty()) return Status();
  return check_printable_name(key, kMaxInstanceKeyBytes, "instance key", what);
}

Result<Hello> decode_hello(const Message& frame) {
  Hello hello;
  HIBER_RETURN_IF_ERROR(read_message<proto::Hello>(frame, "hello", [&](proto::Hello::Reader in) {
    // Sizes first: nothing oversized is copied.
    if (in.getFunctionId().size() > kMaxFunctionIdBytes ||
        in.getAuthToken().size() > kMaxAuthTokenBytes ||
        in.getInstance().size() > kMaxInstanceKeyBytes ||
        in.getResumeToken().size() > kMaxResumeTokenBytes) {
      return invalid("hello", str_cat("function id of ", in.getFunctionId().size(),
                                      " bytes, auth token of ", in.getAuthToken().size(),
                                      " bytes or instance key of ", in.getInstance().size(),
                                      " bytes exceeds its limit (", kMaxFunctionIdBytes, ", ",
                                      kMaxAuthTokenBytes, ", ", kMaxInstanceKeyBytes, ")"));
    }
    hello.version = version_from(in.getVersion());
    hello.function_id = text(in.getFunctionId());
    hello.auth_token.assign(reinterpret_cast<const char*>(in.getAuthToken().begin()),
                            in.getAuthToken().size());
    hello.requested_quota_bytes = in.getRequestedQuotaBytes();
    hello.instance = std::string(in.getInstance().cStr(), in.getInstance().size());
    hello.resume_token = text(in.getResumeToken());
    return Status();
  }));
  HIBER_RETURN_IF_ERROR(check_hello(hello, "hello"));
  return hello;
}

Result<std::vector<std::byte>> encode_welcome_frame(const SessionInfo& session) {
  HIBER_RETURN_IF_ERROR(check_session(session, "welcome"));
  capnp::MallocMessageBuilder message;
  auto welcome = message.initRoot<proto::HelloReply>().initWelcome();
  version_to(session.server_version, welcome.initVersion());
  welcome.setSessionId(session.session_id);

  auto grant = welcome.initGrant();
  grant.setVaBase(session.grant.va_base);
  grant.setVaBytes(session.grant.va_bytes);
  grant.setQuotaBytes(session.grant.quota_bytes);
  grant.setAllocationGranularity(session.grant.allocation_granularity);
  grant.setLargestAllocation(session.grant.largest_allocation_bytes);

  auto channel = welcome.initChannel();
  const ChannelLayout& layout = session.layout;
  channel.setMemfdBytes(layout.memfd_bytes);
  channel.setRequestRingOffset(layout.request_ring_offset);
  channel.setRequestRingBytes(layout.request_ring_bytes);
  channel.setCompletionRingOffset(layout.completion_ring_offset);
  channel.setCompletionRingBytes(layout.completion_ring_bytes);
  channel.setArenaOffset(layout.arena_offset);
  channel.setArenaBytes(layout.arena_bytes);
  channel.setMaxMessageBytes(layout.max_message_bytes);

  auto devices = welcome.initDevices(static_cast<unsigned>(session.devices.size()));
  for (size_t i = 0; i < session.devices.size(); ++i) {
    const DeviceInfo& in = session.devices[i];
    auto out = devices[static_cast<unsigned>(i)];
    out.setOrdinal(in.ordinal);
    out.setName(in.name);
    out.setUuid(capnp::Data::Reader(in.uuid.data(), in.uuid.size()));
    out.setPciBusId(in.pci_bus_id);
    out.setTotalMemoryBytes(in.total_memory_bytes);
    auto attributes = out.initAttributes(static_cast<unsigned>(in.attributes.size()));
    for (size_t a = 0; a < in.attributes.size(); ++a)
      attributes.set(static_cast<unsigned>(a), in.attributes[a]);
  }
  node_config_to_capnp(session.node, welcome.initNode());
  auto resume = welcome.initResume();
  resume.setToken(session.resume_token);
  resume.setResumed(session.resumed);
  auto restored = resume.initRestored(static_cast<unsigned>(session.restored.size()));
  for (size_t i = 0; i < session.restored.size(); ++i) {
    restored[static_cast<unsigned>(i)].setVa(session.restored[i].va);
    restored[static_cast<unsigned>(i)].setBytes(session.restored[i].bytes);
  }
  return encode_frame(message);
}

Result<std::vector<std::byte>> encode_rejection_frame(const Status& why) {
  if (why.ok()) return Status(ErrorCode::kInvalidValue, "cannot reject a session with success");
  // Long messages are cut so the frame always fits.
  const std::string message = why.message().substr(0, kMaxNameBytes);
  capnp::MallocMessageBuilder builder;
  auto rejection = builder.initRoot<proto::HelloReply>().initRejected();
  rejection.setCode(static_cast<uint32_t>(why.code()));
  rejection.setMessage(message);
  version_to(current_protocol_version(), rejection.initServerVersion());
  return encode_frame(builder);
}

Result<SessionInfo> decode_hello_reply(const Message& frame) {
  SessionInfo session;
  Status rejection;
  HIBER_RETURN_IF_ERROR(
      read_message<proto::HelloReply>(frame, "hello reply", [&](proto::HelloReply::Reader reply) {
        switch (reply.which()) {
          case proto::HelloReply::WELCOME: return decode_welcome(reply.getWelcome(), session);
          case proto::HelloReply::REJECTED: return decode_rejection(reply.getRejected(), rejection);
        }
        return invalid("hello reply", str_cat("unknown reply kind ", int{reply.which()}));
      }));
  if (!rejection.ok()) return rejection;
  return session;
}

}  // namespace hiber::wire
