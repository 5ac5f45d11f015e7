// Decision latency of the Scheduler (docs/perf.md, "scheduler: decision latency"): the time
// for one request's calls, arrive + dispatch + load_done + done, on the 8-GPU NVSwitch node
// (configs/nodes/nvswitch-8gpu.json) with 1,000 and 10,000 functions registered.
//
// The node is kept in a steady overload: 8 requests in flight (one per GPU) and a backlog of
// 64 queued requests over Zipf-popular functions whose models (0.5 to 8 GiB, 3.1 GiB on
// average) far exceed the 8 x 80 GB of GPU memory, so placements swap models in and evict
// others. Each timed step is what the controller does for one request:
//   the oldest request in flight finishes (load_done if it was still loading, then done),
//   a new request arrives, dispatch() starts one from the queue on the freed GPU.
// Simulated time advances 1.25 ms per step (8 GPUs at ~10 ms a request), so the RRC threshold
// is recomputed about every 800 steps: its cost shows in the tail, not in p99.
//
// Percentiles are taken from every step's own duration (std::chrono::steady_clock around the
// calls; its ~20 ns cost is inside every figure, the baseline's included). The baseline,
// measured in the same run: the FIFO queue with LRU eviction (the paper's ablations), the
// simplest policies over the same machinery. Each benchmark reports p50/p99/p99.9/max in ns,
// the p99 ratio to the baseline at the same function count, and evictions and host swaps per
// step (to show the memory pressure is real).
//
// CoreDecision/* runs the same steps through the node core (node/node_core.h), which hiberd's
// controller and hiber-sim drive: its request state machine and reserve accounting on top of the
// facade, with an actuator that only notes the starts. p99_vs_facade compares it with the
// facade's run of the same policies.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "node/node_core.h"
#include "scheduler/oracle.h"
#include "scheduler/policy_factory.h"
#include "scheduler/random.h"
#include "scheduler/scheduler.h"

namespace hiber::scheduler {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBacklog = 64;
constexpr int kWarmupSteps = 30'000;
constexpr int kTimedSteps = 200'000;
constexpr Duration kStep = 1'250 * kMicrosecond;

[[noreturn]] void die(const Status& status, const char* what) {
  std::fprintf(stderr, "scheduler_bench: %s: %s\n", what, status.to_string().c_str());
  std::exit(1);
}

const Topology& node() {
  static const Topology topology = [] {
    Result<NodeConfig> config =
        load_node_config(std::string(HIBER_SOURCE_DIR) + "/configs/nodes/nvswitch-8gpu.json");
    if (!config.ok()) die(config.status(), "loading the node config");
    Result<Topology> t = Topology::from_config(*config);
    if (!t.ok()) die(t.status(), "building the topology");
    return std::move(t).value();
  }();
  return topology;
}

// The functions and the order their requests arrive in; the same for every policy.
struct Workload {
  std::vector<FunctionSpec> specs;  // function i has id i + 1
  std::vector<FunctionId> arrivals;
};

const Workload& workload(int functions) {
  static std::map<int, Workload> cache;
  auto it = cache.find(functions);
  if (it != cache.end()) return it->second;
  Workload w;
  Rng rng(2024);
  const uint64_t sizes[] = {kGiB / 2, kGiB, 2 * kGiB, 4 * kGiB, 8 * kGiB};
  for (int i = 0; i < functions; ++i) {
    FunctionSpec s;
    s.model_bytes = sizes[rng.uniform(5)];
    s.slo = static_cast<Duration>(100 + rng.uniform(400)) * kMillisecond;
    s.exec_time_hint = static_cast<Duration>(5 + rng.uniform(45)) * kMillisecond;
    w.specs.push_back(s);
  }
  // Zipf(1) popularity by inverse CDF; the permutation keeps popularity apart from the index.
  std::vector<double> cdf(static_cast<size_t>(functions));
  double sum = 0;
  for (int i = 0; i < functions; ++i) cdf[static_cast<size_t>(i)] = sum += 1.0 / (i + 1);
  std::vector<FunctionId> rank;
  rank.reserve(static_cast<size_t>(functions));
  for (int i = 0; i < functions; ++i) rank.push_back(FunctionId{static_cast<uint32_t>(i + 1)});
  for (size_t i = rank.size(); i > 1; --i) std::swap(rank[i - 1], rank[rng.uniform(i)]);
  const size_t total = kBacklog + kWarmupSteps + kTimedSteps + 1000;
  for (size_t i = 0; i < total; ++i) {
    const double u = rng.uniform_double() * sum;
    const size_t k = static_cast<size_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    w.arrivals.push_back(rank[std::min(k, rank.size() - 1)]);
  }
  return cache.emplace(functions, std::move(w)).first->second;
}

// Baseline p99 per function count, from the FIFO + LRU run registered first.
std::map<int, double>& baseline_p99() {
  static std::map<int, double> p99;
  return p99;
}

// p99 of the scheduler facade per (queue/eviction/placement, functions), for the core's runs.
std::map<std::pair<std::string, int>, double>& facade_p99() {
  static std::map<std::pair<std::string, int>, double> p99;
  return p99;
}

double percentile(const std::vector<int64_t>& sorted, double p) {
  const size_t i =
      std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())));
  return static_cast<double>(sorted[i]);
}

// Runs `step` once per benchmark iteration; each step's own duration, in ns.
template <typename Step>
std::vector<int64_t> time_steps(benchmark::State& state, Step& step) {
  std::vector<int64_t> ns;
  ns.reserve(static_cast<size_t>(state.max_iterations));
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    step();
    const Clock::time_point end = Clock::now();
    const int64_t d = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
    ns.push_back(d);
    state.SetIterationTime(static_cast<double>(d) * 1e-9);
  }
  return ns;
}

// Sets the step-time percentiles and the memory pressure counters; returns p99.
double report(benchmark::State& state, std::vector<int64_t>& ns, const SchedulerCounters& before,
              const SchedulerCounters& after, int functions) {
  const double steps = static_cast<double>(ns.size());
  std::sort(ns.begin(), ns.end());
  const double p99 = percentile(ns, 0.99);
  state.counters["p50_ns"] = percentile(ns, 0.50);
  state.counters["p99_ns"] = p99;
  state.counters["p999_ns"] = percentile(ns, 0.999);
  state.counters["max_ns"] = static_cast<double>(ns.back());
  if (baseline_p99().count(functions))
    state.counters["p99_vs_base"] = p99 / baseline_p99()[functions];
  state.counters["evict_per_req"] = static_cast<double>(after.evictions - before.evictions) / steps;
  state.counters["host_per_req"] =
      static_cast<double>(after.host_swaps - before.host_swaps) / steps;
  return p99;
}

void BM_Decision(benchmark::State& state, const std::string& queue, const std::string& eviction,
                 const std::string& placement, bool baseline) {
  const int functions = static_cast<int>(state.range(0));
  const Workload& w = workload(functions);
  SequenceOracle oracle(w.arrivals);
  SchedulerOptions options;
  options.queue = queue;
  options.eviction = eviction;
  options.placement = placement;
  Result<std::unique_ptr<Scheduler>> created = Scheduler::create(node(), options, &oracle);
  if (!created.ok()) die(created.status(), "creating the scheduler");
  Scheduler& s = **created;
  for (int i = 0; i < functions; ++i) {
    const Status st =
        s.register_function(static_cast<FunctionId>(i + 1), w.specs[static_cast<size_t>(i)], 0);
    if (!st.ok()) die(st, "registering");
  }

  struct InFlight {
    RequestId request;
    FunctionId function;
    bool loading;
  };
  std::deque<InFlight> in_flight;  // oldest first
  std::vector<Decision> decisions;
  size_t next_arrival = 0;
  Time now = 0;
  auto arrive = [&] {
    const Result<RequestId> r = s.arrive(w.arrivals[next_arrival++], now);
    if (!r.ok()) die(r.status(), "arrival");
  };
  auto step = [&] {
    now += kStep;
    if (!in_flight.empty()) {
      const InFlight& r = in_flight.front();
      if (r.loading) (void)s.load_done(r.request, now, true);
      Completion c;
      c.exec = w.specs[r.function.value() - 1].exec_time_hint;
      (void)s.done(r.request, now, c);
      in_flight.pop_front();
    }
    arrive();
    decisions.clear();
    s.dispatch(now, &decisions);
    for (const Decision& d : decisions)
      in_flight.push_back({d.request, d.function, d.source != Source::kResident});
  };

  for (int i = 0; i < kBacklog; ++i) arrive();
  for (int i = 0; i < kWarmupSteps; ++i) step();
  const SchedulerCounters before = s.counters();

  std::vector<int64_t> ns = time_steps(state, step);
  const double p99 = report(state, ns, before, s.counters(), functions);
  if (baseline) baseline_p99()[functions] = p99;
  facade_p99()[{queue + "/" + eviction + "/" + placement, functions}] = p99;
  state.counters["queued"] = static_cast<double>(s.queued());
  if (const Status st = s.check_invariants(); !st.ok()) die(st, "invariants after the run");
}

// The same steps through the node core (node/node_core.h), as hiberd's controller and hiber-sim
// make them: the core's request state machine, reserve accounting and actuator calls on top of
// the facade. The actuator does nothing but note the starts, so what is timed is the core.
class NoteStarts final : public node::Actuator {
 public:
  explicit NoteStarts(const Workload& w) : workload_(w) {}
  // Every function has one instance, numbered as the function.
  Result<uint64_t> evict(InstanceId, GpuId) override { return uint64_t{0}; }
  void forget(InstanceId, GpuId) override {}
  void start(const node::Start& s) override { started.push_back(s); }
  void end(RequestId, InstanceId, const Status&) override {}
  void answer_start(RequestId, const Result<node::StartInfo>&) override {}
  void drained(std::optional<GpuId>) override {}
  void rejected(RequestId, InstanceId, const Status&) override {}
  uint64_t pool_allocated(GpuId) const override { return 0; }
  uint64_t placed_bytes(InstanceId i, GpuId) const override { return model_bytes(i); }
  uint64_t model_bytes(InstanceId i) const override {
    return workload_.specs[i.value() - 1].model_bytes;
  }
  std::vector<node::Start> started;

 private:
  const Workload& workload_;
};

void BM_CoreDecision(benchmark::State& state, const std::string& queue,
                     const std::string& eviction) {
  const int functions = static_cast<int>(state.range(0));
  const Workload& w = workload(functions);
  SequenceOracle oracle(w.arrivals);
  node::NodeOptions options;
  options.scheduler.queue = queue;
  options.scheduler.eviction = eviction;
  NoteStarts actuator(w);
  auto created = node::NodeCore::create(node(), options, actuator, &oracle);
  if (!created.ok()) die(created.status(), "creating the node core");
  node::NodeCore& core = **created;
  for (int i = 0; i < functions; ++i) {
    const FunctionSpec& spec = w.specs[static_cast<size_t>(i)];
    node::FunctionSpec f;
    f.name = str_cat("f", i + 1);
    f.model_bytes = spec.model_bytes;
    f.slo = spec.slo;
    f.exec_time_hint = spec.exec_time_hint;
    const FunctionId id{static_cast<uint32_t>(i + 1)};
    Status st = core.add_function(id, f, 0);
    if (st.ok()) st = core.attach(InstanceId{id.value()}, id, 0);
    if (!st.ok()) die(st, "adding a function");
  }
  std::deque<node::Start> in_flight;  // oldest first
  size_t next_arrival = 0;
  Time now = 0;
  auto arrive = [&] {
    const FunctionId f = w.arrivals[next_arrival++];
    const Result<RequestId> r = core.arrive(f, InstanceId{f.value()}, now);
    if (!r.ok()) die(r.status(), "arrival");
  };
  auto step = [&] {
    now += kStep;
    if (!in_flight.empty()) {
      const node::Start& r = in_flight.front();
      core.streaming(r.request, Status(), now);
      if (r.source != Source::kResident) core.swap_done(r.request, Status(), {}, now);
      (void)core.done(r.request, false, now);
      core.released(r.request, Status(), now);
      in_flight.pop_front();
    }
    arrive();
    actuator.started.clear();
    core.dispatch(now);
    for (const node::Start& s : actuator.started) in_flight.push_back(s);
  };

  for (int i = 0; i < kBacklog; ++i) arrive();
  for (int i = 0; i < kWarmupSteps; ++i) step();
  const SchedulerCounters before = core.scheduler().counters();
  std::vector<int64_t> ns = time_steps(state, step);
  const double p99 = report(state, ns, before, core.scheduler().counters(), functions);
  const auto facade = facade_p99().find({queue + "/" + eviction + "/algorithm1", functions});
  if (facade != facade_p99().end()) state.counters["p99_vs_facade"] = p99 / facade->second;
  if (const Status st = core.scheduler().check_invariants(); !st.ok()) {
    die(st, "invariants after the run");
  }
}

void register_all() {
  auto add = [](const std::string& queue, const std::string& eviction, const std::string& placement,
                bool baseline) {
    const std::string name = "Decision/" + queue + "/" + eviction + "/" + placement;
    benchmark::RegisterBenchmark(name.c_str(), BM_Decision, queue, eviction, placement, baseline)
        ->ArgName("functions")
        ->Arg(1000)
        ->Arg(10000)
        ->Iterations(kTimedSteps)
        ->UseManualTime()
        ->Unit(benchmark::kNanosecond);
  };
  add("fifo", "lru", "algorithm1", /*baseline=*/true);
  for (std::string_view queue : queue_policy_names()) {
    for (std::string_view eviction : eviction_policy_names()) {
      if (queue == "fifo" && eviction == "lru") continue;
      add(std::string(queue), std::string(eviction), "algorithm1", false);
    }
  }
  add("rrc", "heaviness", "random", false);
  // The defaults and the baseline's policies again, through the node core.
  for (const auto& [queue, eviction] :
       {std::pair<std::string, std::string>{"fifo", "lru"}, {"rrc", "heaviness"}}) {
    const std::string name = "CoreDecision/" + queue + "/" + eviction + "/algorithm1";
    benchmark::RegisterBenchmark(name.c_str(), BM_CoreDecision, queue, eviction)
        ->ArgName("functions")
        ->Arg(1000)
        ->Arg(10000)
        ->Iterations(kTimedSteps)
        ->UseManualTime()
        ->Unit(benchmark::kNanosecond);
  }
}

}  // namespace
}  // namespace hiber::scheduler

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  hiber::scheduler::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
