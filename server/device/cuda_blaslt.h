// cuBLASLt on the CUDA backend: the kLtHeuristic queries and kLtMatmul calls of
// library_ops::Library::kBlas (cuda_libraries.h's cuBLAS backend hands them here), run by the real
// libcublasLt.so.13.
//
// Loading. libcublasLt.so.13 is opened when a client first creates a cuBLAS/cuBLASLt handle
// (check_available), with cuda_libraries.cc's search (the loader's path, then
// --cuda_library_path), and every entry point is resolved by name with its type taken from
// cublasLt.h. A missing libcublasLt refuses the handle with kNotSupported naming the file, as a
// missing libcublas does: the real libcublas.so.13 needs libcublasLt.so.13 to load at all, so
// a server without it could not run cuBLAS either.
//
// Handles. One real cublasLtHandle_t per (owner, client handle, GPU), made by cublasLtCreate with
// the GPU's primary context current, kept apart from the cuBLAS handle of the same client handle.
// PyTorch casts its cublasHandle_t to a cublasLtHandle_t (which cuBLAS 11 and later accept); hiberd
// does not, so the Lt part needs no cuBLAS handle (nor cuBLAS's per-handle workspace) for a client
// that only calls cuBLASLt, and relies on nothing beyond cublasLt.h. A cuBLASLt handle keeps no
// stream, workspace or mode: those travel with every call.
//
// Descriptors. The client keeps cuBLASLt's descriptors (client_shim/cublaslt_api.cc) and sends
// their contents, an LtProblem, with each call. hiberd keeps real descriptors per (owner, client
// handle, GPU) and problem, built once: matmul descriptor (compute and scale types, pointer mode,
// transposes, epilogue, bias type), and the four matrix layouts (type, rows, cols, ld, order, batch
// count, strided batch offset). The bias pointer and bias batch stride change per call and are set
// on the kept descriptor before each matmul (one handle is used by one thread at a time).
//
// Algorithms. A real cublasLtMatmulAlgo_t is 64 bytes, and library_ops::blas::LtAlgo leaves the
// backend 48 of them, so the real algorithms never travel: the heuristic keeps each one it returns
// in hiberd, keyed by (problem hash, workspace preference, results requested, result index, GPU
// model), and the client's LtAlgo carries the key (LtAlgo::backend, see CudaLtAlgoKey in
// cuda_blaslt.cc). A matmul looks its key up; on a miss (hiberd restarted, the function moved to a
// GPU of another model, or the kept algorithms were evicted) it re-runs the heuristic for the
// matmul's problem with the same preference and takes the result of the same index, and refuses
// with kNotSupported when the heuristic now offers fewer. The library therefore only ever runs
// algorithms its own heuristic returned on the GPU it runs on; a client chooses among them, never
// writes their bytes.
//
// Release. cublasLtDestroy (which synchronises the device, as cublasDestroy does) and the
// descriptors' destruction run with the handle's GPU's context current. Descriptors may be
// destroyed while matmuls made with them are in flight: cublasLtMatmul takes what it needs at the
// call (PyTorch destroys its descriptors right after the call, too).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "common/status.h"
#include "library_ops/blas_ops.h"
#include "server/device/cuda_libraries.h"
#include "server/device/library.h"

namespace hiber::device {

// Opens a library by soname with cuda_libraries.cc's search; returns its dlopen handle and the
// path it was loaded from (for messages), or kNotSupported naming where it was looked for.
using OpenCudaLibrary = std::function<Result<std::pair<void*, std::string>>(const char* soname)>;

// The cuBLASLt part of the kBlas backend (cuda_libraries.cc dispatches kLtMatmul and
// kLtHeuristic here), with LibraryBackend's meanings.
class CudaBlasLt {
 public:
  virtual ~CudaBlasLt() = default;
  virtual Status check_available() = 0;
  virtual Status run(Stream stream, const LibraryCall& call,
                     const library_ops::blas::LtMatmul& matmul) = 0;
  virtual Result<std::vector<std::byte>> answer(Context context, const LibraryCall& call,
                                                const library_ops::blas::LtHeuristic& query) = 0;
  virtual void release(uint64_t owner, std::optional<library_ops::LibraryHandle> handle) = 0;
  virtual void forget_context(Context context) = 0;
};

// `contexts` must outlive it; its destructor destroys every real handle and descriptor kept.
std::unique_ptr<CudaBlasLt> make_cuda_blaslt(const CudaContexts& contexts, OpenCudaLibrary open);

}  // namespace hiber::device
