// The remoted libraries (server/device/library.h) on the CUDA backend: the real cuBLAS (with
// cuBLASLt) and cuDNN run the calls clients send.
//
// Loading. Nothing links against them: libcublas.so.13, libcublasLt.so.13 and libcudnn.so.9 are
// opened with dlopen the first time a client creates a handle of theirs (check_available), by
// soname through the loader's default search and then in CudaLibraryOptions::folders (hiberd's
// --cuda_library_path), and every entry point used is resolved with dlsym and checked at compile
// time against the prototype the toolkit's header declares. A library that is missing fails that
// library's handles with kNotSupported, naming the file and where it was looked for; hiberd and
// the runtime calls are unaffected. Once opened, a library stays open for the life of the process
// (cuBLAS and cuDNN keep per-context state and exit handlers that must not be unloaded).
//
// Handles. A client handle stands for one real handle per (owner, client handle, GPU), created on
// the GPU of the first stream a call of it runs on, with that GPU's primary context current (the
// libraries' own runtime then uses the context every other call of the function uses). A
// function moved to another GPU (late binding) therefore gets fresh handles there, and a handle
// is never used on a GPU it was not created on. Settings that the client keeps per handle (stream,
// workspace, math, atomics and pointer modes) arrive with every call and are applied to the real
// handle when they differ from what it last had, so a warm call costs no extra library call.
// release() destroys the real handles; cublasDestroy and cudnnDestroy synchronise the device
// first, so work already enqueued with them finishes before their resources go.
//
// cuDNN (cuda_dnn.cc) rebuilds the client's encoded descriptor graphs as real backend
// descriptors, answers finalize queries for every engine of the GPU, keeps one real execution
// plan per (owner, graph id, client handle, GPU), built at its first execution there, and
// rebuilds the legacy calls' descriptors per call. The code the two share (opening a library,
// the handle table) is in cuda_library_support.h.
//
// Thread safety: every method may be called from any thread; one real handle is used by one
// thread at a time (a mutex per handle), as the libraries require.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>

#include "server/device/cuda_device.h"
#include "server/device/library.h"

namespace hiber::device {

// What the library backends need of the CudaDevice that owns them.
class CudaContexts {
 public:
  virtual ~CudaContexts() = default;
  // What identifies `gpu`'s model to the libraries' tuning (name, compute capability, SM count):
  // a cuBLASLt algorithm chosen on one model is re-chosen on another (cuda_blaslt.h).
  virtual std::string gpu_model(int gpu) const = 0;

  // Validates `gpu` and makes its primary (shared) context current on this thread.
  virtual Status use_gpu(int gpu) const = 0;
  // Makes `context` (of this device, not destroyed) current on this thread: library handles
  // are made, used and destroyed in the context of the streams they serve.
  virtual Status use_context(Context context) const = 0;
  // The CUstream a device::Stream stands for, with its context made current.
  virtual Result<CUstream> use_stream(Stream stream) const = 0;
  // Waits for all work in `context` (cuCtxSynchronize), so work enqueued with a library object
  // (a cuDNN execution plan) has finished before the object is destroyed. In the shared context
  // it waits for every session's work on the GPU, as cudnnDestroy and cublasDestroy do anyway:
  // it is used only where a handle or a session goes.
  virtual Status synchronize_context(Context context) const = 0;
};

// Backends for library_ops::Library::kBlas (cuBLAS and cuBLASLt: one handle table, as PyTorch casts
// a cublasHandle_t to a cublasLtHandle_t) and library_ops::Library::kDnn. `contexts` must outlive
// them; their destructors destroy every real handle still kept.
std::unique_ptr<LibraryBackend> make_cuda_blas_backend(const CudaContexts& contexts,
                                                       const CudaLibraryOptions& options);
std::unique_ptr<LibraryBackend> make_cuda_dnn_backend(const CudaContexts& contexts,
                                                      const CudaLibraryOptions& options);

}  // namespace hiber::device
