#include "wire/status_pages.h"

#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "wire/schema/control.capnp.h"

namespace hiber::wire {
namespace {

// Calls fn(NodeStatus::Reader) for a status reply; hiberd's error answer comes back as a Status.
template <typename Fn>
Status read_status(const Message& reply, Fn&& fn) {
  return read_message<proto::ControlReply>(
      reply, "status reply", [&](proto::ControlReply::Reader r) -> Status {
        if (r.isError()) {
          return Status(static_cast<ErrorCode>(r.getError().getCode()), r.getError().getMessage());
        }
        if (!r.isStatus()) return Status(ErrorCode::kInvalidValue, "not a status reply");
        return fn(r.getStatus());
      });
}

}  // namespace

Result<std::optional<uint64_t>> next_status_page(const Message& page) {
  std::optional<uint64_t> next;
  HIBER_RETURN_IF_ERROR(read_status(page, [&](proto::NodeStatus::Reader s) -> Status {
    const uint64_t end = s.getFunctionOffset() + s.getFunctions().size();
    if (end >= s.getFunctionCount()) return Status();
    if (s.getFunctions().size() == 0) {
      return error(ErrorCode::kInvalidValue, "a status page at function ", s.getFunctionOffset(),
                   " of ", s.getFunctionCount(), " lists no function");
    }
    next = end;
    return Status();
  }));
  return next;
}

Result<Message> merge_status_pages(const std::vector<Message>& pages) {
  if (pages.size() == 1) return pages.front();
  capnp::MallocMessageBuilder merged;
  uint32_t total = 0;
  for (const Message& page : pages) {
    HIBER_RETURN_IF_ERROR(read_status(page, [&](proto::NodeStatus::Reader s) -> Status {
      total += s.getFunctions().size();
      return Status();
    }));
  }
  HIBER_RETURN_IF_ERROR(read_message<proto::ControlReply>(
      pages.front(), "status reply", [&](proto::ControlReply::Reader first) -> Status {
        merged.setRoot(first);
        return Status();
      }));
  auto status = merged.getRoot<proto::ControlReply>().getStatus();
  auto functions = status.initFunctions(total);
  status.setFunctionOffset(0);
  status.setFunctionCount(total);
  uint32_t next = 0;
  for (const Message& page : pages) {
    HIBER_RETURN_IF_ERROR(read_status(page, [&](proto::NodeStatus::Reader s) -> Status {
      for (auto f : s.getFunctions()) functions.setWithCaveats(next++, f);
      return Status();
    }));
  }
  kj::Array<capnp::word> words = capnp::messageToFlatArray(merged);
  Message out;
  std::span<std::byte> bytes = out.resize(words.asBytes().size());
  std::memcpy(bytes.data(), words.asBytes().begin(), bytes.size());
  return out;
}

}  // namespace hiber::wire
