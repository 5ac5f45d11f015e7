// The CUDA programs on a real GPU: every program of tests/shim/programs runs natively (the real
// libcudart.so.13 and driver) and then through the shim against hiberd --device=cuda; both runs
// must succeed and print the same summary line (it holds a checksum of the results).
// Skips with one line where there is no usable GPU: no libcuda.so.1, a libcuda.so.1 that is the
// toolkit's stub (cuInit fails with CUDA_ERROR_STUB_LIBRARY), or no device.
// The library_* programs (cuBLAS, cuBLASLt, cuDNN linked the ordinary way) are how issue 16's
// libraries are checked on a GPU: natively against the real libraries, and through the
// replacements against hiberd's CUDA backend running the real ones (server/device/
// cuda_libraries.cc). A test that needs no GPU checks that every one built is in the list.
#include <dlfcn.h>

#include <algorithm>
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

using namespace std::chrono_literals;

// Why there is no usable GPU here, or empty. The driver stays loaded: probing is done once.
std::string missing_gpu() {
  static const std::string why = []() -> std::string {
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (libcuda == nullptr) return std::string("no GPU driver: ") + dlerror();
    using InitFn = int (*)(unsigned);
    using CountFn = int (*)(int*);
    auto init = reinterpret_cast<InitFn>(dlsym(libcuda, "cuInit"));
    auto count = reinterpret_cast<CountFn>(dlsym(libcuda, "cuDeviceGetCount"));
    if (init == nullptr || count == nullptr) return "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
    if (int r = init(0); r != 0) {
      return "cuInit failed with CUresult " + std::to_string(r) +
             (r == 34 ? " (the toolkit's stub libcuda, not a driver)" : "");
    }
    int devices = 0;
    if (int r = count(&devices); r != 0 || devices == 0) return "the driver reports no GPU";
    return "";
  }();
  return why;
}

class ShimGpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (std::string why = missing_gpu(); !why.empty()) GTEST_SKIP() << why;
    if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(ShimGpuTest, MatchesTheNativeRun) {
  const std::string name = GetParam();
  // error_cases checks the errors Hiber gives for a wild copy, a destroyed stream and the like;
  // natively some of them are undefined behaviour (a crash), so it runs only through the shim,
  // where its own checks must pass.
  const bool hiber_only = name == "error_cases";
  std::string native_summary;
  if (!hiber_only) {
    auto native = run_program({program_path(name)}, 300s);
    ASSERT_EQ(native.exit_code, 0) << "native run:\n" << native.output;
    native_summary = summary_line(native.output, name);
    ASSERT_NE(native_summary, "") << native.output;
  }

  HiberdOptions options;
  options.device = "cuda";
  Hiberd hiberd(options);
  auto shimmed = run_through_shim(hiberd, {name, {}}, name);
  EXPECT_EQ(shimmed.exit_code, 0) << shimmed.output << "\nhiberd:\n" << hiberd.log();
  if (hiber_only) {
    EXPECT_NE(summary_line(shimmed.output, name), "") << shimmed.output;
  } else {
    EXPECT_EQ(summary_line(shimmed.output, name), native_summary) << shimmed.output;
  }
  auto view = hiberd.wait_for([](const StatusView& v) { return v.sessions.empty(); }, 20s);
  ASSERT_TRUE(view.ok()) << view.status() << "\n" << hiberd.log();
  EXPECT_TRUE(view->sessions.empty());
  EXPECT_EQ(view->sessions_closed, view->sessions_opened);
  for (uint64_t bytes : view->device_session_bytes) EXPECT_EQ(bytes, 0u) << "device memory leaked";
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// Every library program built runs here: one added to tests/shim/CMakeLists.txt but not to
// all_programs() would otherwise never meet the real libraries.
TEST(ShimGpuPrograms, EveryLibraryProgramIsInTheList) {
  const std::filesystem::path dir = std::filesystem::path(program_path("x")).parent_path();
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  const auto& listed = all_programs();
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("library_", 0) != 0 || entry.path().has_extension()) continue;
    ++found;
    EXPECT_NE(std::find(listed.begin(), listed.end(), name), listed.end())
        << name << " is built but not in all_programs() (tests/shim/shim_runner.cc)";
  }
  EXPECT_GT(found, 0) << "no library_* program in " << dir;
}

INSTANTIATE_TEST_SUITE_P(Programs, ShimGpuTest, ::testing::ValuesIn(all_programs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace hiber::testing::shim
