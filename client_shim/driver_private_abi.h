// The driver entry points cuda.h no longer declares but libcuda.so.1 still exports: the older
// ABIs of renamed functions, which cudaTypedefs.h keeps as PFN_<name>_v<version> (the CUDA
// version that introduced each), and the per-thread default stream variants (_ptsz: declared by
// cuda.h only under CUDA_API_PER_THREAD_DEFAULT_STREAM). entry_points/cuda.entries names them.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

extern "C" {

std::remove_pointer_t<PFN_cuCtxCreate_v3020> cuCtxCreate_v2;
std::remove_pointer_t<PFN_cuCtxCreate_v11040> cuCtxCreate_v3;

decltype(::cuMemAllocAsync) cuMemAllocAsync_ptsz;
decltype(::cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
decltype(::cuMemFreeAsync) cuMemFreeAsync_ptsz;
decltype(::cuStreamIsCapturing) cuStreamIsCapturing_ptsz;

}  // extern "C"
