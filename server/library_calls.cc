#include "server/library_calls.h"

namespace hiber::server {

Status LibraryCalls::create_handle(wire::LibraryHandle handle, uint8_t library) {
  if (!library_ops::is_library(library))
    return error(ErrorCode::kInvalidValue, "libraryHandleCreate: library ", unsigned{library},
                 " does not exist");
  if (handle.is_zero())
    return error(ErrorCode::kInvalidValue, "libraryHandleCreate: handle 0 is reserved");
  if (handles_.size() >= wire::kMaxLibraryHandles)
    return error(ErrorCode::kOutOfMemory, "libraryHandleCreate: the session already has ",
                 handles_.size(), " library handles, the most one session may hold");
  if (!handles_.emplace(handle, static_cast<library_ops::Library>(library)).second)
    return error(ErrorCode::kInvalidValue, "libraryHandleCreate: handle ", hex(handle.value()),
                 " already exists");
  return Status();
}

Status LibraryCalls::destroy_handle(wire::LibraryHandle handle) {
  if (handles_.erase(handle) == 0)
    return error(ErrorCode::kInvalidHandle, "libraryHandleDestroy: unknown library handle ",
                 hex(handle.value()));
  return Status();
}

Result<library_ops::Library> LibraryCalls::library(wire::LibraryHandle handle) const {
  auto it = handles_.find(handle);
  if (it == handles_.end())
    return error(ErrorCode::kInvalidHandle, "library handle ", hex(handle.value()),
                 " was not created by this session");
  return it->second;
}

Result<library_ops::LibraryOp> LibraryCalls::check_op(wire::LibraryHandle handle, uint16_t op,
                                                      std::span<const std::byte> args,
                                                      const char* kind) const {
  HIBER_ASSIGN_OR_RETURN(library_ops::Library library, this->library(handle));
  if (args.size() > wire::kMaxLibraryArgBytes)
    return error(ErrorCode::kInvalidValue, kind, " ", op, ": ", args.size(),
                 " bytes of arguments exceed the limit of ", wire::kMaxLibraryArgBytes);
  library_ops::OpRow row{};
  if (!library_ops::op_row(op, &row) || row.library != library)
    return error(ErrorCode::kInvalidValue, kind, " ", op, " is not an operation of ",
                 library_ops::library_name(library), ", the library of handle ",
                 hex(handle.value()));
  return static_cast<library_ops::LibraryOp>(op);
}

Result<LibraryAccess> LibraryCalls::check_call(wire::LibraryHandle handle, uint16_t op,
                                               std::span<const std::byte> args) {
  HIBER_ASSIGN_OR_RETURN(library_ops::LibraryOp library_op,
                         check_op(handle, op, args, "libraryCall"));
  switch (library_ops::library_of(library_op)) {
    case library_ops::Library::kBlas: return check_blas_call(library_op, args);
    case library_ops::Library::kDnn: return check_dnn_call(library_op, args, dnn_graphs_);
  }
  return error(ErrorCode::kInvalidValue, "libraryCall: operation ", op, " has no library");
}

Status LibraryCalls::check_query(wire::LibraryHandle handle, uint16_t op,
                                 std::span<const std::byte> args) {
  HIBER_ASSIGN_OR_RETURN(library_ops::LibraryOp library_op,
                         check_op(handle, op, args, "libraryQuery"));
  switch (library_ops::library_of(library_op)) {
    case library_ops::Library::kBlas: return check_blas_query(library_op, args);
    case library_ops::Library::kDnn: return check_dnn_query(library_op, args);
  }
  return error(ErrorCode::kInvalidValue, "libraryQuery: operation ", op, " has no library");
}

}  // namespace hiber::server
