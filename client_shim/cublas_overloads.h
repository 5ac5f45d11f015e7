// The C signatures of the cuBLAS entry points that cublas_api.h overloads in C++ (inline
// wrappers taking a cudaDataType compute type), where decltype(::name) would be ambiguous: the
// exported ABI is the C declaration's (entry_points/cublas.entries marks them "overloaded").
#pragma once

#include <cublas_v2.h>

namespace hiber_signature {

using cublasGemmEx = cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
using cublasGemmBatchedEx = cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                           int, int, int, const void*, const void* const[],
                                           cudaDataType, int, const void* const[], cudaDataType,
                                           int, const void*, void* const[], cudaDataType, int, int,
                                           cublasComputeType_t, cublasGemmAlgo_t);
using cublasGemmStridedBatchedEx = cublasStatus_t(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
    void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);

}  // namespace hiber_signature
