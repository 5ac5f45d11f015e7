// What a context per instance costs (--isolation=context, docs/design.md "Isolation modes"), on
// the device layer itself: making and destroying a context, and a small synchronous operation
// (a 4 KiB host-to-device copy and a synchronisation, the shape of a warm request's smallest
// step) in a created context against the same in the GPU's shared context, alone and switching
// between two contexts on one thread at every operation.
//
//   context_bench [--device=sim|cuda] [--iterations=2000] [--label=L]
//
// One RESULT line per figure: create_destroy_p50/_p99 (us per context made and destroyed),
// op_shared_p50, op_own_p50, op_switching_p50 (us per copy and synchronisation), and the ratios
// op_own_vs_shared and op_switching_vs_shared from the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "server/device/sim_device.h"
#if HIBER_HAVE_CUDA
#include "server/device/cuda_device.h"
#endif

DEFINE_string(device, "sim", "sim (simulated GPUs) or cuda (GPU 0 through the CUDA driver)");
DEFINE_int32(iterations, 2000, "Operations (and contexts) timed per figure");
DEFINE_string(label, "", "A label for the RESULT lines (default: the device)");

namespace hiber::device {
namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void result(const std::string& name, double value, const char* unit) {
  const std::string label = FLAGS_label.empty() ? FLAGS_device : FLAGS_label;
  std::printf("RESULT label=%s name=%s value=%.3f unit=%s\n", label.c_str(), name.c_str(), value,
              unit);
}

[[noreturn]] void die(const Status& status, const char* what) {
  std::fprintf(stderr, "context_bench: %s: %s\n", what, status.to_string().c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> result, const char* what) {
  if (!result.ok()) die(result.status(), what);
  return std::move(result).value();
}

void must(const Status& status, const char* what) {
  if (!status.ok()) die(status, what);
}

int run() {
  std::unique_ptr<Device> device;
  if (FLAGS_device == "sim") {
    device = must(SimDevice::create(SimDeviceOptions{}), "the simulated device");
  } else if (FLAGS_device == "cuda") {
#if HIBER_HAVE_CUDA
    device = must(create_cuda_device({}), "the CUDA device");
#else
    std::fprintf(stderr, "context_bench: built without the CUDA toolkit: --device=sim only\n");
    return 2;
#endif
  } else {
    std::fprintf(stderr, "context_bench: --device must be sim or cuda, not '%s'\n",
                 FLAGS_device.c_str());
    return 2;
  }
  const int n = std::max(FLAGS_iterations, 1);

  std::vector<double> lifetimes;
  for (int i = 0; i < n; ++i) {
    const Clock::time_point start = Clock::now();
    const Context c = must(device->create_context(0), "create_context");
    must(device->destroy_context(c), "destroy_context");
    lifetimes.push_back(micros(Clock::now() - start));
  }
  result("create_destroy_p50", percentile(lifetimes, 0.5), "us");
  result("create_destroy_p99", percentile(lifetimes, 0.99), "us");

  // 4 KiB of device memory every context's streams may use (memory is per device).
  const uint64_t g = device->allocation_granularity(0);
  const DevicePtr va = must(device->reserve_address_range(g, 0), "reserve_address_range");
  const PhysicalMemory memory = must(device->create_physical(0, g), "create_physical");
  must(device->map(va, g, memory, 0), "map");
  const int gpu0[] = {0};
  must(device->set_access(va, g, gpu0), "set_access");
  std::vector<std::byte> host(4096, std::byte{7});

  const Context own_a = must(device->create_context(0), "create_context");
  const Context own_b = must(device->create_context(0), "create_context");
  const Stream shared = must(device->create_stream(0, 0), "create_stream");
  const Stream in_a = must(device->create_stream(own_a, 0), "create_stream");
  const Stream in_b = must(device->create_stream(own_b, 0), "create_stream");
  auto op_p50 = [&](auto stream_for) {
    std::vector<double> times;
    for (int i = 0; i < n; ++i) {
      const Stream s = stream_for(i);
      const Clock::time_point start = Clock::now();
      must(device->copy_host_to_device(s, va, host.data(), host.size()), "copy");
      must(device->synchronize_stream(s), "synchronize_stream");
      times.push_back(micros(Clock::now() - start));
    }
    return percentile(times, 0.5);
  };
  const double in_shared = op_p50([&](int) { return shared; });
  const double in_own = op_p50([&](int) { return in_a; });
  const double switching = op_p50([&](int i) { return i % 2 == 0 ? in_a : in_b; });
  result("op_shared_p50", in_shared, "us");
  result("op_own_p50", in_own, "us");
  result("op_switching_p50", switching, "us");
  result("op_own_vs_shared", in_own / in_shared, "x");
  result("op_switching_vs_shared", switching / in_shared, "x");

  for (Stream s : {shared, in_a, in_b}) must(device->destroy_stream(s), "destroy_stream");
  for (Context c : {own_a, own_b}) must(device->destroy_context(c), "destroy_context");
  must(device->unmap(va, g), "unmap");
  must(device->release_physical(memory), "release_physical");
  must(device->free_address_range(va, g), "free_address_range");
  return 0;
}

}  // namespace
}  // namespace hiber::device

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "context_bench [--device=sim|cuda] [--iterations=N]: the cost of a context per instance");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return hiber::device::run();
}
