// The test kernels of test_kernels.cu: parameter types shared by the CUDA source and the host
// implementations, and (for host code) each kernel's mangled name and expected parameter layout.
//
// The expected layouts are written out by hand from the CUDA ABI, not read back from a fatbin:
// each parameter sits at the next multiple of its alignment (natural alignment for scalars and
// pointers, the largest member's for aggregates), and the buffer ends at the end of the last one.
#pragma once

// 24 bytes, 8-aligned, with 3 bytes of padding after `c`.
struct OddStruct {
  double d;
  char c;
  int a[3];
};

// 128 bytes, 4-aligned.
struct BigStruct {
  float v[32];
};

#ifndef __CUDACC__

#include <algorithm>
#include <string>
#include <vector>

#include "common/kernel_info.h"

namespace hiber::test_kernels {

static_assert(sizeof(OddStruct) == 24 && alignof(OddStruct) == 8);
static_assert(sizeof(BigStruct) == 128 && alignof(BigStruct) == 4);

inline constexpr const char kVecAdd[] = "_Z7vec_addPKfS0_Pfi";
inline constexpr const char kSaxpy[] = "_Z5saxpyfPKfPfi";
inline constexpr const char kIotaU64[] = "_Z8iota_u64Pyyy";
inline constexpr const char kOddParams[] = "_Z10odd_paramsc9OddStructsPi";
inline constexpr const char kBigParam[] = "_Z9big_param9BigStructPf";
inline constexpr const char kSumI32[] = "_Z7sum_i32PKiyPy";
inline constexpr const char kGatherPtrs[] = "_Z11gather_ptrsPKPiiS_";
inline constexpr const char kWriteValue[] = "_Z11write_valuePii";
inline constexpr const char kScatterValue[] = "_Z13scatter_valuePKPiii";
inline constexpr const char kScaleFloat[] = "_Z5scaleIfEvPT_S0_j";
inline constexpr const char kScaleDouble[] = "_Z5scaleIdEvPT_S0_j";
inline constexpr const char kFillBytesC[] = "fill_bytes_c";
inline constexpr const char kNoop[] = "_Z4noopv";
inline constexpr const char kSpinUntil[] = "_Z10spin_untilPVKj";

// Every kernel of test_kernels.cu, sorted by mangled name (as image_kernels() returns them).
inline std::vector<KernelInfo> expected_kernels() {
  std::vector<KernelInfo> kernels = {
      {kVecAdd, {{0, 8}, {8, 8}, {16, 8}, {24, 4}}},
      {kSaxpy, {{0, 4}, {8, 8}, {16, 8}, {24, 4}}},
      {kIotaU64, {{0, 8}, {8, 8}, {16, 8}}},
      {kOddParams, {{0, 1}, {8, 24}, {32, 2}, {40, 8}}},
      {kBigParam, {{0, 128}, {128, 8}}},
      {kSumI32, {{0, 8}, {8, 8}, {16, 8}}},
      {kGatherPtrs, {{0, 8}, {8, 4}, {16, 8}}},
      {kWriteValue, {{0, 8}, {8, 4}}},
      {kScatterValue, {{0, 8}, {8, 4}, {12, 4}}},
      {kScaleFloat, {{0, 8}, {8, 4}, {12, 4}}},
      {kScaleDouble, {{0, 8}, {8, 8}, {16, 4}}},
      {kFillBytesC, {{0, 8}, {8, 1}, {16, 8}}},
      {kNoop, {}},
      {kSpinUntil, {{0, 8}}},
  };
  std::sort(kernels.begin(), kernels.end(),
            [](const KernelInfo& a, const KernelInfo& b) { return a.name < b.name; });
  return kernels;
}

// The expected layout of one kernel; an empty name if there is no such test kernel.
inline KernelInfo expected_kernel(const std::string& name) {
  for (KernelInfo& k : expected_kernels())
    if (k.name == name) return k;
  return {};
}

}  // namespace hiber::test_kernels

#endif  // __CUDACC__
