// cuBLAS and cuBLASLt on the simulated GPU: host implementations of the operations of
// wire/blas_ops.h, run in stream order (SimDevice::enqueue_host_work).
//
// GEMM: fp32, fp64, fp16 and bf16 data; fp16 and bf16 accumulate in fp32 as the GPU's
// tensor-core paths do (fp64 in fp64), and results are rounded to nearest even once, at the
// store. Transposes, strided batches and pointer-array batches. Anything else answers
// kNotSupported, naming what.
#pragma once

#include <memory>

#include "server/device/library.h"

namespace hiber::device {
class SimDevice;
namespace sim {

std::unique_ptr<LibraryBackend> make_blas_backend(SimDevice& device);

}  // namespace sim
}  // namespace hiber::device
