// Randomized event sequences against the Scheduler, tcmalloc style: seeded instruction streams
// of every call the facade has (bad ones included), with check_invariants() and a model of the
// request states after each step, for every policy combination. The same stream twice must
// give the same decisions (determinism under a seed).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "scheduler/oracle.h"
#include "scheduler/policy_factory.h"
#include "scheduler/random.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::kMs;

constexpr uint64_t kGpu = 6 * kGiB;

enum class Op : uint8_t {
  kRegister,
  kArrive,
  kDispatch,
  kLoadDone,
  kDone,
  kCancel,
  kUnregister,
  kMakeRoom,
  kHealth,
  kReserve,
  kResize,
  kDrop,
  kStale
};

// Drives one Scheduler through `steps` random calls; returns a trace of everything it answered.
class Fuzzer {
 public:
  Fuzzer(const Topology& topology, const SchedulerOptions& options, uint64_t seed)
      : topology_(topology), rng_(seed) {
    // The oracle policies get the arrivals this stream will try, in order (some fail: an oracle
    // that is slightly wrong only makes worse choices, never invalid ones).
    Rng plan(seed ^ 0x5eed);
    for (int i = 0; i < 4000; ++i)
      sequence_.push_back(static_cast<FunctionId>(1 + plan.uniform(12)));
    oracle_ = std::make_unique<SequenceOracle>(sequence_);
    limit_ = options.per_function_concurrency;
    s_ = testing::make_scheduler(topology_, options, oracle_.get());
  }

  std::string run(int steps) {
    for (FunctionId id : testing::function_ids(1, 12)) register_function(id, 0);
    for (int step = 0; step < steps && !::testing::Test::HasFailure(); ++step) {
      now_ += static_cast<Time>(rng_.uniform(3 * kMs));
      // Now and then a caller's clock reads slightly behind: the scheduler takes the latest.
      const Time now = rng_.uniform(50) == 0 ? now_ - kMs : now_;
      this->step(pick(), now);
      const Status st = s_->check_invariants();
      EXPECT_TRUE(st.ok()) << "step " << step << ": " << st;
      EXPECT_EQ(s_->queued(), count(RequestState::kQueued)) << "step " << step;
    }
    // Drain: finish everything in flight, then let the queue empty.
    for (int round = 0; round < 10000 && !requests_.empty() && !::testing::Test::HasFailure();
         ++round) {
      now_ += kMs;
      for (int g = 0; g < topology_.gpu_count(); ++g) {
        s_->set_gpu_healthy(g, true);
        s_->set_reserved(g, 0);
      }
      step(Op::kDispatch, now_);
      if (!requests_.empty()) step(rng_.uniform(2) ? Op::kLoadDone : Op::kDone, now_);
    }
    EXPECT_TRUE(requests_.empty()) << requests_.size() << " requests never finished";
    EXPECT_TRUE(s_->check_invariants().ok());
    return trace_.str();
  }

 private:
  Op pick() {
    static constexpr Op kOps[] = {
        Op::kRegister, Op::kArrive,   Op::kArrive,  Op::kArrive, Op::kDispatch, Op::kDispatch,
        Op::kLoadDone, Op::kLoadDone, Op::kDone,    Op::kDone,   Op::kCancel,   Op::kUnregister,
        Op::kMakeRoom, Op::kHealth,   Op::kReserve, Op::kResize, Op::kDrop,     Op::kStale};
    Op op = kOps[rng_.uniform(std::size(kOps))];
    // Registering and unregistering, GPU failures: rarer than requests.
    if ((op == Op::kRegister || op == Op::kUnregister || op == Op::kHealth) && rng_.uniform(3) != 0)
      op = Op::kArrive;
    return op;
  }

  FunctionId any_function() { return static_cast<FunctionId>(1 + rng_.uniform(12)); }
  int any_gpu() {
    return static_cast<int>(rng_.uniform(static_cast<uint64_t>(topology_.gpu_count()) + 1));
  }

  size_t count(RequestState state) const {
    size_t n = 0;
    for (const auto& [id, r] : requests_) n += r.state == state;
    return n;
  }

  // A random live request in one of `states`, if any.
  std::optional<RequestId> any_request(std::initializer_list<RequestState> states) {
    std::vector<RequestId> ids;
    for (const auto& [id, r] : requests_) {
      for (RequestState st : states) {
        if (r.state == st) ids.push_back(id);
      }
    }
    if (ids.empty()) return std::nullopt;
    return ids[rng_.uniform(ids.size())];
  }

  void finished(RequestId id) {
    const Request& r = requests_.at(id);
    if (r.state != RequestState::kQueued) --in_flight_[r.function];
    requests_.erase(id);
    finished_.push_back(id);
  }

  void register_function(FunctionId id, Time now) {
    FunctionSpec spec = testing::spec(kGiB / 2 + rng_.uniform(7 * kGiB / 2),
                                      (20 + static_cast<Duration>(rng_.uniform(480))) * kMs,
                                      (1 + static_cast<Duration>(rng_.uniform(50))) * kMs);
    if (rng_.uniform(2)) spec.heavy_hint = rng_.uniform(2) == 1;
    const Status st = s_->register_function(id, spec, now);
    EXPECT_EQ(st.ok(), registered_.count(id) == 0) << st;
    if (st.ok()) registered_.insert(id);
    trace_ << "reg " << id << ' ' << st.ok() << '\n';
  }

  void step(Op op, Time now) {
    switch (op) {
      case Op::kRegister: register_function(any_function(), now); break;
      case Op::kArrive: {
        const FunctionId id = any_function();
        Result<RequestId> r = s_->arrive(id, now);
        EXPECT_EQ(r.ok(), registered_.count(id) == 1);
        if (r.ok()) {
          EXPECT_EQ(requests_.count(*r), 0u);
          requests_[*r] = Request{id, RequestState::kQueued};
        }
        trace_ << "arrive " << id << ' ' << (r.ok() ? r->value() : 0) << '\n';
        break;
      }
      case Op::kDispatch: {
        const GpuMask available = s_->node().available();
        std::vector<Decision> decisions;
        std::vector<RequestId> rejected;
        s_->dispatch(now, &decisions, &rejected);
        for (RequestId id : rejected) {
          auto it = requests_.find(id);
          ASSERT_NE(it, requests_.end());
          EXPECT_EQ(it->second.state, RequestState::kQueued);
          EXPECT_EQ(s_->request(id)->state, RequestState::kFinished);
          finished(id);
          trace_ << "shed " << id << '\n';
        }
        GpuMask used = 0;
        for (const Decision& d : decisions) {
          auto it = requests_.find(d.request);
          ASSERT_NE(it, requests_.end());
          Request& r = it->second;
          EXPECT_EQ(r.state, RequestState::kQueued);
          EXPECT_EQ(r.function, d.function);
          EXPECT_NE(available & gpu_bit(d.gpu), 0u) << "GPU " << d.gpu << " was not available";
          EXPECT_EQ(used & gpu_bit(d.gpu), 0u) << "GPU " << d.gpu << " given twice";
          used |= gpu_bit(d.gpu);
          for (const Eviction& e : d.evictions) EXPECT_EQ(e.gpu, d.gpu);
          EXPECT_EQ(d.source == Source::kPeer, d.source_gpu >= 0);
          EXPECT_LT(in_flight_[r.function], limit_);
          ++in_flight_[r.function];
          r.state = d.source == Source::kResident ? RequestState::kRunning : RequestState::kLoading;
          EXPECT_EQ(s_->request(d.request)->state, r.state);
          trace_ << "start " << d.request << " gpu " << d.gpu << " from " << source_name(d.source)
                 << ' ' << d.source_gpu << " evict " << d.evictions.size() << '\n';
        }
        // Prewarms: each a new background request, loading from the host onto a GPU still free.
        std::vector<Decision> prewarms;
        s_->prewarm(now, &prewarms);
        for (const Decision& d : prewarms) {
          EXPECT_TRUE(d.prewarm);
          EXPECT_EQ(d.source, Source::kHost);
          EXPECT_EQ(requests_.count(d.request), 0u);
          EXPECT_EQ(s_->queued(), 0u) << "a prewarm went before a queued request";
          EXPECT_NE(available & gpu_bit(d.gpu), 0u) << "GPU " << d.gpu << " was not available";
          EXPECT_EQ(used & gpu_bit(d.gpu), 0u) << "GPU " << d.gpu << " given twice";
          used |= gpu_bit(d.gpu);
          for (const Eviction& e : d.evictions) EXPECT_EQ(e.gpu, d.gpu);
          ++in_flight_[d.function];
          requests_[d.request] = Request{d.function, RequestState::kLoading};
          EXPECT_EQ(s_->request(d.request)->state, RequestState::kLoading);
          trace_ << "prewarm " << d.request << " gpu " << d.gpu << " evict " << d.evictions.size()
                 << '\n';
        }
        trace_ << "wakeup " << s_->next_wakeup() << '\n';
        break;
      }
      case Op::kLoadDone: {
        const std::optional<RequestId> found = any_request({RequestState::kLoading});
        if (!found) break;
        const RequestId id = *found;
        const bool ok = rng_.uniform(10) != 0;
        ASSERT_TRUE(s_->load_done(id, now, ok).ok());
        requests_[id].state = RequestState::kRunning;
        trace_ << "loaded " << id << ' ' << ok << '\n';
        break;
      }
      case Op::kDone: {
        const std::optional<RequestId> found =
            any_request({RequestState::kLoading, RequestState::kRunning});
        if (!found) break;
        const RequestId id = *found;
        Completion c;
        c.failed = rng_.uniform(10) == 0;
        if (rng_.uniform(2)) c.exec = static_cast<Duration>(rng_.uniform(30 * kMs));
        ASSERT_TRUE(s_->done(id, now, c).ok());
        finished(id);
        trace_ << "done " << id << '\n';
        break;
      }
      case Op::kCancel: {
        const std::optional<RequestId> found =
            any_request({RequestState::kQueued, RequestState::kLoading, RequestState::kRunning});
        if (!found) break;
        const RequestId id = *found;
        ASSERT_TRUE(s_->cancel(id, now).ok());
        finished(id);
        trace_ << "cancel " << id << '\n';
        break;
      }
      case Op::kUnregister: {
        const FunctionId id = any_function();
        std::vector<RequestId> cancelled;
        const Status st = s_->unregister_function(id, now, &cancelled);
        if (registered_.count(id) == 0) {
          EXPECT_EQ(st.code(), ErrorCode::kNotFound);
        } else if (in_flight_[id] > 0) {
          EXPECT_EQ(st.code(), ErrorCode::kIllegalState);
        } else {
          ASSERT_TRUE(st.ok()) << st;
          registered_.erase(id);
          for (RequestId r : cancelled) {
            EXPECT_EQ(requests_.at(r).function, id);
            finished(r);
          }
          for (const auto& [r, req] : requests_) EXPECT_NE(req.function, id);
        }
        trace_ << "unreg " << id << ' ' << st.ok() << ' ' << cancelled.size() << '\n';
        break;
      }
      case Op::kMakeRoom: {
        const int g = any_gpu();
        std::vector<Eviction> out;
        const bool ok = s_->make_room(g, rng_.uniform(kGpu), any_function(), now, &out);
        for (const Eviction& e : out) EXPECT_EQ(e.gpu, g);
        trace_ << "room " << g << ' ' << ok << ' ' << out.size() << '\n';
        break;
      }
      case Op::kHealth: {
        const int g = any_gpu();
        const bool healthy = rng_.uniform(2) == 1;
        s_->set_gpu_healthy(g, healthy);
        if (g < topology_.gpu_count()) {
          EXPECT_EQ((s_->node().healthy() & gpu_bit(g)) != 0, healthy);
        }
        break;
      }
      case Op::kReserve: s_->set_reserved(any_gpu(), rng_.uniform(kGpu / 2)); break;
      case Op::kResize: {
        const FunctionId id = any_function();
        const Status st = s_->set_model_bytes(id, kGiB / 4 + rng_.uniform(5 * kGiB));
        EXPECT_EQ(st.ok(), registered_.count(id) == 1) << st;
        break;
      }
      case Op::kDrop: s_->drop_replica(any_gpu(), any_function()); break;
      case Op::kStale: {
        if (finished_.empty()) break;
        const RequestId id = finished_[rng_.uniform(finished_.size())];
        EXPECT_EQ(s_->done(id, now).code(), ErrorCode::kNotFound);
        EXPECT_EQ(s_->load_done(id, now, true).code(), ErrorCode::kNotFound);
        EXPECT_EQ(s_->cancel(id, now).code(), ErrorCode::kNotFound);
        EXPECT_EQ(s_->request(id)->state, RequestState::kFinished);
        break;
      }
    }
  }

  struct Request {
    FunctionId function{0};
    RequestState state = RequestState::kQueued;
  };

  const Topology& topology_;
  Rng rng_;
  std::vector<FunctionId> sequence_;
  std::unique_ptr<SequenceOracle> oracle_;
  std::unique_ptr<Scheduler> s_;
  int limit_ = 1;
  Time now_ = 0;
  std::set<FunctionId> registered_;
  std::map<RequestId, Request> requests_;
  std::map<FunctionId, int> in_flight_;
  std::vector<RequestId> finished_;
  std::ostringstream trace_;
};

struct FuzzCase {
  std::string queue;
  std::string placement;
  std::string eviction;
};

class SchedulerFuzzTest : public ::testing::TestWithParam<FuzzCase> {};

TEST_P(SchedulerFuzzTest, RandomEventSequencesKeepEveryInvariant) {
  const Topology topology = testing::torpor_topology(kGpu);
  SchedulerOptions options;
  options.queue = GetParam().queue;
  options.placement = GetParam().placement;
  options.eviction = GetParam().eviction;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    options.seed = seed;
    options.per_function_concurrency = static_cast<int>(1 + seed % 2);
    options.shed = seed == 1 ? ShedRule::kNone : seed == 2 ? ShedRule::kLate : ShedRule::kHopeless;
    // Prewarming on the last seed, with short histories and every GPU allowed.
    options.prewarm = seed == 3 ? PrewarmRule::kHistogram : PrewarmRule::kNone;
    options.prewarm_options.min_samples = 2;
    options.prewarm_options.keep_idle_gpus = 0;
    Fuzzer fuzzer(topology, options, seed);
    const std::string trace = fuzzer.run(1500);
    if (options.prewarm != PrewarmRule::kNone) {
      EXPECT_NE(trace.find("\nprewarm "), std::string::npos) << "the fuzz made no prewarm";
    }
    if (HasFailure()) return;
  }
}

std::vector<FuzzCase> all_cases() {
  std::vector<FuzzCase> cases;
  for (std::string_view q : queue_policy_names()) {
    for (std::string_view p : placement_policy_names()) {
      for (std::string_view e : eviction_policy_names())
        cases.push_back({std::string(q), std::string(p), std::string(e)});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, SchedulerFuzzTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<FuzzCase>& info) {
                           std::string name = info.param.queue + "_" + info.param.placement + "_" +
                                              info.param.eviction;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(SchedulerDeterminismTest, TheSameSeedAndCallsGiveTheSameDecisions) {
  const Topology topology = testing::torpor_topology(kGpu);
  SchedulerOptions options;
  options.placement = "random";
  options.eviction = "random";
  options.queue = "gshare";
  options.seed = 5;
  const std::string first = Fuzzer(topology, options, 9).run(1500);
  const std::string second = Fuzzer(topology, options, 9).run(1500);
  EXPECT_EQ(first, second);
  EXPECT_NE(first.find("start"), std::string::npos);
  // Another scheduler seed, the same calls: random placement and eviction choose otherwise.
  options.seed = 6;
  const std::string other = Fuzzer(topology, options, 9).run(1500);
  EXPECT_NE(first, other);
}

}  // namespace
}  // namespace hiber::scheduler
