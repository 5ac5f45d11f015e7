// The cluster's load balancer: which node hosts each function.
//
// Torpor's cluster manager routes a request "to a worker node hosting its target function"
// (§4.1, Fig. 3); production runs on Kubernetes (docs/design.md), so we model only the rule, and
// keep it simple: each function is hosted by exactly one node, and functions are placed one by
// one, in deployment order, on the node with the least expected load so far, where a function's
// expected load is its mean request rate times its model's execution time (GPU-seconds per
// second). Ties go to the lower node. Every request of a function goes to its node. The rule is
// scheduler/cluster_balancer.h's, which the router uses too (at deployment nothing is resident
// and every node is up, so it is the least expected load).
//
// Why this rule: it is what a Kubernetes scheduler does with a per-pod resource request equal
// to the function's expected GPU demand (least-allocated scoring), and it needs nothing a
// platform does not know at deployment (the declared model and the function's history).
#pragma once

#include <vector>

#include "sim/workload.h"

namespace hiber::sim {

// node_of[f] for every function of `functions`. REQUIRES: nodes >= 1.
std::vector<int> balance_functions(const std::vector<SimFunction>& functions, int nodes);

// A function's expected load: rate (per second) x execution time (seconds).
double expected_load(const SimFunction& function);

}  // namespace hiber::sim
