// The core's part of the remoted libraries: their handles and their calls (library_client.h).
#include "client_shim/client.h"

namespace hiber::shim {

Result<LibraryHandleObj*> Client::create_library_handle(library_ops::Library library) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (library_handles_.size() >= wire::kMaxLibraryHandles)
    return error(ErrorCode::kOutOfMemory, "the process already has ", library_handles_.size(),
                 " library handles, the most hiberd allows one session");
  auto handle = std::make_unique<LibraryHandleObj>();
  handle->wire = new_handle_locked<wire::LibraryHandle>();
  handle->library = library;
  HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::LibraryHandleCreate{
      .handle = handle->wire, .library = static_cast<uint8_t>(library)}));
  LibraryHandleObj* made = handle.get();
  library_handles_.emplace(made, std::move(handle));
  return made;
}

Status Client::destroy_library_handle(LibraryHandleObj* handle) {
  std::lock_guard lock(mu_);
  auto it = library_handles_.find(handle);
  if (it == library_handles_.end())
    return error(ErrorCode::kInvalidHandle, "unknown library handle ", static_cast<void*>(handle));
  const wire::LibraryHandle wire = it->second->wire;
  library_handles_.erase(it);
  return enqueue_locked(wire::calls::LibraryHandleDestroy{.handle = wire});
}

Result<LibraryHandleObj*> Client::library_handle(const void* handle, library_ops::Library library) {
  std::lock_guard lock(mu_);
  auto it = library_handles_.find(handle);
  if (it == library_handles_.end() || it->second->library != library)
    return error(ErrorCode::kInvalidHandle, "unknown ", library_ops::library_name(library),
                 " handle ", handle);
  return it->second.get();
}

Status Client::set_library_stream(LibraryHandleObj* handle, void* stream) {
  HIBER_RETURN_IF_ERROR(this->stream(stream).status());
  std::lock_guard lock(mu_);
  handle->stream = stream;
  return Status();
}

Status Client::library_call(LibraryHandleObj* handle, library_ops::LibraryOp op,
                            std::span<const std::byte> args) {
  void* stream;
  {
    std::lock_guard lock(mu_);
    stream = handle->stream;
  }
  return library_call_on(handle, stream, op, args);
}

Status Client::library_call_on(LibraryHandleObj* handle, void* stream_handle,
                               library_ops::LibraryOp op, std::span<const std::byte> args) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  StreamObj* stream = nullptr;
  if (reinterpret_cast<uintptr_t>(stream_handle) > 2) {
    auto it = streams_.find(stream_handle);
    if (it == streams_.end())
      return error(ErrorCode::kInvalidHandle, library_ops::library_name(handle->library),
                   " stream ", stream_handle, " does not exist (destroyed?)");
    stream = it->second.get();
  }
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  return enqueue_locked(wire::calls::LibraryCall{.stream = stream_wire(stream),
                                                 .handle = handle->wire,
                                                 .op = static_cast<uint16_t>(op),
                                                 .args = args});
}

Result<std::vector<std::byte>> Client::library_query(LibraryHandleObj* handle,
                                                     library_ops::LibraryOp op,
                                                     std::span<const std::byte> args) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(check_session_locked());
  // Not sticky: a query's failure is its answer ("not supported"), not the session's error.
  auto reply = calls_->call(wire::calls::LibraryQuery{.handle = handle->wire,
                                                      .op = static_cast<uint16_t>(op),
                                                      .args = args},
                            /*sticky=*/false);
  if (!reply.ok()) return lost_session_locked(reply.status(), /*answer_lost=*/true);
  wire::CallResult& result = *reply;
  auto* answer = std::get_if<wire::LibraryAnswer>(&result);
  if (answer == nullptr)
    return error(ErrorCode::kUnknown, "hiberd answered a library query without an answer");
  return std::move(answer->bytes);
}

}  // namespace hiber::shim
