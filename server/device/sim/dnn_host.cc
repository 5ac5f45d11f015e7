#include "server/device/sim/dnn_host.h"

#include "server/device/sim_device.h"

namespace hiber::device::sim {
namespace {

class SimDnn final : public LibraryBackend {
 public:
  explicit SimDnn(SimDevice& device) : device_(device) {}

  Status run(Stream, const LibraryCall& call) override {
    return error(ErrorCode::kNotSupported, "cuDNN operation ", static_cast<unsigned>(call.op),
                 " has no host implementation on the simulated GPU");
  }
  Result<std::vector<std::byte>> answer(int, const LibraryCall& call) override {
    return error(ErrorCode::kNotSupported, "cuDNN query ", static_cast<unsigned>(call.op),
                 " has no host implementation on the simulated GPU");
  }
  void release(uint64_t, std::optional<wire::LibraryHandle>) override {}

 private:
  [[maybe_unused]] SimDevice& device_;
};

}  // namespace

std::unique_ptr<LibraryBackend> make_dnn_backend(SimDevice& device) {
  return std::make_unique<SimDnn>(device);
}

}  // namespace hiber::device::sim
