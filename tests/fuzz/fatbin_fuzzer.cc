// A code image as a client ships it to hiberd (moduleLoad) and as the shim reads its own
// program's fatbins (common/fatbin.h): image_kernels, which the simulated device and the shim
// call, and its parts (parse_fatbin, fatbin_kernels, cubin_kernels, ptx_kernels) on the same
// bytes.
//
// Promises checked: nothing crashes, leaks or hangs, and decompression costs only what the data
// delivers (libFuzzer's -rss_limit_mb and -malloc_limit_mb catch a forged size); every error is
// kInvalidImage; image_kernels' kernels are sorted by name, each once; each kernel's parameters
// lie in order without overlapping; image_kernels of a fatbin is fatbin_kernels of its entries.
#include <string_view>

#include "common/fatbin.h"
#include "tests/fuzz/fuzz_support.h"

namespace hiber {
namespace {

void check_kernels(const Result<std::vector<KernelInfo>>& kernels, bool sorted) {
  if (!kernels.ok()) {
    CHECK_EQ(static_cast<int>(kernels.status().code()), static_cast<int>(ErrorCode::kInvalidImage))
        << kernels.status();
    return;
  }
  for (size_t i = 0; i < kernels->size(); ++i) {
    const KernelInfo& kernel = (*kernels)[i];
    if (sorted && i > 0) CHECK_LT((*kernels)[i - 1].name, kernel.name) << "not sorted, or twice";
    uint64_t end = 0;
    for (const ParamInfo& param : kernel.params) {
      CHECK_GE(param.offset, end) << kernel.name << ": parameters overlap or are out of order";
      end = uint64_t{param.offset} + param.bytes;
    }
  }
}

}  // namespace
}  // namespace hiber

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hiber::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fatbin = hiber::fatbin;
  using hiber::check_kernels;
  const auto image = hiber::fuzz::bytes_of(data, size);
  const auto kernels = fatbin::image_kernels(image);
  check_kernels(kernels, /*sorted=*/true);
  if (fatbin::is_fatbin(image)) {
    const auto entries = fatbin::parse_fatbin(image);
    if (entries.ok()) {
      const auto merged = fatbin::fatbin_kernels(*entries);
      CHECK_EQ(merged.ok(), kernels.ok());
      if (merged.ok()) CHECK(*merged == *kernels);
      // Each entry alone, as the simulated device reads the one it picks.
      for (const fatbin::CodeEntry& entry : *entries) {
        if (entry.kind == fatbin::CodeKind::kCubin) {
          check_kernels(fatbin::cubin_kernels(entry.code), /*sorted=*/false);
        } else {
          const std::string_view text(reinterpret_cast<const char*>(entry.code.data()),
                                      entry.code.size());
          check_kernels(fatbin::ptx_kernels(text), /*sorted=*/false);
        }
      }
    } else {
      CHECK(!kernels.ok()) << "image_kernels read a fatbin that parse_fatbin refuses";
    }
  } else if (fatbin::is_elf(image)) {
    check_kernels(fatbin::cubin_kernels(image), /*sorted=*/false);
  } else {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    check_kernels(fatbin::ptx_kernels(text), /*sorted=*/false);
  }
  return 0;
}
