// Queueing: the RRC arithmetic, the threshold rule and how it moves with load, the in-group
// order (EDF, late requests demoted), FIFO, gShare's dual-queue lazy dispatch on worked
// examples, and the function heap against a brute-force model.
#include "scheduler/queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>

#include "scheduler/random.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::kMs;
using testing::spec;

constexpr Duration kS = kSecond;

// ---- RRC arithmetic ----

TEST(RrcTest, RequiredRequestCountSolvesForTheTailPercentile) {
  // 1 - p is not exact in binary: compare to 1e-9.
  EXPECT_NEAR(required_request_count(0.98, 100, 97), 50.0, 1e-9);
  EXPECT_NEAR(required_request_count(0.98, 100, 100), -100.0, 1e-9);
  EXPECT_NEAR(required_request_count(0.9, 10, 8), 10.0, 1e-9);
  EXPECT_DOUBLE_EQ(required_request_count(0.9, 0, 0), 0.0);
  // The definition: (m + RRC) / (n + RRC) = p.
  const double rrc = required_request_count(0.95, 40, 30);
  EXPECT_NEAR((30 + rrc) / (40 + rrc), 0.95, 1e-12);
}

TEST(RrcTest, FunctionRrcCountsCompletionsInTheWindow) {
  FunctionTable table(WindowOptions{}, HeavinessOptions{}, 10.0);
  FunctionSpec s = spec(kGiB);
  s.tail_percentile = 0.9;
  Result<FunctionIndex> f = table.add(FunctionId{1}, s, 0);
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 8; ++i) table.record_completion(*f, kS, true, 10 * kMs);
  for (int i = 0; i < 2; ++i) table.record_completion(*f, kS, false, 10 * kMs);
  EXPECT_NEAR(function_rrc(table, *f, 2 * kS), 10.0, 1e-9);  // (9 - 8) / 0.1
  EXPECT_DOUBLE_EQ(function_rrc(table, *f, 70 * kS), 0.0);   // the window forgot them
}

TEST(RrcTest, ThresholdAdmitsAscendingRrcWhileDemandFits) {
  const std::vector<RrcDemand> functions = {{20, FunctionId{4}, 0.5},
                                            {-10, FunctionId{1}, 1.0},
                                            {5, FunctionId{3}, 1.0},
                                            {0, FunctionId{2}, 1.5}};
  // Cumulative demand in RRC order: 1.0, 2.5, 3.5, 4.0.
  std::vector<RrcDemand> v = functions;
  RrcThreshold t = rrc_threshold(v, 3.6);
  EXPECT_FALSE(t.everyone);
  EXPECT_DOUBLE_EQ(t.rrc, 5.0);
  EXPECT_EQ(t.id, FunctionId{3});
  EXPECT_TRUE(t.high(-10, FunctionId{1}));
  EXPECT_TRUE(t.high(5, FunctionId{3}));
  EXPECT_FALSE(t.high(20, FunctionId{4}));
  EXPECT_FALSE(t.high(5, FunctionId{9})) << "equal RRC, larger id: after the last admitted";

  v = functions;
  EXPECT_TRUE(rrc_threshold(v, 4.0).everyone);
  v = functions;
  t = rrc_threshold(v, 0.5);  // the first does not fit: nobody is high priority
  EXPECT_FALSE(t.everyone);
  EXPECT_FALSE(t.high(-10, FunctionId{1}));
  EXPECT_FALSE(t.high(-1e9, FunctionId{0}));
  std::vector<RrcDemand> empty;
  EXPECT_TRUE(rrc_threshold(empty, 0).everyone);
}

TEST(RrcTest, ThresholdMatchesSortingAndScanningOnRandomInputs) {
  Rng rng(23);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<RrcDemand> v;
    const size_t n = 1 + rng.uniform(40);
    for (size_t i = 0; i < n; ++i) {
      RrcDemand f{.id = FunctionId{0}};
      f.rrc = static_cast<double>(rng.uniform(10)) - 5;  // many equal RRCs: ties by id
      f.id = FunctionId{static_cast<uint32_t>(1000 * rng.uniform(50) + i)};  // unique, random order
      f.demand = rng.uniform(4) == 0 ? 0.0 : rng.uniform_double();
      v.push_back(f);
    }
    const double capacity = rng.uniform_double() * static_cast<double>(v.size()) * 0.6;
    // The reference: sort, then admit while the running sum fits.
    std::vector<RrcDemand> sorted = v;
    std::sort(sorted.begin(), sorted.end(), [](const RrcDemand& a, const RrcDemand& b) {
      return a.rrc != b.rrc ? a.rrc < b.rrc : a.id < b.id;
    });
    std::optional<size_t> last;
    double sum = 0;
    bool all = true;
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sum + sorted[i].demand > capacity) {
        all = false;
        break;
      }
      sum += sorted[i].demand;
      last = i;
    }
    const RrcThreshold t = rrc_threshold(v, capacity);
    ASSERT_EQ(t.everyone, all) << "trial " << trial;
    for (size_t i = 0; i < sorted.size(); ++i) {
      const bool admitted = all || (last.has_value() && i <= *last);
      ASSERT_EQ(t.high(sorted[i].rrc, sorted[i].id), admitted) << "trial " << trial << " at " << i;
    }
  }
}

// ---- The policies, driven directly ----

class QueuePolicyTest : public ::testing::Test {
 protected:
  QueuePolicyTest()
      : topology_(testing::torpor_topology()),
        node_(topology_),
        functions_(WindowOptions{}, HeavinessOptions{}, 12.0),
        started_(4, 0) {}

  FunctionIndex add(FunctionId id, const FunctionSpec& s) {
    Result<FunctionIndex> f = functions_.add(id, s, 0);
    EXPECT_TRUE(f.ok()) << f.status();
    node_.ensure_function_slots(functions_.slots());
    return *f;
  }

  QueueContext ctx(Time now) const { return QueueContext{now, node_, functions_, started_}; }

  void push(QueuePolicy& q, FunctionIndex f, Time arrival, Time now) {
    const RequestId id{++next_id_};
    q.push(QueuedRequest{id, f, arrival, arrival + functions_.spec(f).slo, id.value()}, ctx(now));
    ids_.insert_or_assign(id, f);
  }

  // One round at `now` in which nothing can start: the order functions are offered in (their
  // ids' numbers).
  std::vector<uint32_t> order(QueuePolicy& q, Time now,
                              std::vector<RequestId>* requests = nullptr) {
    std::vector<uint32_t> out;
    const QueueContext c = ctx(now);
    q.begin_round(c);
    QueueCandidate candidate;
    while (q.next(c, &candidate)) {
      out.push_back(functions_.id(candidate.function).value());
      if (requests != nullptr) requests->push_back(candidate.request);
      q.pass(candidate, c);
    }
    q.end_round(c);
    const Status s = q.check_invariants();
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  static std::vector<std::unique_ptr<QueuePolicy>> all_policies() {
    std::vector<std::unique_ptr<QueuePolicy>> out;
    out.push_back(make_rrc_queue(QueueOptions{}));
    out.push_back(make_fifo_queue());
    out.push_back(make_gshare_queue(QueueOptions{}));
    return out;
  }

  Topology topology_;
  NodeState node_;
  FunctionTable functions_;
  std::vector<Time> started_;
  uint64_t next_id_ = 0;  // the last request id pushed
  std::map<RequestId, FunctionIndex> ids_;
};

// Functions A..D (ids 1..4), p = 0.9, 10 completions each at 5 s, 100 ms of GPU time apiece:
//   A 10 on time: RRC -10;  B 9: RRC 0;  C 8: RRC 10;  D 5: RRC 40.
// `load` requests per second each (10 x load arrivals by 10 s), so demand 0.1 x load each. At
// 10 s one request each is queued with deadlines D < C < B < A.
class RrcLoadTest : public QueuePolicyTest {
 protected:
  std::vector<uint32_t> order_under(double load, int healthy_gpus = 4) {
    const int on_time[] = {10, 9, 8, 5};
    std::vector<FunctionIndex> f;
    for (FunctionId id : testing::function_ids(1, 4)) {
      FunctionSpec s = spec(kGiB, 500 * kMs, 10 * kMs);
      s.tail_percentile = 0.9;
      f.push_back(add(id, s));
    }
    for (int i = 0; i < 4; ++i) {
      for (int k = 0; k < 10; ++k)
        functions_.record_completion(f[i], 5 * kS, k < on_time[i], 100 * kMs);
      for (int k = 0; k < static_cast<int>(10 * load); ++k) functions_.record_arrival(f[i], kS);
    }
    for (int g = healthy_gpus; g < 4; ++g) node_.set_healthy(g, false);
    auto q = make_rrc_queue(QueueOptions{});
    for (FunctionIndex x : f) q->add_function(x);
    const Time now = 10 * kS;
    for (int i = 3; i >= 0; --i) push(*q, f[i], now - 400 * kMs + (3 - i) * 10 * kMs, now);
    return order(*q, now);
  }
};

TEST_F(RrcLoadTest, UnderLightLoadEveryoneIsHighPriorityInDeadlineOrder) {
  // Demand 4 x 0.5 = 2.0 of 3.6 GPU-s/s.
  EXPECT_EQ(order_under(5), (std::vector<uint32_t>{4, 3, 2, 1}));
}

TEST_F(RrcLoadTest, RisingLoadDemotesTheLargestRrcFirst) {
  // 1.0 each: A, B, C fit (3.0), D does not.
  EXPECT_EQ(order_under(10), (std::vector<uint32_t>{3, 2, 1, 4}));
}

TEST_F(RrcLoadTest, HeavierLoadKeepsOnlyTheMostCompliantHigh) {
  // 2.0 each: A fits, A + B = 4.0 does not. The low group keeps its deadline order.
  EXPECT_EQ(order_under(20), (std::vector<uint32_t>{1, 4, 3, 2}));
}

TEST_F(RrcLoadTest, WhenNobodyFitsTheGroupsMergeIntoDeadlineOrder) {
  EXPECT_EQ(order_under(40), (std::vector<uint32_t>{4, 3, 2, 1}));
}

TEST_F(RrcLoadTest, FailedGpusLowerTheThreshold) {
  // Capacity 2 x 0.9 = 1.8: at 1.0 each only A fits.
  EXPECT_EQ(order_under(10, /*healthy_gpus=*/2), (std::vector<uint32_t>{1, 4, 3, 2}));
}

TEST_F(QueuePolicyTest, RrcThresholdFollowsLoadAsTheWindowSlides) {
  // Two functions, 1 (RRC -10) and 2 (RRC 10), with 1 GPU-s/s of demand each at first: the
  // capacity, 3.6, admits both. A burst of 2 then makes the pair need 4.5: 2 is demoted. Once
  // the window has forgotten the burst, 2 is high priority again.
  FunctionSpec s = spec(kGiB, 5 * kS, 10 * kMs);
  s.tail_percentile = 0.9;
  const FunctionIndex a = add(FunctionId{1}, s);
  const FunctionIndex b = add(FunctionId{2}, s);
  for (int k = 0; k < 10; ++k) {
    functions_.record_completion(a, 0, true, 100 * kMs);
    functions_.record_completion(b, 0, k < 8, 100 * kMs);
  }
  auto q = make_rrc_queue(QueueOptions{});
  q->add_function(a);
  q->add_function(b);
  for (int k = 0; k < 100; ++k) {
    functions_.record_arrival(a, 0);
    functions_.record_arrival(b, 0);
  }
  // 10 s: 10/s x 0.1 s = 1 each.
  push(*q, b, 9 * kS, 10 * kS);
  push(*q, a, 9 * kS + kMs, 10 * kS);
  EXPECT_EQ(order(*q, 10 * kS), (std::vector<uint32_t>{2, 1}));
  // 300 more arrivals of 2 at 10 s; at 11 s: 1: 100 / 11 s x 0.1 s = 0.9, 2: 400 / 11 s x 0.1 s
  // = 3.6; 4.5 > 3.6.
  for (int k = 0; k < 300; ++k) functions_.record_arrival(b, 10 * kS);
  EXPECT_EQ(order(*q, 10 * kS + 500 * kMs), (std::vector<uint32_t>{2, 1}))
      << "the threshold is only recomputed every second";
  EXPECT_EQ(order(*q, 11 * kS), (std::vector<uint32_t>{1, 2}));
  // At 71 s the burst (and everything else) has left the window: nobody is low.
  EXPECT_EQ(order(*q, 71 * kS), (std::vector<uint32_t>{2, 1}));
}

TEST_F(QueuePolicyTest, RrcServesEarliestDeadlineFirstWhereFifoServesArrivalOrder) {
  const FunctionIndex loose = add(FunctionId{1}, spec(kGiB, 100 * kMs, 5 * kMs));
  const FunctionIndex tight = add(FunctionId{2}, spec(kGiB, 50 * kMs, 5 * kMs));
  auto rrc = make_rrc_queue(QueueOptions{});
  auto fifo = make_fifo_queue();
  QueueOptions paper;  // §5.2 as written: no EDF, no demotion
  paper.earliest_deadline_first = false;
  paper.demote_late = false;
  auto rrc_paper = make_rrc_queue(paper);
  for (QueuePolicy* q : {rrc.get(), fifo.get(), rrc_paper.get()}) {
    q->add_function(loose);
    q->add_function(tight);
    push(*q, loose, 0, 0);                // deadline 100 ms
    push(*q, tight, 10 * kMs, 10 * kMs);  // deadline 60 ms
  }
  EXPECT_EQ(order(*rrc, 10 * kMs), (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(order(*fifo, 10 * kMs), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(order(*rrc_paper, 10 * kMs), (std::vector<uint32_t>{1, 2}));
}

TEST_F(QueuePolicyTest, RequestsThatCanNoLongerMeetTheirDeadlineGoBehindFeasibleOnes) {
  const FunctionIndex slow = add(FunctionId{1}, spec(kGiB, 50 * kMs, 30 * kMs));  // deadline 50 ms
  const FunctionIndex quick =
      add(FunctionId{2}, spec(kGiB, 200 * kMs, 10 * kMs));  // deadline 200 ms
  auto q = make_rrc_queue(QueueOptions{});
  QueueOptions no_demotion;
  no_demotion.demote_late = false;
  auto plain = make_rrc_queue(no_demotion);
  for (QueuePolicy* p : {q.get(), plain.get()}) {
    p->add_function(slow);
    p->add_function(quick);
    push(*p, slow, 0, 0);
    push(*p, quick, 0, 0);
  }
  // At 10 ms the slow one can still make it (10 + 30 <= 50): earliest deadline first.
  EXPECT_EQ(order(*q, 10 * kMs), (std::vector<uint32_t>{1, 2}));
  // At 30 ms it cannot (30 + 30 > 50): the feasible one goes first.
  EXPECT_EQ(order(*q, 30 * kMs), (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(order(*plain, 30 * kMs), (std::vector<uint32_t>{1, 2}));
}

TEST_F(QueuePolicyTest, AFunctionOffersItsFirstFeasibleRequestBeforeOlderLateOnes) {
  const FunctionIndex f = add(FunctionId{1}, spec(kGiB, 50 * kMs, 10 * kMs));
  auto q = make_rrc_queue(QueueOptions{});
  q->add_function(f);
  push(*q, f, 0, 0);                // request 1, deadline 50 ms
  push(*q, f, 30 * kMs, 30 * kMs);  // request 2, deadline 80 ms
  std::vector<RequestId> offered;
  order(*q, 20 * kMs, &offered);
  order(*q, 45 * kMs, &offered);  // 45 + 10 > 50: request 1 is late
  EXPECT_EQ(offered, (std::vector<RequestId>{RequestId{1}, RequestId{2}}));
  // Once the feasible one is taken, the late one is next.
  const QueueContext c = ctx(45 * kMs);
  q->begin_round(c);
  QueueCandidate candidate;
  ASSERT_TRUE(q->next(c, &candidate));
  EXPECT_EQ(candidate.request, RequestId{2});
  q->take(candidate, c);
  ASSERT_TRUE(q->next(c, &candidate));
  EXPECT_EQ(candidate.request, RequestId{1});
  q->take(candidate, c);
  EXPECT_FALSE(q->next(c, &candidate));
  q->end_round(c);
  EXPECT_EQ(q->size(), 0u);
}

TEST_F(QueuePolicyTest, IneligibleFunctionsAreNotOfferedUntilEligibleAgain) {
  const FunctionIndex a = add(FunctionId{1}, spec(kGiB));
  const FunctionIndex b = add(FunctionId{2}, spec(kGiB));
  for (const auto& q : all_policies()) {
    q->add_function(a);
    q->add_function(b);
    push(*q, a, 0, 0);
    push(*q, b, kMs, kMs);
    q->set_eligible(a, false, ctx(kMs));
    EXPECT_EQ(order(*q, kMs), (std::vector<uint32_t>{2})) << q->name();
    q->set_eligible(a, true, ctx(kMs));
    EXPECT_EQ(order(*q, kMs).size(), 2u) << q->name();
  }
}

TEST_F(QueuePolicyTest, EraseAndEraseFunctionWithdrawRequestsInArrivalOrder) {
  const FunctionIndex a = add(FunctionId{1}, spec(kGiB));
  const FunctionIndex b = add(FunctionId{2}, spec(kGiB));
  for (const auto& q : all_policies()) {
    q->add_function(a);
    q->add_function(b);
    const uint64_t first = next_id_ + 1;
    push(*q, a, 0, 0);
    push(*q, b, 0, 0);
    push(*q, a, kMs, kMs);
    push(*q, a, 2 * kMs, 2 * kMs);
    EXPECT_TRUE(q->erase(RequestId{first + 2}, ctx(2 * kMs)));
    EXPECT_FALSE(q->erase(RequestId{first + 2}, ctx(2 * kMs)));
    EXPECT_FALSE(q->contains(RequestId{first + 2}));
    std::vector<RequestId> removed;
    q->erase_function(a, &removed);
    EXPECT_EQ(removed, (std::vector<RequestId>{RequestId{first}, RequestId{first + 3}}))
        << q->name();
    EXPECT_EQ(q->size(), 1u);
    EXPECT_TRUE(q->contains(RequestId{first + 1}));
    EXPECT_TRUE(q->check_invariants().ok());
  }
}

// ---- The function heap against a brute-force model ----

TEST(FunctionQueuesTest, HeapTopIsAlwaysTheSmallestListedKey) {
  constexpr uint32_t kFunctions = 40;
  FunctionQueues q;
  q.add_function(FunctionIndex{kFunctions - 1});
  std::map<FunctionIndex, QueueKey> keys;  // the model: listed functions and their keys
  std::map<FunctionIndex, int> lane;       // requests per function
  std::map<FunctionIndex, bool> ineligible, passed;
  Rng rng(11);
  uint64_t next = 0;
  auto sync = [&](FunctionIndex f) {
    const QueueKey key{static_cast<int64_t>(rng.uniform(50)), 0, 0, f.value()};
    q.relist(f, key);
    if (lane[f] > 0 && !ineligible[f] && !passed[f]) {
      keys[f] = key;
    } else {
      keys.erase(f);
    }
  };
  for (int step = 0; step < 5000; ++step) {
    const FunctionIndex f{static_cast<uint32_t>(rng.uniform(kFunctions))};
    switch (rng.uniform(6)) {
      case 0:
      case 1:
        ++next;
        q.push_back(QueuedRequest{RequestId{next}, f, 0, 0, next});
        ++lane[f];
        break;
      case 2:
        if (lane[f] > 0) {
          q.erase(q.front(f));
          --lane[f];
        }
        break;
      case 3:
        ineligible[f] = !ineligible[f];
        q.set_eligible(f, !ineligible[f]);
        break;
      case 4:
        if (!passed[f]) {
          q.pass(f);
          passed[f] = true;
          keys.erase(f);
        }
        break;
      case 5:
        for (FunctionIndex p : q.end_round()) {
          passed[p] = false;
          sync(p);
        }
        break;
    }
    sync(f);
    ASSERT_EQ(q.empty(), keys.empty());
    if (!keys.empty()) {
      const auto smallest =
          std::min_element(keys.begin(), keys.end(),
                           [](const auto& x, const auto& y) { return x.second < y.second; });
      ASSERT_EQ(q.top(), smallest->first) << "step " << step;
    }
    if (std::none_of(passed.begin(), passed.end(), [](const auto& p) { return p.second; })) {
      const Status s = q.check_invariants();
      ASSERT_TRUE(s.ok()) << s;
    }
  }
}

}  // namespace
}  // namespace hiber::scheduler
