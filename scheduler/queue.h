// Request queueing: in which order queued requests are offered to the GPUs.
//
// Three policies, selectable by name (SchedulerOptions::queue, policy_factory.h). Each is a small
// class behind QueuePolicy; the shared machinery (per-function FIFOs, an indexed heap of
// functions) is FunctionQueues.
//
// ---- "rrc" (default): Torpor §5.2 ----
// Per function, over the sliding window (FunctionTable): n = completions, m = completions within
// the deadline, p = the SLO's tail percentile,
//     RRC = (p·n − m) / (1 − p),      0 when n = 0,
// the number of further on-time requests the function needs for its window to reach p (from
// (m + RRC) / (n + RRC) = p). Smaller is closer to compliance; a compliant function has a
// negative RRC, −n when every request was on time. Functions split into a high- and a
// low-priority group by an RRC threshold; high-priority requests are offered first, and
// low-priority ones whenever no high-priority request can start (the dispatcher tries every
// queued function in order, so the node never idles while something could run).
//
// The threshold rule (the paper defers it to a technical report we do not have). Every
// `threshold_refresh`, and at once after the node's capacity or function set changes:
//   1. take the functions with arrivals in the window, with their RRC and their demand
//      (FunctionTable::demand: arrival rate × mean GPU time per request, swaps included, in
//      GPU-seconds per second);
//   2. sort them by (RRC, FunctionId) ascending;
//   3. admit them in that order while their summed demand fits the node's capacity,
//      healthy GPUs × target_utilisation;
//   4. the threshold is the (RRC, FunctionId) of the last admitted function; a function is high
//      priority iff its (RRC, FunctionId) is at most the threshold. When everything fits, the
//      threshold is +inf: everyone is high priority and the policy is its in-group order alone.
// Why. The objective is the number of SLO-compliant functions (§5.1). When the node can serve
// all the demand, any work-conserving order serves everyone and the priority split would only
// reorder; so under light load nobody is demoted. When demand exceeds capacity, some requests
// must wait, and spreading the wait over everyone can make every function miss its percentile.
// Admitting functions by ascending RRC protects, up to what the GPUs can actually serve, those
// nearest to (or already in) compliance, which each need the fewest on-time requests; the
// others absorb the overload but still run on any GPU the high group leaves idle. The threshold
// therefore rises as load falls or GPUs are added and falls as load rises or GPUs fail, which is
// the "adapts to the node's load" of §5.2. Capacity is taken below 1 (0.9 by default) because
// queueing delay grows without bound as utilisation approaches 1: a group that needs 100% of the
// GPUs already waits too long. Demand is measured, not declared, so it includes the node's real
// swap costs. The rule costs expected O(F) per refresh for F functions (no sort: a weighted
// quickselect), amortised over all the decisions of a refresh period; between refreshes, a
// function's group is re-evaluated against the current threshold when one of its requests completes
// (its RRC changes then).
//
// Order within a group: earliest deadline first (EDF), with late requests demoted.
//   - EDF rather than FIFO: when every request can still meet its deadline, EDF minimises the
//     maximum lateness (Jackson's rule), so it meets all deadlines whenever any order does.
//     Functions with tight SLOs (80 ms CV models) go ahead of loose ones (200 ms BERT) that
//     arrived slightly earlier, which FIFO would not do. A function's requests share one SLO,
//     so within a function EDF is FIFO: each function keeps a FIFO lane, and functions compete
//     by the deadline of the request they offer.
//   - Demotion (option demote_late): a request that can no longer meet its deadline even with
//     its model resident (now + expected execution time > deadline) is a miss whatever we do,
//     so it goes behind the feasible requests of its group: serving punctual requests first can
//     only raise m. Within a function, its first feasible request is offered before older late
//     ones; a function with only late requests competes in its group's late tier (by deadline,
//     so late work is still served oldest first and does not starve within the tier). A request
//     once demoted stays demoted; "expected execution" is the function's current estimate.
// Key of a function: (group, late, deadline of the offered request, FunctionId). Only time
// changes it between events, and only upward (requests become late), so the heap is re-keyed
// lazily: the top is re-checked when it is about to be offered.
//
// ---- "fifo": the Torpor-FIFO ablation (§7.3) ----
// Requests in arrival order across all functions (still skipping a function whose request
// cannot start, so there is no head-of-line blocking across functions).
//
// ---- "gshare": gShare's Dual-Queue Lazy Scheduling (ASPLOS'26, Algorithm 1) ----
// Mapping onto Hiber (notes-scheduling-papers.md A.2.3):
//   - a gShare GPU slice is one of our GPUs: Hiber runs one function at a time per GPU, so a
//     GPU is a slice with the whole device's time; "the slice's next available time" is when
//     the request running there is predicted to finish; allocGpuSlice() (a new slice, with a
//     swap) is taking an idle GPU and loading the model there; a node has no more GPUs to
//     allocate, so where gShare redirects to another node we keep the request queued;
//   - predictions are the historical mean plus `gshare_redundancy` (40%, gShare §5.2): the
//     execution D̂ = 1.4 × FunctionTable::exec_estimate, the host swap I = 1.4 ×
//     FunctionTable::swap_estimate, a peer copy 1.4 × bytes / link speed;
//   - classification, at arrival: a request with I + D̂ > SLO is at risk and goes to the cache
//     queue; the others to the slack queue. gShare's I_k is the function's swap-in time, so the
//     test uses the host swap whether or not the model is resident somewhere now;
//   - the cache queue is served first, in arrival order, with locality: the placement policy
//     picks the GPU (Algorithm 1 runs a resident replica first, then a peer copy);
//   - the slack queue is ordered by slack = deadline − now − (I + D̂), smallest first; its
//     order never changes with time, so requests are keyed by the instant their slack runs out,
//     latest_start = deadline − (I + D̂);
//   - findAvailSharedSlice: for a slack-queue request, the best GPU is the one leaving the
//     largest non-negative margin deadline − (now + wait + swap + D̂), where wait is the
//     predicted remaining time of the request running there (0 when idle) and swap is 0 for a
//     resident replica, the peer copy where a linked GPU holds the model, else the host swap.
//     Ties go to an idle GPU, then the lower number;
//   - lazy dispatch: a request with positive slack whose best GPU is busy waits for it rather
//     than taking an idle GPU and swapping. When its slack runs out (or no GPU leaves a
//     non-negative margin), it takes the best available GPU. gShare decrements slack once per
//     scheduler tick; we have no tick, so next_wakeup() reports the earliest instant a waiting
//     request's slack runs out and the caller dispatches then;
//   - ambiguities resolved: gShare's "anti-idling" (run the smallest-slack request on an idle
//     slice) applies here only when that idle GPU is the request's best one; a request whose
//     margin is negative everywhere is not worth waiting for and takes the best available GPU
//     at once; the prediction of a running request counts a swap still in flight (host swap
//     estimate) on top of its execution.
// gShare's per-round work is O(slack-queue functions × GPUs) while some GPU is idle, because
// waiting requests are re-examined each round; it has no latency target (the default policies
// do).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "scheduler/function_queues.h"
#include "scheduler/function_table.h"
#include "scheduler/node_state.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

struct QueueOptions {
  // rrc: how often the threshold is recomputed (also at once after a GPU's health or the set of
  // functions changes). 1 s is a few dozen decisions per GPU at Torpor's request rates, and
  // short next to the 60 s window the RRCs are counted over, so the split follows the window
  // closely while the O(F) refresh stays off almost every decision. >= 0; 0 refreshes on
  // every dispatch.
  Duration threshold_refresh = 1 * kSecond;
  // rrc: the share of the healthy GPUs' time the high-priority group may be given (see above).
  // In (0, 1].
  double target_utilisation = 0.9;
  // rrc: demote requests that can no longer meet their deadline behind the feasible ones.
  bool demote_late = true;
  // rrc: order each group by the deadline of the request a function offers (EDF); false orders
  // it by arrival (FIFO). EDF and demotion are ours, beyond §5.2; both off is the queue as the
  // paper describes it (the "torpor-paper" configuration of hiber-sim's seeds experiment).
  bool earliest_deadline_first = true;
  // gshare: predictions are the historical mean × (1 + gshare_redundancy). gShare uses 0.4
  // (tested 0.3 to 0.5). >= 0.
  double gshare_redundancy = 0.4;
};

// kInvalidValue naming the first bad field.
Status validate(const QueueOptions& options);

// ---- RRC ----

// (p·n − m) / (1 − p); 0 when n = 0.
double required_request_count(double p, uint64_t n, uint64_t m);
// Function i's RRC over its window at `now`.
double function_rrc(const FunctionTable& functions, FunctionIndex i, Time now);

// The boundary between the groups: a function is high priority iff (rrc, id) <= (rrc, id) here
// (lexicographically), or everyone is.
struct RrcThreshold {
  bool everyone = true;
  double rrc = -std::numeric_limits<double>::infinity();  // -inf: nobody (the first did not fit)
  FunctionId id{0};  // with rrc, the last high-priority function (unless everyone)

  bool high(double function_rrc, FunctionId function_id) const {
    if (everyone) return true;
    return function_rrc < rrc || (function_rrc == rrc && function_id <= id);
  }
};

struct RrcDemand {
  double rrc = 0;
  FunctionId id;
  double demand = 0;  // GPU-seconds per second
};

// The threshold rule above, steps 2-4. Reorders `functions`. Expected O(F): nothing is sorted
// when all the demand fits, and under overload a weighted quickselect finds the boundary.
RrcThreshold rrc_threshold(std::vector<RrcDemand>& functions, double capacity);

// ---- The policy interface ----

// What a queue policy sees of the node.
struct QueueContext {
  Time now = 0;
  const NodeState& node;
  const FunctionTable& functions;
  // Per GPU: when the request running there was dispatched (meaningless while none is).
  std::span<const Time> started;
};

// A queued request offered to the dispatcher. It stays queued until take().
struct QueueCandidate {
  RequestId request{0};           // set by QueuePolicy::next()
  FunctionIndex function{0};      // set by QueuePolicy::next()
  GpuMask allowed = ~GpuMask{0};  // the GPUs it may start on
  uint32_t entry = 0;             // the policy's own handles
  uint32_t lane = 0;
};

// A dispatch round, as the Scheduler runs it:
//   begin_round(ctx);
//   while (a GPU is available && next(ctx, &c)) {
//     if (c can be placed and started) take(c, ctx); else pass(c, ctx);
//   }
//   end_round(ctx);
// next() offers each function at most once per round unless it was taken (a function below its
// concurrency limit may then offer its next request). Between rounds the Scheduler reports
// arrivals, withdrawals, completions and eligibility.
class QueuePolicy {
 public:
  virtual ~QueuePolicy() = default;
  virtual std::string_view name() const = 0;

  // A function was registered with index f.
  virtual void add_function(FunctionIndex f) = 0;
  // The node's capacity or function set changed: the next round must not use stale priorities.
  virtual void invalidate() = 0;

  virtual void push(const QueuedRequest& request, const QueueContext& ctx) = 0;
  // Withdraws a queued request; false if it is not queued.
  virtual bool erase(RequestId request, const QueueContext& ctx) = 0;
  // Withdraws every queued request of f, appending their ids to `out` in arrival order.
  virtual void erase_function(FunctionIndex f, std::vector<RequestId>* out) = 0;
  virtual bool contains(RequestId request) const = 0;
  virtual size_t size() const = 0;

  // f reached (false) or left (true) its concurrency limit.
  virtual void set_eligible(FunctionIndex f, bool eligible, const QueueContext& ctx) = 0;
  // A request of f completed (its RRC and estimates changed).
  virtual void on_completion(FunctionIndex f, const QueueContext& ctx) = 0;

  virtual void begin_round(const QueueContext& ctx) = 0;
  virtual bool next(const QueueContext& ctx, QueueCandidate* out) = 0;
  // The candidate starts: it leaves the queue.
  virtual void take(const QueueCandidate& candidate, const QueueContext& ctx) = 0;
  // The candidate cannot start now: its function is not offered again this round.
  virtual void pass(const QueueCandidate& candidate, const QueueContext& ctx) = 0;
  virtual void end_round(const QueueContext& ctx) = 0;

  // When the policy wants a round although no event happens; Scheduler::kNever-like INT64_MAX
  // when never.
  virtual Time next_wakeup() const = 0;

  virtual Status check_invariants() const = 0;
};

std::unique_ptr<QueuePolicy> make_rrc_queue(const QueueOptions& options);
std::unique_ptr<QueuePolicy> make_fifo_queue();
std::unique_ptr<QueuePolicy> make_gshare_queue(const QueueOptions& options);

}  // namespace hiber::scheduler
