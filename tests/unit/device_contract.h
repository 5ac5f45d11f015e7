// The behavioural suite every Device backend passes (server/device/device.h).
//
// device_contract.cc holds the tests; a binary that compiles it instantiates them for a backend:
//
//   INSTANTIATE_TEST_SUITE_P(Sim, DeviceContractTest,
//                            ::testing::Values(DeviceUnderTest{"Sim", create_sim, fatbin_path}),
//                            device_test_name);
//
// The tests use only behaviour both backends share: anything that would leave a real GPU's
// context broken (illegal addresses, failing kernels) or that only the simulator can observe
// (host pointers, throttling, handle checks) is tested per backend instead.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "server/device/device.h"

namespace hiber::device::testing {
inline Status status_of(Status status) { return status; }
template <typename T>
Status status_of(const Result<T>& result) {
  return result.status();
}
}  // namespace hiber::device::testing

// Checks of a Status or Result that print the error; more context can be streamed in (<<).
#define HIBER_EXPECT_OK(expr)                                                            \
  switch (0)                                                                             \
  case 0:                                                                                \
  default:                                                                               \
    if (const ::hiber::Status hiber_status_ = ::hiber::device::testing::status_of(expr); \
        hiber_status_.ok()) {                                                            \
    } else                                                                               \
      ADD_FAILURE() << #expr << ": " << hiber_status_ << " "
#define HIBER_ASSERT_OK(expr)                                                            \
  switch (0)                                                                             \
  case 0:                                                                                \
  default:                                                                               \
    if (const ::hiber::Status hiber_status_ = ::hiber::device::testing::status_of(expr); \
        hiber_status_.ok()) {                                                            \
    } else                                                                               \
      FAIL() << #expr << ": " << hiber_status_ << " "
// An error of exactly `expected_code`.
#define HIBER_EXPECT_CODE(expr, expected_code)                                           \
  switch (0)                                                                             \
  case 0:                                                                                \
  default:                                                                               \
    if (const ::hiber::Status hiber_status_ = ::hiber::device::testing::status_of(expr); \
        hiber_status_.code() == (expected_code)) {                                       \
    } else                                                                               \
      ADD_FAILURE() << #expr << ": expected " << ::hiber::error_code_name(expected_code) \
                    << ", got " << hiber_status_ << " "
// `lhs = value of expr`, or a fatal failure printing its error.
#define HIBER_ASSERT_OK_AND_ASSIGN(lhs, expr)                              \
  auto HIBER_CONCAT_(hiber_result_, __LINE__) = (expr);                    \
  ASSERT_TRUE(HIBER_CONCAT_(hiber_result_, __LINE__).ok())                 \
      << #expr << ": " << HIBER_CONCAT_(hiber_result_, __LINE__).status(); \
  lhs = std::move(HIBER_CONCAT_(hiber_result_, __LINE__)).value()

namespace hiber::device::testing {

struct DeviceUnderTest {
  std::string name;  // for test names: "Sim", "Cuda"
  // Creates the device. An error with code kNoDevice, kStubLibrary or kNotInitialized means
  // "no GPU here": the tests skip with one line saying why. Any other error fails.
  std::function<Result<std::unique_ptr<Device>>()> create;
  // Path of tests/kernels' fatbin, or empty if the toolkit was absent at build time (kernel
  // tests skip).
  std::string kernels_fatbin;
};

// Test-name generator for INSTANTIATE_TEST_SUITE_P: the DeviceUnderTest's name.
std::string device_test_name(const ::testing::TestParamInfo<DeviceUnderTest>& info);
// So that gtest prints a parameter as its name.
void PrintTo(const DeviceUnderTest& device, std::ostream* out);

class DeviceContractTest : public ::testing::TestWithParam<DeviceUnderTest> {
 protected:
  // Device memory mapped at its own reserved range and accessible from the GPUs asked for.
  struct Allocation {
    DevicePtr va = 0;
    uint64_t bytes = 0;  // a multiple of the allocation granularity
    PhysicalMemory memory;
  };

  void SetUp() override;
  // Waits for every stream made by the helpers below, then frees what they made.
  void TearDown() override;

  // `bytes` rounded up to the granularity; accessible from `access` (default: just `gpu`).
  Allocation allocate(int gpu, uint64_t bytes, std::vector<int> access = {});
  Stream make_stream(int gpu, int priority = 0);
  Event make_event(int gpu, bool disable_timing = false);
  // The test kernels' module; the test skips if there is no fatbin.
  Module load_test_kernels();
  Function function(Module module, const std::string& name);

  // Synchronous helpers on `stream` (they synchronize it).
  void upload(Stream stream, DevicePtr dst, std::span<const std::byte> data);
  std::vector<std::byte> download(Stream stream, DevicePtr src, uint64_t bytes);

  std::unique_ptr<Device> device_;

 private:
  std::vector<Allocation> allocations_;
  std::vector<Stream> streams_;
  std::vector<Event> events_;
  std::vector<Module> modules_;
};

// A kernel's packed parameter buffer, filled in declaration order at the offsets function_info
// gives; checks that each value has the size the kernel expects.
class KernelParams {
 public:
  explicit KernelParams(KernelInfo info);
  template <typename T>
  KernelParams& add(const T& value) {
    place(&value, sizeof(T));
    return *this;
  }
  std::span<const std::byte> bytes() const { return buffer_; }

 private:
  void place(const void* value, size_t size);
  KernelInfo info_;
  std::vector<std::byte> buffer_;
  size_t next_ = 0;
};

}  // namespace hiber::device::testing
