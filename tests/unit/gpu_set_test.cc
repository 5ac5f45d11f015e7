// GpuSet: the set of GPUs a lease names, checked against a std::set kept beside it.
#include "common/gpu_set.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <vector>

namespace hiber {
namespace {

TEST(GpuSetTest, HoldsWhatWasInsertedInIncreasingOrder) {
  GpuSet set;
  std::set<int> reference;
  EXPECT_TRUE(set.empty());
  for (int gpu : {5, 0, 63, 17, 5, 42}) {
    set.insert(GpuId{gpu});
    reference.insert(gpu);
  }
  set.erase(GpuId{17});
  reference.erase(17);
  set.erase(GpuId{3});  // not there: nothing changes
  EXPECT_EQ(set.size(), static_cast<int>(reference.size()));
  std::vector<GpuId> expected;
  for (int gpu : reference) expected.push_back(GpuId{gpu});
  EXPECT_EQ(set.gpus(), expected);
  EXPECT_EQ(set.first(), GpuId{0});
  for (int gpu = 0; gpu < GpuSet::kMaxGpus; ++gpu) {
    EXPECT_EQ(set.contains(GpuId{gpu}), reference.count(gpu) != 0) << gpu;
  }
  std::ostringstream text;
  text << set;
  EXPECT_EQ(text.str(), "{0,5,42,63}");
}

TEST(GpuSetTest, OneGpuIsItsOwnFirst) {
  const GpuSet one = GpuSet::of(GpuId{7});
  EXPECT_EQ(one.size(), 1);
  EXPECT_EQ(one.first(), GpuId{7});
  EXPECT_EQ(one, GpuSet::of(GpuId{7}));
  EXPECT_NE(one, GpuSet::of(GpuId{6}));
  std::ostringstream text;
  text << GpuSet();
  EXPECT_EQ(text.str(), "{}");
}

}  // namespace
}  // namespace hiber
