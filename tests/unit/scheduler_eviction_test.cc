// Eviction: the shared rules (protection, one replica when full, greedy until enough is free)
// and every ranking on small examples worked by hand, including CremeBrulee's Table I trace
// (notes-caching-papers.md B.2.5) for BeladyMIN and CremeBrulee-oracle.
#include "scheduler/eviction.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>

#include "scheduler/oracle.h"
#include "scheduler/random.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::kMs;
using testing::spec;

constexpr uint64_t kGpu = 4 * kGiB;

class EvictionTest : public ::testing::Test {
 protected:
  EvictionTest()
      : topology_(testing::torpor_topology(kGpu)),
        node_(topology_),
        functions_(WindowOptions{}, HeavinessOptions{}, 10.0),
        rng_(7) {}

  // Registers function `id` (its index is id - 1 as they are added in order).
  FunctionIndex add(FunctionId id, uint64_t bytes = kGiB, bool heavy = false,
                    Duration penalty = 100 * kMs) {
    FunctionSpec s = spec(bytes, 100 * kMs, 10 * kMs, heavy);
    s.swap_time_hint = penalty;
    Result<FunctionIndex> f = functions_.add(id, s, 0);
    EXPECT_TRUE(f.ok()) << f.status();
    node_.ensure_function_slots(functions_.slots());
    return *f;
  }

  Replica& put(int g, FunctionIndex f, Time last_used, bool loading = false) {
    return node_.add_replica(g, f, functions_.spec(f).model_bytes, loading, last_used);
  }

  EvictionContext context(Time now = 10 * kSecond, const FutureOracle* oracle = nullptr,
                          uint64_t arrival_index = 0) {
    return EvictionContext{now, node_, functions_, rng_, oracle, arrival_index};
  }

  // The ids of the victims (their numbers), in leaving order; an empty vector with ok = false
  // when refused.
  std::vector<uint32_t> plan(Evictor& evictor, int g, uint64_t bytes, bool* ok = nullptr,
                             std::optional<FunctionIndex> keep = std::nullopt,
                             Time now = 10 * kSecond) {
    std::vector<Eviction> out;
    const bool planned = evictor.plan(g, bytes, keep, context(now), &out);
    if (ok != nullptr) *ok = planned;
    std::vector<uint32_t> ids;
    for (const Eviction& e : out) {
      EXPECT_EQ(e.gpu, g);
      EXPECT_EQ(e.bytes, node_.find(g, *functions_.find(e.function))->bytes);
      ids.push_back(e.function.value());
    }
    return ids;
  }

  Topology topology_;
  NodeState node_;
  FunctionTable functions_;
  Rng rng_;
};

using Ids = std::vector<uint32_t>;

// GPU 0 full with light 1 (used at 5 s), light 2 (3 s), heavy 3 (1 s), heavy 4 (2 s).
class TorporEvictionTest : public EvictionTest {
 protected:
  void SetUp() override {
    put(0, add(FunctionId{1}, kGiB, false), 5 * kSecond);
    put(0, add(FunctionId{2}, kGiB, false), 3 * kSecond);
    put(0, add(FunctionId{3}, kGiB, true), 1 * kSecond);
    put(0, add(FunctionId{4}, kGiB, true), 2 * kSecond);
    ASSERT_EQ(node_.free_bytes(0), 0u);
  }
};

TEST_F(TorporEvictionTest, LightModelsLeaveFirstThenHeavyOnesLeastRecentlyUsedFirst) {
  Evictor evictor(make_heaviness_eviction(), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, kGiB), (Ids{2}));
  EXPECT_EQ(plan(evictor, 0, 2 * kGiB), (Ids{2, 1}));
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB), (Ids{2, 1, 3}));
  EXPECT_EQ(plan(evictor, 0, 4 * kGiB), (Ids{2, 1, 3, 4}));
}

TEST_F(TorporEvictionTest, PlanIsEmptyWhenTheModelFitsAndRefusedWhenNothingCanMakeRoom) {
  Evictor evictor(make_heaviness_eviction(), EvictionOptions{});
  bool ok = false;
  EXPECT_TRUE(plan(evictor, 1, kGiB, &ok).empty());
  EXPECT_TRUE(ok);
  EXPECT_TRUE(plan(evictor, 0, 5 * kGiB, &ok).empty());
  EXPECT_FALSE(ok);
}

TEST_F(TorporEvictionTest, DuplicatesLeaveBeforeSoleReplicasWhenMemoryIsFull) {
  put(1, *functions_.find(FunctionId{4}), 0);  // heavy 4 also lives on GPU 1
  put(2, *functions_.find(FunctionId{3}), 0,
      /*loading=*/true);  // a copy of 3 in flight is no duplicate yet
  Evictor evictor(make_heaviness_eviction(), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, kGiB), (Ids{4}));
  EXPECT_EQ(plan(evictor, 0, 2 * kGiB), (Ids{4, 2}));
  EvictionOptions off;
  off.one_replica_when_full = false;
  Evictor plain(make_heaviness_eviction(), off);
  EXPECT_EQ(plan(plain, 0, kGiB), (Ids{2}));
}

TEST_F(TorporEvictionTest, ExecutingLoadingSourceAndKeptReplicasNeverLeave) {
  node_.set_running(0, RequestId{99}, *functions_.find(FunctionId{2}));  // 2 executes on GPU 0
  node_.find(0, *functions_.find(FunctionId{1}))->source_pins = 1;       // 1 is a copy's source
  node_.find(0, *functions_.find(FunctionId{3}))->loading = true;        // 3 is still arriving
  Evictor evictor(make_heaviness_eviction(), EvictionOptions{});
  bool ok = true;
  EXPECT_TRUE(plan(evictor, 0, 2 * kGiB, &ok).empty());
  EXPECT_FALSE(ok) << "only heavy 4 may leave: 1 GiB";
  EXPECT_EQ(plan(evictor, 0, kGiB, &ok), (Ids{4}));
  EXPECT_TRUE(plan(evictor, 0, kGiB, &ok, /*keep=*/*functions_.find(FunctionId{4})).empty());
  EXPECT_FALSE(ok);
}

TEST_F(TorporEvictionTest, OverCommittedGpuEvictsItsExcessToo) {
  // Regression: function 1's model turned out to be 2 GiB. GPU 0 now holds 5 GiB in 4 GiB, and
  // making 1 GiB free takes 2 GiB of victims, not 1.
  node_.set_replica_bytes(0, *functions_.find(FunctionId{1}), 2 * kGiB);
  ASSERT_EQ(node_.free_bytes(0), 0u);
  Evictor evictor(make_lru_eviction(), EvictionOptions{});
  std::vector<Eviction> out;
  ASSERT_TRUE(evictor.plan(0, kGiB, std::nullopt, context(), &out));
  for (const Eviction& e : out) node_.remove_replica(0, *functions_.find(e.function));
  EXPECT_EQ(out.size(), 2u);  // 3 (used at 1 s) and 4 (2 s)
  EXPECT_GE(node_.free_bytes(0), kGiB);
}

TEST_F(EvictionTest, ManyVictimsLeaveInOrderPastTheFirstFewPicks) {
  // 16 quarter-GiB models on GPU 0, used at shuffled times: evicting 3 or 4 GiB takes 12 or 16
  // victims, more than the evictor picks one by one before it switches to a heap.
  std::vector<std::pair<Time, FunctionId>> used;
  Rng shuffle(5);
  std::vector<Time> times;
  for (int i = 0; i < 16; ++i) times.push_back(i * kSecond);
  for (size_t i = times.size(); i > 1; --i) std::swap(times[i - 1], times[shuffle.uniform(i)]);
  for (FunctionId id : testing::function_ids(1, 16)) {
    put(0, add(id, kGiB / 4), times[id.value() - 1]);
    used.push_back({times[id.value() - 1], id});
  }
  std::sort(used.begin(), used.end());
  Ids lru;
  for (const auto& [t, id] : used) lru.push_back(id.value());
  Evictor evictor(make_lru_eviction(), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, 4 * kGiB), lru);
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB), Ids(lru.begin(), lru.begin() + 12));
}

TEST_F(TorporEvictionTest, LruIgnoresHeaviness) {
  Evictor evictor(make_lru_eviction(), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB), (Ids{3, 4, 2}));
}

TEST_F(TorporEvictionTest, LfuEvictsTheLeastRequestedThenTheLeastRecent) {
  const std::map<FunctionId, int> requests = {
      {FunctionId{1}, 5}, {FunctionId{2}, 1}, {FunctionId{3}, 1}, {FunctionId{4}, 9}};
  for (const auto& [id, n] : requests) {
    for (int i = 0; i < n; ++i) functions_.record_arrival(*functions_.find(id), kSecond);
  }
  Evictor evictor(make_lfu_eviction(), EvictionOptions{});
  // 2 and 3 have one request each; 3 was used longer ago.
  EXPECT_EQ(plan(evictor, 0, 4 * kGiB), (Ids{3, 2, 1, 4}));
}

TEST_F(TorporEvictionTest, RandomEvictionPicksEveryCandidateAlikeAndReplaysUnderASeed) {
  Evictor evictor(make_random_eviction(), EvictionOptions{});
  std::map<uint32_t, int> first;
  for (int i = 0; i < 4000; ++i) {
    const Ids victims = plan(evictor, 0, kGiB);
    ASSERT_EQ(victims.size(), 1u);
    ++first[victims[0]];
  }
  ASSERT_EQ(first.size(), 4u);
  for (const auto& [id, n] : first) EXPECT_NEAR(n, 1000, 150) << id;  // ~5 sigma

  auto sequence = [&](uint64_t seed) {
    rng_ = Rng(seed);
    Ids all;
    for (int i = 0; i < 20; ++i) {
      const Ids v = plan(evictor, 0, 2 * kGiB);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  EXPECT_EQ(sequence(3), sequence(3));
  EXPECT_NE(sequence(3), sequence(4));
}

// mCache: utility = penalty x rate / size; rank = log(#cached models with lower utility + b0).
// At 10 s, with 1 GiB models (so utility ~ penalty x rate, in ms/s):
//   1: 100 ms x 2/s = 200     2: 300 ms x 1/s = 300     3: 50 ms x 1/s = 50     4: 100 ms x 4/s =
//   400
// Ranks with b0 = 1: 3 -> log 1, 1 -> log 2, 2 -> log 3, 4 -> log 4.
class McacheTest : public EvictionTest {
 protected:
  void SetUp() override {
    const struct {
      FunctionId id;
      Duration penalty;
      int arrivals;  // in the first 10 s
      Time last_used;
    } models[] = {{FunctionId{1}, 100 * kMs, 20, 4 * kSecond},
                  {FunctionId{2}, 300 * kMs, 10, 3 * kSecond},
                  {FunctionId{3}, 50 * kMs, 10, 9 * kSecond},
                  {FunctionId{4}, 100 * kMs, 40, 1 * kSecond}};
    for (const auto& m : models) {
      const FunctionIndex f = add(m.id, kGiB, false, m.penalty);
      for (int i = 0; i < m.arrivals; ++i) functions_.record_arrival(f, 0);
      put(0, f, m.last_used);
    }
  }
};

TEST_F(McacheTest, EvictsTheLowestRankFirst) {
  Evictor evictor(make_mcache_eviction(EvictionOptions{}), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, 4 * kGiB), (Ids{3, 1, 2, 4}));
}

TEST_F(McacheTest, RanksStayUntilTheNextRebuild) {
  EvictionOptions options;  // rebuilt every 10 s
  Evictor evictor(make_mcache_eviction(options), options);
  EXPECT_EQ(plan(evictor, 0, kGiB, nullptr, std::nullopt, 10 * kSecond), (Ids{3}));
  // Function 3 turns popular: 200 more requests make its utility 50 x 21 = 1050 at 10 s.
  for (int i = 0; i < 200; ++i)
    functions_.record_arrival(*functions_.find(FunctionId{3}), 9 * kSecond);
  EXPECT_EQ(plan(evictor, 0, kGiB, nullptr, std::nullopt, 15 * kSecond), (Ids{3}))
      << "the heap is read-only between rebuilds";
  EXPECT_EQ(plan(evictor, 0, kGiB, nullptr, std::nullopt, 20 * kSecond), (Ids{1}))
      << "rebuilt at 20 s";
}

TEST_F(McacheTest, ALoadedModelIsRankedAgainstTheLastSnapshotAndTiesGoToLru) {
  Evictor evictor(make_mcache_eviction(EvictionOptions{}), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, kGiB), (Ids{3}));  // builds the snapshot {50, 200, 300, 400} at 10 s
  // Function 5 (250 ms x 10 requests / 11 s = 227) replaces 1 and 4 on GPU 0 at 11 s: two
  // snapshot utilities are below it, so its rank is log 3, the same as function 2's. 2 was used
  // at 3 s, 5 at 6 s: 2 leaves before 5 although it is the more useful.
  const FunctionIndex f5 = add(FunctionId{5}, kGiB, false, 250 * kMs);
  for (int i = 0; i < 10; ++i) functions_.record_arrival(f5, 0);
  node_.remove_replica(0, *functions_.find(FunctionId{1}));
  node_.remove_replica(0, *functions_.find(FunctionId{4}));
  put(0, f5, 6 * kSecond);
  evictor.policy().on_loaded(f5, context(11 * kSecond));
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB, nullptr, std::nullopt, 11 * kSecond), (Ids{3, 2}));
}

// CremeBrulee online: utility = penalty / (size x B'), B' = 1 / rate; then the largest-first pass.
// slack: key = last_used + weight x risk^power, risk = min(1, (host swap + execution) / SLO).
// Every function here has SLO 100 ms and execution 10 ms; `penalty` is its host swap.
class SlackEvictionTest : public EvictionTest {
 protected:
  void SetUp() override {
    put(0, add(FunctionId{1}, kGiB, false, 90 * kMs), 1 * kSecond);  // risk 1
    put(0, add(FunctionId{2}, kGiB, false, 10 * kMs), 5 * kSecond);  // risk 0.2
    put(0, add(FunctionId{3}, kGiB, false, 40 * kMs), 2500 * kMs);   // risk 0.5
    put(0, add(FunctionId{4}, kGiB, false, 10 * kMs), 3 * kSecond);  // risk 0.2
    ASSERT_EQ(node_.free_bytes(0), 0u);
  }
};

TEST_F(SlackEvictionTest, AModelWhoseHostLoadTakesItsSloOutlastsCheapOnesUsedLater) {
  // Defaults (60 s, cube): keys 1 + 60 = 61 s, 5 + 0.48 = 5.48 s, 2.5 + 7.5 = 10 s,
  // 3 + 0.48 = 3.48 s.
  Evictor evictor(make_slack_eviction(EvictionOptions{}), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, kGiB), (Ids{4}));
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB), (Ids{4, 2, 3}));
  EXPECT_EQ(plan(evictor, 0, 4 * kGiB), (Ids{4, 2, 3, 1}));
}

TEST_F(SlackEvictionTest, WeightAndPowerSetHowMuchRecencyTheRiskIsWorth) {
  // 10 s, linear: keys 1 + 10 = 11 s, 5 + 2 = 7 s, 2.5 + 5 = 7.5 s, 3 + 2 = 5 s.
  EvictionOptions options;
  options.slack_weight = 10 * kSecond;
  options.slack_power = 1;
  Evictor evictor(make_slack_eviction(options), options);
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB), (Ids{4, 2, 3}));
  // Weight 0 is plain LRU: 1 s, 2.5 s, 3 s, 5 s.
  options.slack_weight = 0;
  Evictor lru(make_slack_eviction(options), options);
  EXPECT_EQ(plan(lru, 0, 3 * kGiB), (Ids{1, 3, 4}));
}

TEST_F(EvictionTest, SlackKeepsNoModelForeverAndCapsTheRiskAtOne) {
  // Risk 1 (capped: its 490 ms load is far past its SLO) and unused since 0 s: key 60 s. A cheap
  // model used at 250 s has key 250.48 s, so the risky one leaves first at 300 s.
  put(0, add(FunctionId{1}, 2 * kGiB, false, 490 * kMs), 0);
  put(0, add(FunctionId{2}, 2 * kGiB, false, 10 * kMs), 250 * kSecond);
  Evictor evictor(make_slack_eviction(EvictionOptions{}), EvictionOptions{});
  EXPECT_EQ(plan(evictor, 0, 2 * kGiB, nullptr, std::nullopt, 300 * kSecond), (Ids{1}));
}

TEST_F(EvictionTest, CremeBruleeKeepsOnlyTheLargestOfItsGreedyPicksIfThatIsEnough) {
  // At 10 s, 10 requests each (1/s). Utilities in ms/s per GiB: 1 (1 GiB, 50 ms): 50;
  // 2 (2 GiB, 200 ms): 100; 3 (1 GiB, 300 ms): 300.
  const FunctionIndex a = add(FunctionId{1}, kGiB, false, 50 * kMs);
  const FunctionIndex b = add(FunctionId{2}, 2 * kGiB, false, 200 * kMs);
  const FunctionIndex c = add(FunctionId{3}, kGiB, false, 300 * kMs);
  for (FunctionIndex f : {a, b, c}) {
    for (int i = 0; i < 10; ++i) functions_.record_arrival(f, 0);
    put(0, f, 0);
  }
  Evictor evictor(make_cremebrulee_eviction(/*oracle=*/false), EvictionOptions{});
  // The GPU is full. For 2 GiB the greedy pass takes 1 (1 GiB) then 2 (2 GiB); largest first, 2
  // alone frees 2 GiB.
  EXPECT_EQ(plan(evictor, 0, 2 * kGiB), (Ids{2}));
  // For 3 GiB both are needed, the larger first.
  EXPECT_EQ(plan(evictor, 0, 3 * kGiB), (Ids{2, 1}));
}

// CremeBrulee's Table I through the whole scheduler: one GPU holding two equal models, model m
// with penalty m + 1, requests 0,1,2,1,0,2,1,0,2,0,2,1,0,2. FunctionId = model + 1.
struct TraceRow {
  bool hit;
  int evicted;  // model, -1 for none
};

std::vector<TraceRow> replay_table1(const std::string& eviction, int* misses, int* cost) {
  const std::array<int, 14> models = {0, 1, 2, 1, 0, 2, 1, 0, 2, 0, 2, 1, 0, 2};
  std::vector<FunctionId> sequence;
  for (int m : models) sequence.push_back(static_cast<FunctionId>(m + 1));
  SequenceOracle oracle(sequence);
  const Topology topology = testing::plain_topology(1, 2 * kGiB);
  SchedulerOptions options;
  options.eviction = eviction;
  auto s = testing::make_scheduler(topology, options, &oracle);
  for (int m = 0; m < 3; ++m) {
    FunctionSpec f = spec(kGiB, kSecond, kMs);
    f.swap_time_hint = (m + 1) * kMs;
    EXPECT_TRUE(s->register_function(static_cast<FunctionId>(m + 1), f, 0).ok());
  }
  std::vector<TraceRow> rows;
  *misses = 0;
  *cost = 0;
  Time now = 0;
  for (int m : models) {
    Result<RequestId> r = s->arrive(static_cast<FunctionId>(m + 1), now);
    EXPECT_TRUE(r.ok());
    const std::vector<Decision> d = testing::dispatch(*s, now);
    EXPECT_EQ(d.size(), 1u);
    if (d.size() != 1) return rows;
    TraceRow row{d[0].source == Source::kResident, -1};
    EXPECT_LE(d[0].evictions.size(), 1u);
    if (!d[0].evictions.empty())
      row.evicted = static_cast<int>(d[0].evictions[0].function.value()) - 1;
    if (!row.hit) {
      ++*misses;
      *cost += m + 1;
      // The swap takes exactly the penalty, so the measured estimate stays the penalty.
      now += (m + 1) * kMs;
      EXPECT_TRUE(s->load_done(*r, now, true).ok());
    }
    now += kMs;
    EXPECT_TRUE(s->done(*r, now).ok());
    EXPECT_INVARIANTS(*s);
    rows.push_back(row);
  }
  return rows;
}

TEST(EvictionTraceTest, BeladyMinReproducesCremeBruleeTableI) {
  int misses = 0, cost = 0;
  const std::vector<TraceRow> rows = replay_table1("belady", &misses, &cost);
  const std::vector<TraceRow> expected = {
      {false, -1}, {false, -1}, {false, 0}, {true, -1}, {false, 1}, {true, -1}, {false, 2},
      {true, -1},  {false, 1},  {true, -1}, {true, -1}, {false, 2}, {true, -1}, {false, 0}};
  ASSERT_EQ(rows.size(), expected.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].hit, expected[i].hit) << "row " << i + 1;
    EXPECT_EQ(rows[i].evicted, expected[i].evicted) << "row " << i + 1;
  }
  EXPECT_EQ(misses, 8);
  EXPECT_EQ(cost, 17);
}

TEST(EvictionTraceTest, CremeBruleeOracleReproducesCremeBruleeTableI) {
  int misses = 0, cost = 0;
  const std::vector<TraceRow> rows = replay_table1("cremebrulee-oracle", &misses, &cost);
  const std::vector<TraceRow> expected = {
      {false, -1}, {false, -1}, {false, 0}, {true, -1}, {false, 1}, {true, -1}, {false, 0},
      {false, 1},  {true, -1},  {true, -1}, {true, -1}, {false, 0}, {false, 1}, {true, -1}};
  ASSERT_EQ(rows.size(), expected.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].hit, expected[i].hit) << "row " << i + 1;
    EXPECT_EQ(rows[i].evicted, expected[i].evicted) << "row " << i + 1;
  }
  EXPECT_EQ(misses, 8);
  EXPECT_EQ(cost, 13);
}

TEST(SequenceOracleTest, CountsRequestsUntilTheNextUseAndInfinityForNever) {
  const std::vector<FunctionId> sequence = {FunctionId{5}, FunctionId{6}, FunctionId{5},
                                            FunctionId{7}};
  SequenceOracle oracle(sequence);
  EXPECT_DOUBLE_EQ(oracle.requests_until_next(FunctionId{5}, 0), 2.0);
  EXPECT_DOUBLE_EQ(oracle.requests_until_next(FunctionId{6}, 0), 1.0);
  EXPECT_DOUBLE_EQ(oracle.requests_until_next(FunctionId{7}, 1), 2.0);
  EXPECT_TRUE(std::isinf(oracle.requests_until_next(FunctionId{5}, 2)));
  EXPECT_TRUE(std::isinf(oracle.requests_until_next(FunctionId{9}, 0)));
}

}  // namespace
}  // namespace hiber::scheduler
