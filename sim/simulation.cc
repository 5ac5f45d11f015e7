#include "sim/simulation.h"

#include <memory>

#include "scheduler/oracle.h"
#include "sim/balancer.h"

namespace hiber::sim {

bool needs_oracle(const std::string& eviction) {
  return eviction == "belady" || eviction == "cremebrulee-oracle";
}

Result<RunOutput> simulate(const SystemSpec& system, const RunConfig& config,
                           const Workload& workload) {
  if (config.nodes < 1) return error(ErrorCode::kInvalidValue, "need at least one node");
  if (config.warmup < 0 || config.drain < 0)
    return error(ErrorCode::kInvalidValue, "warm-up and drain must be >= 0");
  const std::vector<int> node_of = balance_functions(workload.functions, config.nodes);

  EventQueue queue;
  Recorder recorder(workload, config.warmup, config.nodes, config.node.gpu_count());
  std::vector<std::unique_ptr<scheduler::SequenceOracle>> oracles;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int n = 0; n < config.nodes; ++n) {
    if (system.kind == SystemKind::kHiber) {
      const scheduler::FutureOracle* oracle = nullptr;
      if (needs_oracle(system.hiber.scheduler.eviction)) {
        // The node's own arrival sequence, in the order its scheduler will accept them.
        std::vector<scheduler::FunctionId> sequence;
        for (const Arrival& a : workload.arrivals) {
          if (node_of[a.function] == n) sequence.push_back(scheduler::FunctionId{a.function + 1});
        }
        oracles.push_back(std::make_unique<scheduler::SequenceOracle>(sequence));
        oracle = oracles.back().get();
      }
      HIBER_ASSIGN_OR_RETURN(
          std::unique_ptr<HiberNode> node,
          HiberNode::create(config.node, system.hiber, &queue, &recorder, n, oracle));
      nodes.push_back(std::move(node));
    } else {
      HIBER_ASSIGN_OR_RETURN(
          std::unique_ptr<EarlyBindingNode> node,
          EarlyBindingNode::create(config.node, system.early, &queue, &recorder, n));
      nodes.push_back(std::move(node));
    }
  }
  for (size_t f = 0; f < workload.functions.size(); ++f) {
    HIBER_RETURN_IF_ERROR(
        nodes[node_of[f]]->add_function(static_cast<uint32_t>(f), workload.functions[f], 0));
  }

  const Time end = workload.duration + config.drain;
  size_t next = 0;
  while (true) {
    const bool have_arrival = next < workload.arrivals.size();
    const bool have_event = !queue.empty() && queue.next_time() <= end;
    if (!have_arrival && !have_event) break;
    if (have_event && (!have_arrival || queue.next_time() <= workload.arrivals[next].time)) {
      queue.run_next();
      continue;
    }
    const Arrival& a = workload.arrivals[next++];
    queue.advance_to(a.time);
    nodes[node_of[a.function]]->arrive(a.function, a.time);
  }
  RunOutput out;
  for (auto& node : nodes) {
    node->finish(end);
    out.node_summaries.push_back(node->summary());
  }
  out.results = recorder.results();
  out.events = queue.executed();
  out.arrivals = workload.arrivals.size();
  return out;
}

}  // namespace hiber::sim
