// LocationIndex (GpuPools' record of live allocations) against std::map as the reference.
#include "memory/location_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace hiber::memory {
namespace {

// Keys shaped like GpuPools' (chunk << 40 | offset, offsets multiples of 2 MiB) from a small
// range, so that entries collide, cluster and wrap around the table's end as they come and go.
TEST(LocationIndex, AgreesWithAMapThroughInsertsAndErases) {
  LocationIndex index;
  std::map<uint64_t, Owned> model;
  std::mt19937_64 rng(7);
  const auto random_key = [&] {
    return (rng() % 4) << 40 | (rng() % 300) << 21;
  };
  for (int step = 0; step < 60000; ++step) {
    const uint64_t key = random_key();
    if (rng() % 3 != 0 && model.count(key) == 0) {
      const Owned owned{FunctionId{static_cast<uint32_t>(rng() % 50)}, 1 + rng() % (64 << 20)};
      index.insert(key, owned);
      model.emplace(key, owned);
    } else {
      EXPECT_EQ(index.erase(key), model.erase(key) == 1) << "step " << step;
    }
    ASSERT_EQ(index.size(), model.size());
    const uint64_t probe = random_key();
    const Owned* found = index.find(probe);
    auto it = model.find(probe);
    ASSERT_EQ(found != nullptr, it != model.end()) << "step " << step;
    if (found != nullptr) {
      EXPECT_EQ(found->function, it->second.function);
      EXPECT_EQ(found->bytes, it->second.bytes);
    }
  }
  std::map<uint64_t, Owned> listed;
  index.for_each([&](uint64_t key, const Owned& owned) { listed.emplace(key, owned); });
  ASSERT_EQ(listed.size(), model.size());
  for (const auto& [key, owned] : model) {
    EXPECT_EQ(listed[key].function, owned.function);
    EXPECT_EQ(listed[key].bytes, owned.bytes);
  }
}

}  // namespace
}  // namespace hiber::memory
