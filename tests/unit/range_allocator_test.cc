#include "client_shim/range_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace hiber::shim {
namespace {

TEST(RangeAllocatorTest, AllocatesAlignedFirstFit) {
  RangeAllocator a(0x1000, 0x10000, 0x100);
  auto x = a.allocate(1);
  auto y = a.allocate(0x101);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x, 0x1000u);
  EXPECT_EQ(*y, 0x1100u);
  EXPECT_EQ(a.size_of(*y), 0x200u);
  EXPECT_EQ(a.allocated_bytes(), 0x300u);
  EXPECT_FALSE(a.allocate(0));
}

TEST(RangeAllocatorTest, RefusesWhatDoesNotFitAndOverflow) {
  RangeAllocator a(0, 0x1000, 0x100);
  EXPECT_FALSE(a.allocate(0x1001));
  EXPECT_FALSE(a.allocate(~uint64_t{0}));
  EXPECT_TRUE(a.allocate(0x1000));
  EXPECT_FALSE(a.allocate(1));
}

TEST(RangeAllocatorTest, FreeCoalescesNeighbours) {
  RangeAllocator a(0, 0x400, 0x100);
  auto p0 = *a.allocate(0x100), p1 = *a.allocate(0x100), p2 = *a.allocate(0x100);
  auto p3 = *a.allocate(0x100);
  EXPECT_FALSE(a.allocate(0x100));
  EXPECT_EQ(a.free(p1), 0x100u);
  EXPECT_EQ(a.free(p2), 0x100u);
  // p1 and p2 merged: 0x200 fits where they were.
  EXPECT_EQ(*a.allocate(0x200), p1);
  EXPECT_EQ(a.free(p0), 0x100u);
  EXPECT_EQ(a.free(p3), 0x100u);
  EXPECT_EQ(a.free(p1), 0x200u);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(*a.allocate(0x400), 0u);
}

TEST(RangeAllocatorTest, FreeOfUnknownOrInteriorAddressChangesNothing) {
  RangeAllocator a(0, 0x1000, 0x100);
  auto p = *a.allocate(0x200);
  EXPECT_EQ(a.free(p + 0x100), 0u);
  EXPECT_EQ(a.free(0x800), 0u);
  EXPECT_EQ(a.allocated_bytes(), 0x200u);
  EXPECT_EQ(a.free(p), 0x200u);
  EXPECT_EQ(a.free(p), 0u);  // double free
}

TEST(RangeAllocatorTest, FindsTheRangeHoldingAnAddress) {
  RangeAllocator a(0x10000, 0x10000, 0x1000);
  auto p = *a.allocate(0x1800);
  auto found = a.find(p + 0x17ff);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->first, p);
  EXPECT_EQ(found->second, 0x2000u);
  EXPECT_FALSE(a.find(p + 0x2000));
  EXPECT_FALSE(a.find(p - 1));
}

TEST(RangeAllocatorTest, UnalignedBaseUsesOnlyWholeUnits) {
  RangeAllocator a(0x10, 0x300, 0x100);
  auto p = a.allocate(0x100);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, 0x100u);
  EXPECT_TRUE(a.allocate(0x100));
  EXPECT_FALSE(a.allocate(0x100));  // [0x300, 0x310) is not a whole unit
}

// Random allocations and frees against a model: live ranges never overlap, stay inside, and
// everything freed is reusable.
TEST(RangeAllocatorTest, RandomisedAgainstModel) {
  constexpr uint64_t kBase = 0x100000, kBytes = 1 << 20, kAlign = 256;
  RangeAllocator a(kBase, kBytes, kAlign);
  std::map<uint64_t, uint64_t> model;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    if (model.empty() || rng() % 3 != 0) {
      const uint64_t size = 1 + rng() % 20000;
      auto p = a.allocate(size);
      if (!p) continue;
      const uint64_t rounded = (size + kAlign - 1) / kAlign * kAlign;
      ASSERT_EQ(*p % kAlign, 0u);
      ASSERT_GE(*p, kBase);
      ASSERT_LE(*p + rounded, kBase + kBytes);
      auto next = model.lower_bound(*p);
      if (next != model.end()) {
        ASSERT_LE(*p + rounded, next->first);
      }
      if (next != model.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second, *p);
      }
      model.emplace(*p, rounded);
    } else {
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      ASSERT_EQ(a.free(it->first), it->second);
      model.erase(it);
    }
  }
  for (const auto& [start, size] : model) ASSERT_EQ(a.free(start), size);
  EXPECT_EQ(a.allocated_bytes(), 0u);
  EXPECT_EQ(*a.allocate(kBytes), kBase);
}

}  // namespace
}  // namespace hiber::shim

namespace hiber::shim {
namespace {

TEST(RangeAllocatorTest, ReservedRangesAreNeverHandedOut) {
  RangeAllocator a(0, 0x1000, 0x100);
  a.reserve(0x180, 0x100);  // widened to [0x100, 0x300)
  a.reserve(0x200, 0x80);   // already reserved: nothing changes
  std::vector<uint64_t> got;
  while (auto p = a.allocate(0x100)) got.push_back(*p);
  EXPECT_EQ(got.size(), 14u);
  for (uint64_t p : got) EXPECT_TRUE(p < 0x100 || p >= 0x300) << p;
  EXPECT_EQ(a.allocated_bytes(), 0xe00u);
}

}  // namespace
}  // namespace hiber::shim
