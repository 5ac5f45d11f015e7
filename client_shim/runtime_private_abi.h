// The runtime entry points the toolkit's public headers do not declare, as libcudart.so exports
// them: the registration calls nvcc's generated host code makes (__cuda*, from the toolkit's
// crt/host_runtime.h and the code nvcc emits), and the per-thread default stream variants
// (_ptsz, _ptds: declared by cuda_runtime_api.h only under --default-stream per-thread, with the
// signature of the function they vary). entry_points/cudart.entries names them all.
#pragma once

#include <cuda_runtime_api.h>

// The shim implements deprecated entry points too: their declarations are not a use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

extern "C" {

void** __cudaRegisterFatBinary(void* fatbin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaUnregisterFatBinary(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function,
                            const char* device_name, int thread_limit, uint3* thread_id,
                            uint3* block_id, dim3* block_dim, dim3* grid_dim, int* warp_size);
void __cudaRegisterVar(void** handle, char* host_var, char* device_address, const char* device_name,
                       int ext, size_t size, int constant, int global);
char __cudaInitModule(void** handle);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_function);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared, cudaStream_t stream);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream);

decltype(::cudaMemcpyAsync) cudaMemcpyAsync_ptsz;
decltype(::cudaMemsetAsync) cudaMemsetAsync_ptsz;
decltype(::cudaMemcpy) cudaMemcpy_ptds;
decltype(::cudaMemset) cudaMemset_ptds;
decltype(::cudaLaunchKernel) cudaLaunchKernel_ptsz;
decltype(::cudaLaunchKernelExC) cudaLaunchKernelExC_ptsz;
decltype(::cudaStreamSynchronize) cudaStreamSynchronize_ptsz;
decltype(::cudaLaunchHostFunc) cudaLaunchHostFunc_ptsz;
decltype(::cudaStreamAddCallback) cudaStreamAddCallback_ptsz;
decltype(::cudaStreamQuery) cudaStreamQuery_ptsz;
decltype(::cudaStreamWaitEvent) cudaStreamWaitEvent_ptsz;
decltype(::cudaStreamGetPriority) cudaStreamGetPriority_ptsz;
decltype(::cudaStreamGetFlags) cudaStreamGetFlags_ptsz;
decltype(::cudaStreamIsCapturing) cudaStreamIsCapturing_ptsz;
decltype(::cudaEventRecord) cudaEventRecord_ptsz;
decltype(::cudaEventRecordWithFlags) cudaEventRecordWithFlags_ptsz;
decltype(::cudaGetDriverEntryPoint) cudaGetDriverEntryPoint_ptsz;
decltype(::cudaGetDriverEntryPointByVersion) cudaGetDriverEntryPointByVersion_ptsz;
decltype(::cudaMallocAsync) cudaMallocAsync_ptsz;
decltype(::cudaStreamBeginCapture) cudaStreamBeginCapture_ptsz;
decltype(::cudaStreamEndCapture) cudaStreamEndCapture_ptsz;
decltype(::cudaStreamGetCaptureInfo) cudaStreamGetCaptureInfo_ptsz;
decltype(::cudaGraphLaunch) cudaGraphLaunch_ptsz;
decltype(::cudaGraphUpload) cudaGraphUpload_ptsz;
decltype(::cudaFreeAsync) cudaFreeAsync_ptsz;
decltype(::cudaMallocFromPoolAsync) cudaMallocFromPoolAsync_ptsz;

}  // extern "C"

#pragma GCC diagnostic pop
