// cuDNN on the simulated GPU: host implementations of the operations of wire/dnn_ops.h, run in
// stream order (SimDevice::enqueue_host_work). Anything else answers kNotSupported, naming what.
#pragma once

#include <memory>

#include "server/device/library.h"

namespace hiber::device {
class SimDevice;
namespace sim {

std::unique_ptr<LibraryBackend> make_dnn_backend(SimDevice& device);

}  // namespace sim
}  // namespace hiber::device
