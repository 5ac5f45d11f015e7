// cuDNN's operations computed on the host, for the simulated GPU (dnn_host.cc runs them in stream
// order) and for the unit tests that compare them with a reference of their own. Pointers are
// host addresses (the simulated GPU's device pointers are). Arithmetic: fp32 accumulation for
// fp32, fp16 and bf16 data (as cuDNN's FLOAT compute type), double for double data; results are
// rounded to each output tensor's declared data type, to nearest even.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "library_ops/dnn_ops.h"

namespace hiber::device::sim {

// Whether the host engine (global index 0) runs `graph`: any acyclic graph of matmuls, pointwise
// operations, reductions and layer/RMS norms with at most one convolution forward (what cuDNN's
// fusion engines run: a convolution or matmul with pointwise ops around it, softmax as
// reductions and pointwise ops, attention as two matmuls with a softmax between them), each
// operation run whole in dependency order, virtual tensors held in host memory in their declared
// data type (at most kMaxVirtualBytes of them). kNotSupported naming what otherwise.
inline constexpr uint64_t kMaxVirtualBytes = uint64_t{1} << 30;
Status host_engine_supports(const library_ops::dnn::OpGraph& graph);
// Runs `graph` (host_engine_supports) with tensor i at bound[i].ptr.
Status run_op_graph(const library_ops::dnn::OpGraph& graph,
                    std::span<const library_ops::dnn::Bound> bound);

// The legacy calls, checked by library_ops::dnn::check_op first.
void batch_norm_inference(const library_ops::dnn::BatchNormInference& op);
void pooling_forward(const library_ops::dnn::Pooling& op);
void activation_forward(const library_ops::dnn::Activation& op);
void softmax_forward(const library_ops::dnn::Softmax& op);
void add_tensor(const library_ops::dnn::AddTensor& op);

}  // namespace hiber::device::sim
