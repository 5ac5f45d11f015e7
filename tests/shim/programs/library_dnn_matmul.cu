// library_dnn_matmul: a matmul with a bias and a ReLU fused after it, one cuDNN backend graph built
// as cudnn-frontend builds its matmul graphs (A x B into a virtual FLOAT tensor, a pointwise ADD of
// a broadcast bias, a pointwise RELU into Y), in HALF and in BFLOAT16, executed and checked
// against the same arithmetic done here. Inputs are small integers, so every product and sum is
// exact in FLOAT and the results exact in the output type.
//
// Usage: library_dnn_matmul [batch = 2] [m = 5] [k = 7] [n = 3]
// Exits 3 on any mismatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <vector>

#include "cudnn_conv.h"
#include "program_util.h"

namespace {

constexpr int64_t kUidA = 'a', kUidB = 'b', kUidC = 'c', kUidBias = 'z', kUidD = 'd', kUidY = 'y';

using cudnn_conv::make;

cudnnBackendDescriptor_t tensor3(int64_t uid, cudnnDataType_t type, const int64_t* dims,
                                 bool is_virtual) {
  const int64_t strides[3] = {dims[1] * dims[2], dims[2], 1};
  const int64_t alignment = 2;
  cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  CUDNN_CHECK(
      cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 3, dims));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 3, strides));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                       &alignment));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                       &is_virtual));
  CUDNN_CHECK(cudnnBackendFinalize(t));
  return t;
}

cudnnBackendDescriptor_t pointwise_op(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                      cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y,
                                      std::vector<cudnnBackendDescriptor_t>& owned) {
  cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  CUDNN_CHECK(
      cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
                                       &precision));
  CUDNN_CHECK(cudnnBackendFinalize(pw));
  cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
  CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
  if (b != nullptr) {
    CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
  }
  CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
  CUDNN_CHECK(cudnnBackendFinalize(op));
  owned.push_back(pw);
  return op;
}

// The value of small integer v in the output type, stored as its 16 bits.
unsigned short to_bits(float v, cudnnDataType_t type) {
  if (type == CUDNN_DATA_HALF) return __half_as_ushort(__float2half(v));
  return __bfloat16_as_ushort(__float2bfloat16(v));
}
float from_bits(unsigned short bits, cudnnDataType_t type) {
  if (type == CUDNN_DATA_HALF) return __half2float(__ushort_as_half(bits));
  return __bfloat162float(__ushort_as_bfloat16(bits));
}

size_t run(cudnnHandle_t handle, cudnnDataType_t type, int64_t batch, int64_t m, int64_t k,
           int64_t n) {
  const char* type_name = type == CUDNN_DATA_HALF ? "half" : "bfloat16";
  const int64_t a_dims[3] = {batch, m, k}, b_dims[3] = {batch, k, n}, c_dims[3] = {batch, m, n},
                bias_dims[3] = {1, 1, n};
  std::vector<cudnnBackendDescriptor_t> owned;
  cudnnBackendDescriptor_t a = tensor3(kUidA, type, a_dims, false);
  cudnnBackendDescriptor_t b = tensor3(kUidB, type, b_dims, false);
  cudnnBackendDescriptor_t c = tensor3(kUidC, CUDNN_DATA_FLOAT, c_dims, true);
  cudnnBackendDescriptor_t bias = tensor3(kUidBias, type, bias_dims, false);
  cudnnBackendDescriptor_t d = tensor3(kUidD, CUDNN_DATA_FLOAT, c_dims, true);
  cudnnBackendDescriptor_t y = tensor3(kUidY, type, c_dims, false);
  owned.insert(owned.end(), {a, b, c, bias, d, y});
  cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  CUDNN_CHECK(
      cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
  CUDNN_CHECK(cudnnBackendFinalize(mm));
  cudnnBackendDescriptor_t mm_op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  CUDNN_CHECK(cudnnBackendSetAttribute(mm_op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
  CUDNN_CHECK(cudnnBackendSetAttribute(mm_op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
  CUDNN_CHECK(cudnnBackendSetAttribute(mm_op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
  CUDNN_CHECK(cudnnBackendSetAttribute(mm_op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
  CUDNN_CHECK(cudnnBackendFinalize(mm_op));
  cudnnBackendDescriptor_t add = pointwise_op(CUDNN_POINTWISE_ADD, c, bias, d, owned);
  cudnnBackendDescriptor_t relu = pointwise_op(CUDNN_POINTWISE_RELU_FWD, d, nullptr, y, owned);
  cudnnBackendDescriptor_t ops[3] = {mm_op, add, relu};
  cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  CUDNN_CHECK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 3, ops));
  CUDNN_CHECK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE,
                                       1, &handle));
  CUDNN_CHECK(cudnnBackendFinalize(graph));
  cudnnBackendDescriptor_t plan = cudnn_conv::plan_for(handle, graph);
  const int64_t workspace_bytes = cudnn_conv::workspace_size(plan);

  // Small integers: A in [-3, 3], B in [-2, 2], the bias in [-4, 4].
  std::vector<float> ha(batch * m * k), hb(batch * k * n), hbias(n);
  for (size_t i = 0; i < ha.size(); ++i)
    ha[i] = static_cast<float>(static_cast<int>(i * 5 % 7) - 3);
  for (size_t i = 0; i < hb.size(); ++i)
    hb[i] = static_cast<float>(static_cast<int>(i * 3 % 5) - 2);
  for (int64_t i = 0; i < n; ++i) hbias[i] = static_cast<float>(static_cast<int>(i * 7 % 9) - 4);
  auto bits = [&](const std::vector<float>& v) {
    std::vector<unsigned short> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = to_bits(v[i], type);
    return out;
  };
  const std::vector<unsigned short> a16 = bits(ha), b16 = bits(hb), bias16 = bits(hbias);
  void *da, *db, *dbias, *dy, *workspace = nullptr;
  const size_t y_count = static_cast<size_t>(batch * m * n);
  CUDA_CHECK(cudaMalloc(&da, a16.size() * 2));
  CUDA_CHECK(cudaMalloc(&db, b16.size() * 2));
  CUDA_CHECK(cudaMalloc(&dbias, bias16.size() * 2));
  CUDA_CHECK(cudaMalloc(&dy, y_count * 2));
  if (workspace_bytes > 0) CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  CUDA_CHECK(cudaMemcpy(da, a16.data(), a16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db, b16.data(), b16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dbias, bias16.data(), bias16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dy, 0xff, y_count * 2));

  cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  int64_t uids[4] = {kUidA, kUidB, kUidBias, kUidY};
  void* ptrs[4] = {da, db, dbias, dy};
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                       4, uids));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                       CUDNN_TYPE_VOID_PTR, 4, ptrs));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                       1, &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack));
  std::vector<unsigned short> y16(y_count);
  CUDA_CHECK(cudaMemcpy(y16.data(), dy, y_count * 2, cudaMemcpyDeviceToHost));

  std::vector<float> got(y_count), want(y_count);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          acc += ha[(bi * m + i) * k + kk] * hb[(bi * k + kk) * n + j];
        }
        const size_t at = static_cast<size_t>((bi * m + i) * n + j);
        const float v = acc + hbias[j];
        want[at] = from_bits(to_bits(v > 0 ? v : 0.0f, type), type);
        got[at] = from_bits(y16[at], type);
      }
    }
  }
  const size_t mismatches = program::count_mismatches(type_name, got.data(), want.data(), y_count);
  std::printf("library_dnn_matmul: %s [%lld x %lld x %lld] x [%lld x %lld] + bias, relu: %s\n",
              type_name, static_cast<long long>(batch), static_cast<long long>(m),
              static_cast<long long>(k), static_cast<long long>(k), static_cast<long long>(n),
              mismatches == 0 ? "exact" : "WRONG");

  CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(plan));
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(graph));
  for (auto op : {mm_op, add, relu, mm}) CUDNN_CHECK(cudnnBackendDestroyDescriptor(op));
  for (auto desc : owned) CUDNN_CHECK(cudnnBackendDestroyDescriptor(desc));
  for (void* p : {da, db, dbias, dy}) CUDA_CHECK(cudaFree(p));
  if (workspace != nullptr) CUDA_CHECK(cudaFree(workspace));
  return mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int64_t batch = program::int_arg(argc, argv, 1, 2, 1, 64);
  const int64_t m = program::int_arg(argc, argv, 2, 5, 1, 512);
  const int64_t k = program::int_arg(argc, argv, 3, 7, 1, 512);
  const int64_t n = program::int_arg(argc, argv, 4, 3, 1, 512);
  CUDA_CHECK(cudaSetDevice(0));
  cudnnHandle_t handle;
  CUDNN_CHECK(cudnnCreate(&handle));
  size_t mismatches = run(handle, CUDNN_DATA_HALF, batch, m, k, n);
  mismatches += run(handle, CUDNN_DATA_BFLOAT16, batch, m, k, n);
  CUDNN_CHECK(cudnnDestroy(handle));
  if (mismatches != 0) {
    std::printf("library_dnn_matmul: FAILED: %zu mismatches\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("library_dnn_matmul: OK\n");
  return 0;
}
