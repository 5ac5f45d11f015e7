// A simulated device for unit tests: the default node with `gpu_bytes` of memory per GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "server/device/sim_device.h"

namespace hiber::testing {

inline std::unique_ptr<::hiber::device::SimDevice> sim_device_for_test(uint64_t gpu_bytes) {
  ::hiber::device::SimDeviceOptions options;
  for (GpuSpec& gpu : options.node.gpus) gpu.memory_bytes = gpu_bytes;
  auto device = ::hiber::device::SimDevice::create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

}  // namespace hiber::testing
