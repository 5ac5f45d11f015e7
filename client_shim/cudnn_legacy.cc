// libhibercudnn.so: cuDNN's legacy (non-graph) API. Tensor, filter, pooling and activation
// descriptors live in the client; each compute call (batch-norm inference, pooling, activation,
// softmax, add tensor) carries its descriptors by value in one asynchronous library call
// (wire/dnn_ops.h), checked here as cuDNN checks it (CUDNN_STATUS_BAD_PARAM before anything is
// sent) and again by hiberd.
#include <algorithm>
#include <cstring>

#include "client_shim/cudnn_common.h"
#include "library_ops/dispatch.h"

namespace wdnn = hiber::library_ops::dnn;

struct cudnnTensorStruct {
  wdnn::TensorShape shape;  // rank 0: not set yet
};
struct cudnnFilterStruct {
  int32_t data_type = 0;
  int32_t format = 0;
  int32_t rank = 0;
  int dims[wdnn::kMaxDims] = {};
};
struct cudnnPoolingStruct {
  int32_t mode = 0;
  int32_t nan_propagation = 0;
  int32_t spatial = 0;
  int64_t window[wdnn::kMaxSpatial] = {}, pad[wdnn::kMaxSpatial] = {},
          stride[wdnn::kMaxSpatial] = {};
};
struct cudnnActivationStruct {
  int32_t mode = 0;
  int32_t nan_propagation = 0;
  double coef = 0;
  double swish_beta = 1;
};

namespace {

using namespace hiber::shim::dnn;  // NOLINT
using hiber::ErrorCode;
using hiber::Status;

Registry<cudnnTensorStruct>& tensors() {
  static auto* r = new Registry<cudnnTensorStruct>();
  return *r;
}
Registry<cudnnFilterStruct>& filters() {
  static auto* r = new Registry<cudnnFilterStruct>();
  return *r;
}
Registry<cudnnPoolingStruct>& poolings() {
  static auto* r = new Registry<cudnnPoolingStruct>();
  return *r;
}
Registry<cudnnActivationStruct>& activations() {
  static auto* r = new Registry<cudnnActivationStruct>();
  return *r;
}

template <typename T, typename Ptr>
cudnnStatus_t create(Registry<T>& registry, Ptr* out, const char* call) {
  if (out == nullptr) return bad_param(call, "the descriptor pointer is NULL");
  *out = registry.make();
  return CUDNN_STATUS_SUCCESS;
}

template <typename T>
cudnnStatus_t destroy(Registry<T>& registry, const void* p, const char* call) {
  if (p == nullptr) return CUDNN_STATUS_SUCCESS;  // as cuDNN: destroying NULL is a no-op
  if (!registry.destroy(p)) return bad_param(call, "not a live descriptor of this kind");
  return CUDNN_STATUS_SUCCESS;
}

bool carried(cudnnDataType_t type) { return wdnn::data_type_bytes(type).ok(); }

// Packed strides for `format` (NCHW: last dimension fastest; NHWC: channels fastest).
void packed_strides(int rank, const int64_t* dims, bool nhwc, int64_t* strides) {
  if (!nhwc) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides[i] = s;
      s *= dims[i];
    }
    return;
  }
  int64_t s = 1;
  strides[1] = s;
  s *= dims[1];
  for (int i = rank - 1; i >= 2; --i) {
    strides[i] = s;
    s *= dims[i];
  }
  strides[0] = s;
}

cudnnStatus_t set_tensor(cudnnTensorDescriptor_t desc, cudnnDataType_t type, int rank,
                         const int64_t* dims, const int64_t* strides, const char* call) {
  auto* t = tensors().find(desc);
  if (t == nullptr) return bad_param(call, "not a live tensor descriptor");
  if (!carried(type))
    return not_supported(call, "data type " + std::to_string(type) + " is not one Hiber carries");
  if (rank < 1 || rank > wdnn::kMaxDims)
    return bad_param(call, "nbDims " + std::to_string(rank) + " (1 to 8)");
  for (int i = 0; i < rank; ++i)
    if (dims[i] < 1 || strides[i] < 1)
      return bad_param(call, "dimension " + std::to_string(i) + " or its stride is below 1");
  t->shape = {};
  t->shape.data_type = type;
  t->shape.rank = rank;
  std::copy(dims, dims + rank, t->shape.dims);
  std::copy(strides, strides + rank, t->shape.strides);
  return CUDNN_STATUS_SUCCESS;
}

// A set tensor descriptor's shape, or nullptr (the error recorded).
const wdnn::TensorShape* shape_of(cudnnTensorDescriptor_t desc, const char* call,
                                  const char* what) {
  auto* t = tensors().find(desc);
  if (t == nullptr || t->shape.rank == 0) {
    bad_param(call, std::string(what) + " is not a live, set tensor descriptor");
    return nullptr;
  }
  return &t->shape;
}

// alpha/beta: double for double data, float otherwise (cuDNN's rule for the legacy calls).
bool read_scalars(const void* alpha, const void* beta, int32_t type, double* a, double* b) {
  if (alpha == nullptr || beta == nullptr) return false;
  if (type == CUDNN_DATA_DOUBLE) {
    std::memcpy(a, alpha, sizeof(double));
    std::memcpy(b, beta, sizeof(double));
  } else {
    float fa, fb;
    std::memcpy(&fa, alpha, sizeof(float));
    std::memcpy(&fb, beta, sizeof(float));
    *a = fa;
    *b = fb;
  }
  return true;
}

uint64_t address(const void* p) { return reinterpret_cast<uint64_t>(p); }

template <typename Op>
cudnnStatus_t submit(cudnnHandle_t handle, const Op& op, const char* call) {
  auto* h = handle_of(handle, call);
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  Status checked = wdnn::check_op(op);
  if (!checked.ok()) return fail(call, checked);
  return fail(call, hiber::shim::library_call(h, hiber::library_ops::op_of<Op>,
                                              hiber::library_ops::op_bytes(op)));
}

}  // namespace

// ---- Tensor descriptors ----
cudnnStatus_t hiber_entry::cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  return create(tensors(), desc, "cudnnCreateTensorDescriptor");
}
cudnnStatus_t hiber_entry::cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  return destroy(tensors(), desc, "cudnnDestroyTensorDescriptor");
}

cudnnStatus_t hiber_entry::cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc,
                                                      cudnnTensorFormat_t format,
                                                      cudnnDataType_t type, int n, int c, int h,
                                                      int w) {
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return not_supported("cudnnSetTensor4dDescriptor",
                         "tensor format " + std::to_string(format) + " (NCHW and NHWC only)");
  const int64_t dims[4] = {n, c, h, w};
  int64_t strides[4];
  packed_strides(4, dims, format == CUDNN_TENSOR_NHWC, strides);
  return set_tensor(desc, type, 4, dims, strides, "cudnnSetTensor4dDescriptor");
}

cudnnStatus_t hiber_entry::cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t desc,
                                                        cudnnDataType_t type, int n, int c, int h,
                                                        int w, int ns, int cs, int hs, int ws) {
  const int64_t dims[4] = {n, c, h, w};
  const int64_t strides[4] = {ns, cs, hs, ws};
  return set_tensor(desc, type, 4, dims, strides, "cudnnSetTensor4dDescriptorEx");
}

cudnnStatus_t hiber_entry::cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc,
                                                      cudnnDataType_t type, int rank,
                                                      const int dim_a[], const int stride_a[]) {
  if (dim_a == nullptr || stride_a == nullptr || rank < 1 || rank > wdnn::kMaxDims)
    return bad_param("cudnnSetTensorNdDescriptor", "bad nbDims or NULL arrays");
  int64_t dims[wdnn::kMaxDims], strides[wdnn::kMaxDims];
  std::copy(dim_a, dim_a + rank, dims);
  std::copy(stride_a, stride_a + rank, strides);
  return set_tensor(desc, type, rank, dims, strides, "cudnnSetTensorNdDescriptor");
}

cudnnStatus_t hiber_entry::cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t desc,
                                                        cudnnTensorFormat_t format,
                                                        cudnnDataType_t type, int rank,
                                                        const int dim_a[]) {
  if (dim_a == nullptr || rank < 3 || rank > wdnn::kMaxDims)
    return bad_param("cudnnSetTensorNdDescriptorEx", "bad nbDims or NULL dimensions");
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return not_supported("cudnnSetTensorNdDescriptorEx",
                         "tensor format " + std::to_string(format) + " (NCHW and NHWC only)");
  int64_t dims[wdnn::kMaxDims], strides[wdnn::kMaxDims];
  std::copy(dim_a, dim_a + rank, dims);
  packed_strides(rank, dims, format == CUDNN_TENSOR_NHWC, strides);
  return set_tensor(desc, type, rank, dims, strides, "cudnnSetTensorNdDescriptorEx");
}

cudnnStatus_t hiber_entry::cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t desc,
                                                      cudnnDataType_t* type, int* n, int* c, int* h,
                                                      int* w, int* ns, int* cs, int* hs, int* ws) {
  const auto* s = shape_of(desc, "cudnnGetTensor4dDescriptor", "tensorDesc");
  if (s == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (s->rank != 4) return bad_param("cudnnGetTensor4dDescriptor", "the descriptor is not 4-d");
  int* dims[4] = {n, c, h, w};
  int* strides[4] = {ns, cs, hs, ws};
  if (type != nullptr) *type = static_cast<cudnnDataType_t>(s->data_type);
  for (int i = 0; i < 4; ++i) {
    if (dims[i] != nullptr) *dims[i] = static_cast<int>(s->dims[i]);
    if (strides[i] != nullptr) *strides[i] = static_cast<int>(s->strides[i]);
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t desc,
                                                      int requested, cudnnDataType_t* type,
                                                      int* rank, int dim_a[], int stride_a[]) {
  const auto* s = shape_of(desc, "cudnnGetTensorNdDescriptor", "tensorDesc");
  if (s == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (type != nullptr) *type = static_cast<cudnnDataType_t>(s->data_type);
  if (rank != nullptr) *rank = s->rank;
  for (int i = 0; i < std::min(requested, s->rank); ++i) {
    if (dim_a != nullptr) dim_a[i] = static_cast<int>(s->dims[i]);
    if (stride_a != nullptr) stride_a[i] = static_cast<int>(s->strides[i]);
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnGetTensorSizeInBytes(const cudnnTensorDescriptor_t desc,
                                                     size_t* size) {
  const auto* s = shape_of(desc, "cudnnGetTensorSizeInBytes", "tensorDesc");
  if (s == nullptr || size == nullptr) return CUDNN_STATUS_BAD_PARAM;
  auto bytes = wdnn::tensor_extent(wdnn::as_tensor(*s));
  if (!bytes.ok()) return fail("cudnnGetTensorSizeInBytes", bytes.status());
  *size = *bytes;
  return CUDNN_STATUS_SUCCESS;
}

// ---- Filter descriptors (kept for programs that describe filters this way) ----
cudnnStatus_t hiber_entry::cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  return create(filters(), desc, "cudnnCreateFilterDescriptor");
}
cudnnStatus_t hiber_entry::cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  return destroy(filters(), desc, "cudnnDestroyFilterDescriptor");
}

cudnnStatus_t hiber_entry::cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t desc,
                                                      cudnnDataType_t type,
                                                      cudnnTensorFormat_t format, int rank,
                                                      const int dims[]) {
  auto* f = filters().find(desc);
  if (f == nullptr) return bad_param("cudnnSetFilterNdDescriptor", "not a live filter descriptor");
  if (dims == nullptr || rank < 3 || rank > wdnn::kMaxDims)
    return bad_param("cudnnSetFilterNdDescriptor", "bad nbDims or NULL dimensions");
  if (!carried(type))
    return not_supported("cudnnSetFilterNdDescriptor",
                         "data type " + std::to_string(type) + " is not one Hiber carries");
  for (int i = 0; i < rank; ++i)
    if (dims[i] < 1) return bad_param("cudnnSetFilterNdDescriptor", "a dimension is below 1");
  f->data_type = type;
  f->format = format;
  f->rank = rank;
  std::copy(dims, dims + rank, f->dims);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc,
                                                      cudnnDataType_t type,
                                                      cudnnTensorFormat_t format, int k, int c,
                                                      int h, int w) {
  const int dims[4] = {k, c, h, w};
  return hiber_entry::cudnnSetFilterNdDescriptor(desc, type, format, 4, dims);
}

cudnnStatus_t hiber_entry::cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t desc,
                                                      int requested, cudnnDataType_t* type,
                                                      cudnnTensorFormat_t* format, int* rank,
                                                      int dims[]) {
  auto* f = filters().find(desc);
  if (f == nullptr) return bad_param("cudnnGetFilterNdDescriptor", "not a live filter descriptor");
  if (type != nullptr) *type = static_cast<cudnnDataType_t>(f->data_type);
  if (format != nullptr) *format = static_cast<cudnnTensorFormat_t>(f->format);
  if (rank != nullptr) *rank = f->rank;
  for (int i = 0; dims != nullptr && i < std::min(requested, f->rank); ++i) dims[i] = f->dims[i];
  return CUDNN_STATUS_SUCCESS;
}

// ---- Pooling ----
cudnnStatus_t hiber_entry::cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* desc) {
  return create(poolings(), desc, "cudnnCreatePoolingDescriptor");
}
cudnnStatus_t hiber_entry::cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t desc) {
  return destroy(poolings(), desc, "cudnnDestroyPoolingDescriptor");
}

cudnnStatus_t hiber_entry::cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t desc,
                                                       const cudnnPoolingMode_t mode,
                                                       const cudnnNanPropagation_t nan, int rank,
                                                       const int window[], const int pad[],
                                                       const int stride[]) {
  auto* p = poolings().find(desc);
  if (p == nullptr)
    return bad_param("cudnnSetPoolingNdDescriptor", "not a live pooling descriptor");
  if (rank < 1 || rank > wdnn::kMaxSpatial || window == nullptr || pad == nullptr ||
      stride == nullptr)
    return bad_param("cudnnSetPoolingNdDescriptor", "nbDims must be 1 to 3, arrays non-NULL");
  if (mode < 0 || mode > 3)
    return bad_param("cudnnSetPoolingNdDescriptor", "mode " + std::to_string(mode));
  for (int i = 0; i < rank; ++i)
    if (window[i] < 1 || pad[i] < 0 || stride[i] < 1)
      return bad_param("cudnnSetPoolingNdDescriptor", "window, padding or stride out of range");
  *p = {};
  p->mode = mode;
  p->nan_propagation = nan;
  p->spatial = rank;
  for (int i = 0; i < rank; ++i) {
    p->window[i] = window[i];
    p->pad[i] = pad[i];
    p->stride[i] = stride[i];
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t desc,
                                                       cudnnPoolingMode_t mode,
                                                       cudnnNanPropagation_t nan, int wh, int ww,
                                                       int vpad, int hpad, int vstride,
                                                       int hstride) {
  const int window[2] = {wh, ww}, pad[2] = {vpad, hpad}, stride[2] = {vstride, hstride};
  return hiber_entry::cudnnSetPoolingNdDescriptor(desc, mode, nan, 2, window, pad, stride);
}

cudnnStatus_t hiber_entry::cudnnGetPoolingNdForwardOutputDim(const cudnnPoolingDescriptor_t desc,
                                                             const cudnnTensorDescriptor_t input,
                                                             int rank, int out[]) {
  auto* p = poolings().find(desc);
  const auto* s = shape_of(input, "cudnnGetPoolingNdForwardOutputDim", "inputTensorDesc");
  if (p == nullptr || s == nullptr || out == nullptr || rank != s->rank || rank != p->spatial + 2)
    return bad_param("cudnnGetPoolingNdForwardOutputDim", "descriptors or nbDims do not agree");
  out[0] = static_cast<int>(s->dims[0]);
  out[1] = static_cast<int>(s->dims[1]);
  for (int i = 0; i < p->spatial; ++i)
    out[2 + i] =
        static_cast<int>(wdnn::pooled_dim(s->dims[2 + i], p->window[i], p->pad[i], p->stride[i]));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t desc,
                                                             const cudnnTensorDescriptor_t input,
                                                             int* n, int* c, int* h, int* w) {
  int out[4];
  const cudnnStatus_t s = hiber_entry::cudnnGetPoolingNdForwardOutputDim(desc, input, 4, out);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (n == nullptr || c == nullptr || h == nullptr || w == nullptr)
    return bad_param("cudnnGetPooling2dForwardOutputDim", "an output pointer is NULL");
  *n = out[0];
  *c = out[1];
  *h = out[2];
  *w = out[3];
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnPoolingForward(cudnnHandle_t handle,
                                               const cudnnPoolingDescriptor_t desc,
                                               const void* alpha,
                                               const cudnnTensorDescriptor_t x_desc, const void* x,
                                               const void* beta,
                                               const cudnnTensorDescriptor_t y_desc, void* y) {
  constexpr const char* kCall = "cudnnPoolingForward";
  auto* p = poolings().find(desc);
  if (p == nullptr || p->spatial == 0)
    return bad_param(kCall, "not a live, set pooling descriptor");
  const auto* xs = shape_of(x_desc, kCall, "xDesc");
  const auto* ys = shape_of(y_desc, kCall, "yDesc");
  if (xs == nullptr || ys == nullptr) return CUDNN_STATUS_BAD_PARAM;
  wdnn::Pooling op;
  op.x = *xs;
  op.y = *ys;
  op.x_ptr = address(x);
  op.y_ptr = address(y);
  if (!read_scalars(alpha, beta, ys->data_type, &op.alpha, &op.beta))
    return bad_param(kCall, "alpha or beta is NULL");
  op.mode = p->mode;
  op.nan_propagation = p->nan_propagation;
  op.spatial = p->spatial;
  std::copy(p->window, p->window + wdnn::kMaxSpatial, op.window);
  std::copy(p->pad, p->pad + wdnn::kMaxSpatial, op.pad);
  std::copy(p->stride, p->stride + wdnn::kMaxSpatial, op.stride);
  return submit(handle, op, kCall);
}

// ---- Activation ----
cudnnStatus_t hiber_entry::cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* desc) {
  return create(activations(), desc, "cudnnCreateActivationDescriptor");
}
cudnnStatus_t hiber_entry::cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t desc) {
  return destroy(activations(), desc, "cudnnDestroyActivationDescriptor");
}

cudnnStatus_t hiber_entry::cudnnSetActivationDescriptor(cudnnActivationDescriptor_t desc,
                                                        cudnnActivationMode_t mode,
                                                        cudnnNanPropagation_t nan, double coef) {
  auto* a = activations().find(desc);
  if (a == nullptr)
    return bad_param("cudnnSetActivationDescriptor", "not a live activation descriptor");
  if (mode < 0 || mode > 6)
    return bad_param("cudnnSetActivationDescriptor", "mode " + std::to_string(mode));
  a->mode = mode;
  a->nan_propagation = nan;
  a->coef = coef;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t desc,
                                                        cudnnActivationMode_t* mode,
                                                        cudnnNanPropagation_t* nan, double* coef) {
  auto* a = activations().find(desc);
  if (a == nullptr)
    return bad_param("cudnnGetActivationDescriptor", "not a live activation descriptor");
  if (mode != nullptr) *mode = static_cast<cudnnActivationMode_t>(a->mode);
  if (nan != nullptr) *nan = static_cast<cudnnNanPropagation_t>(a->nan_propagation);
  if (coef != nullptr) *coef = a->coef;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnSetActivationDescriptorSwishBeta(cudnnActivationDescriptor_t desc,
                                                                 double beta) {
  auto* a = activations().find(desc);
  if (a == nullptr)
    return bad_param("cudnnSetActivationDescriptorSwishBeta", "not a live activation descriptor");
  a->swish_beta = beta;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnActivationForward(cudnnHandle_t handle,
                                                  cudnnActivationDescriptor_t desc,
                                                  const void* alpha,
                                                  const cudnnTensorDescriptor_t x_desc,
                                                  const void* x, const void* beta,
                                                  const cudnnTensorDescriptor_t y_desc, void* y) {
  constexpr const char* kCall = "cudnnActivationForward";
  auto* a = activations().find(desc);
  if (a == nullptr) return bad_param(kCall, "not a live activation descriptor");
  const auto* xs = shape_of(x_desc, kCall, "xDesc");
  const auto* ys = shape_of(y_desc, kCall, "yDesc");
  if (xs == nullptr || ys == nullptr) return CUDNN_STATUS_BAD_PARAM;
  wdnn::Activation op;
  op.x = *xs;
  op.y = *ys;
  op.x_ptr = address(x);
  op.y_ptr = address(y);
  if (!read_scalars(alpha, beta, ys->data_type, &op.alpha, &op.beta))
    return bad_param(kCall, "alpha or beta is NULL");
  op.mode = a->mode;
  op.nan_propagation = a->nan_propagation;
  op.coef = a->mode == CUDNN_ACTIVATION_SWISH ? a->swish_beta : a->coef;
  return submit(handle, op, kCall);
}

// ---- Softmax, add tensor, batch-norm inference ----
cudnnStatus_t hiber_entry::cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo,
                                               cudnnSoftmaxMode_t mode, const void* alpha,
                                               const cudnnTensorDescriptor_t x_desc, const void* x,
                                               const void* beta,
                                               const cudnnTensorDescriptor_t y_desc, void* y) {
  constexpr const char* kCall = "cudnnSoftmaxForward";
  const auto* xs = shape_of(x_desc, kCall, "xDesc");
  const auto* ys = shape_of(y_desc, kCall, "yDesc");
  if (xs == nullptr || ys == nullptr) return CUDNN_STATUS_BAD_PARAM;
  wdnn::Softmax op;
  op.x = *xs;
  op.y = *ys;
  op.x_ptr = address(x);
  op.y_ptr = address(y);
  if (!read_scalars(alpha, beta, ys->data_type, &op.alpha, &op.beta))
    return bad_param(kCall, "alpha or beta is NULL");
  op.algorithm = algo;
  op.mode = mode;
  return submit(handle, op, kCall);
}

cudnnStatus_t hiber_entry::cudnnAddTensor(cudnnHandle_t handle, const void* alpha,
                                          const cudnnTensorDescriptor_t a_desc, const void* a,
                                          const void* beta, const cudnnTensorDescriptor_t c_desc,
                                          void* c) {
  constexpr const char* kCall = "cudnnAddTensor";
  const auto* as = shape_of(a_desc, kCall, "aDesc");
  const auto* cs = shape_of(c_desc, kCall, "cDesc");
  if (as == nullptr || cs == nullptr) return CUDNN_STATUS_BAD_PARAM;
  wdnn::AddTensor op;
  op.a = *as;
  op.c = *cs;
  op.a_ptr = address(a);
  op.c_ptr = address(c);
  if (!read_scalars(alpha, beta, cs->data_type, &op.alpha, &op.beta))
    return bad_param(kCall, "alpha or beta is NULL");
  return submit(handle, op, kCall);
}

cudnnStatus_t hiber_entry::cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t y_desc,
    void* y, const cudnnTensorDescriptor_t bn_desc, const void* scale, const void* bias,
    const void* mean, const void* variance, double epsilon) {
  constexpr const char* kCall = "cudnnBatchNormalizationForwardInference";
  const auto* xs = shape_of(x_desc, kCall, "xDesc");
  const auto* ys = shape_of(y_desc, kCall, "yDesc");
  const auto* bs = shape_of(bn_desc, kCall, "bnScaleBiasMeanVarDesc");
  if (xs == nullptr || ys == nullptr || bs == nullptr) return CUDNN_STATUS_BAD_PARAM;
  wdnn::BatchNormInference op;
  op.x = *xs;
  op.y = *ys;
  op.bn = *bs;
  op.x_ptr = address(x);
  op.y_ptr = address(y);
  op.scale = address(scale);
  op.bias = address(bias);
  op.mean = address(mean);
  op.variance = address(variance);
  if (!read_scalars(alpha, beta, ys->data_type, &op.alpha, &op.beta))
    return bad_param(kCall, "alpha or beta is NULL");
  op.epsilon = epsilon;
  op.mode = mode;
  if (op.x_ptr == 0 || op.y_ptr == 0 || op.scale == 0 || op.bias == 0 || op.mean == 0 ||
      op.variance == 0)
    return bad_param(kCall, "a data pointer is NULL");
  return submit(handle, op, kCall);
}
