// libhibercuda.so's exported services for the replacement libraries (library_client.h).
#include "client_shim/library_client.h"

#include <glog/logging.h>

#include <mutex>
#include <set>
#include <string>

#include "client_shim/client.h"
#include "client_shim/entry_support.h"

namespace hiber::shim {

Result<LibraryHandleObj*> library_handle_create(library_ops::Library library) {
  return Client::get().create_library_handle(library);
}

Status library_handle_destroy(LibraryHandleObj* handle) {
  return Client::get().destroy_library_handle(handle);
}

Result<LibraryHandleObj*> library_handle(const void* handle, library_ops::Library library) {
  return Client::get().library_handle(handle, library);
}

Status library_set_stream(LibraryHandleObj* handle, void* stream) {
  return Client::get().set_library_stream(handle, stream);
}

Status library_call(LibraryHandleObj* handle, library_ops::LibraryOp op,
                    std::span<const std::byte> args) {
  return Client::get().library_call(handle, op, args);
}

Status library_call_on(LibraryHandleObj* handle, void* stream, library_ops::LibraryOp op,
                       std::span<const std::byte> args) {
  return Client::get().library_call_on(handle, stream, op, args);
}

Result<std::vector<std::byte>> library_query(LibraryHandleObj* handle, library_ops::LibraryOp op,
                                             std::span<const std::byte> args) {
  return Client::get().library_query(handle, op, args);
}

void library_log_once(const char* library, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> logged;
  std::string line = std::string(library) + ": " + message;
  {
    std::lock_guard lock(mu);
    if (!logged.insert(line).second) return;
  }
  LOG(ERROR) << line;
}

}  // namespace hiber::shim

extern "C" int hiber_shim_library_unsupported(const char* library, const char* name, int status) {
  hiber::shim::library_trace_stub_call(library, name, status);
  hiber::shim::library_log_once(library,
                                std::string(name) +
                                    " is not supported by Hiber; it returns the library's \"not "
                                    "supported\" status (" +
                                    std::to_string(status) + ")");
  return status;
}
