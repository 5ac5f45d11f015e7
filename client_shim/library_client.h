// The core's services for the replacement libraries (libhibercublas.so, libhibercublasLt.so,
// libhibercudnn.so), so that they share libhibercuda.so's one session with hiberd and one table
// of library handles. libhibercuda.so exports these functions under its private version node
// HIBER_SHIM_PRIVATE (libcudart.map); the replacement libraries link against it.
//
// A library handle is a LibraryHandleObj the core owns; the program holds its address as its
// cublasHandle_t, cublasLtHandle_t or cudnnHandle_t. cuBLAS and cuBLASLt handles are one kind
// (library_ops::Library::kBlas): PyTorch passes a cublasHandle_t where a cublasLtHandle_t is
// expected. A handle value the core did not make is refused before anything reads it.
//
// Every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "wire/library.h"

#ifndef HIBER_SHIM_EXPORT
#define HIBER_SHIM_EXPORT __attribute__((visibility("default")))
#endif

namespace hiber::shim {

struct LibraryHandleObj {
  wire::LibraryHandle wire;
  library_ops::Library library = library_ops::Library::kBlas;
  void* stream = nullptr;  // as the program set it (nullptr: the legacy default stream)
  // cuBLAS and cuBLASLt settings of the handle, applied to each call.
  uint64_t workspace = 0;  // cublasSetWorkspace's; 0: hiberd's own
  uint64_t workspace_bytes = 0;
  int32_t math_mode = 0;     // cublasMath_t
  int32_t pointer_mode = 0;  // cublasPointerMode_t
  int32_t atomics_mode = 0;  // cublasAtomicsMode_t
};

// Makes a handle (hiberd learns of it with the next batch). kNoDevice etc. if there is no
// session.
HIBER_SHIM_EXPORT Result<LibraryHandleObj*> library_handle_create(library_ops::Library library);
HIBER_SHIM_EXPORT Status library_handle_destroy(LibraryHandleObj* handle);
// The handle whose address the program passed, if the core made it for `library`;
// kInvalidHandle otherwise (nullptr, freed, another library's, or never made).
HIBER_SHIM_EXPORT Result<LibraryHandleObj*> library_handle(const void* handle,
                                                           library_ops::Library library);
// Sets the stream (nullptr, cudaStreamLegacy or a live stream; kInvalidHandle otherwise).
HIBER_SHIM_EXPORT Status library_set_stream(LibraryHandleObj* handle, void* stream);
// A compute call, ordered on the handle's stream among its copies and launches; asynchronous
// (its failure is the session's sticky error, as a launch's is).
HIBER_SHIM_EXPORT Status library_call(LibraryHandleObj* handle, library_ops::LibraryOp op,
                                      std::span<const std::byte> args);
// The same on `stream` (nullptr, cudaStreamLegacy or a live stream) instead of the handle's:
// cublasLtMatmul names its stream per call.
HIBER_SHIM_EXPORT Status library_call_on(LibraryHandleObj* handle, void* stream,
                                         library_ops::LibraryOp op,
                                         std::span<const std::byte> args);
// A question hiberd answers; waits for the answer.
HIBER_SHIM_EXPORT Result<std::vector<std::byte>> library_query(LibraryHandleObj* handle,
                                                               library_ops::LibraryOp op,
                                                               std::span<const std::byte> args);
// Logs `message` once per process (for loud stubs and refused calls): "<library>: <message>".
HIBER_SHIM_EXPORT void library_log_once(const char* library, const std::string& message);

}  // namespace hiber::shim

// Called by the generated stubs of every exported name a replacement library does not implement:
// logs "<library>: <name> is not supported by Hiber" once and returns `status`, the library's
// "not supported" value.
extern "C" HIBER_SHIM_EXPORT int hiber_shim_library_unsupported(const char* library,
                                                                const char* name, int status);
