// The checks of cuDNN calls.
#include "server/library_calls.h"

namespace hiber::server {

Result<LibraryAccess> check_dnn_call(wire::LibraryOp op, std::span<const std::byte>) {
  return error(ErrorCode::kNotSupported, "cuDNN operation ", static_cast<unsigned>(op),
               " is not a compute call hiberd runs");
}

Status check_dnn_query(wire::LibraryOp op, std::span<const std::byte>) {
  return error(ErrorCode::kNotSupported, "cuDNN query ", static_cast<unsigned>(op),
               " is not one hiberd answers");
}

}  // namespace hiber::server
