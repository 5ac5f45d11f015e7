// hiberd's Prometheus metrics as a function of its status report: the control socket's
// NodeStatus (wire/schema/control.capnp) is the single source, so /metrics and `hiberctl status`
// can never disagree and nothing walks hiberd's state twice. Pure: no I/O, no clock.
//
// Names follow Prometheus's conventions: the hiber_ prefix, base units (seconds, bytes), _total
// on counters, labels only for bounded sets (GPU ordinal, link, reason, state). The list is in
// docs/hiberd.md, "Metrics". GPU utilisation and power are DCGM's, not ours.
#pragma once

#include <string>
#include <vector>

#include <prometheus/metric_family.h>

#include "wire/schema/control.capnp.h"

namespace hiber::server {

// What hiber_build_info reports.
struct BuildInfo {
  std::string version;
  std::string commit;  // "unknown" outside a git checkout
};

// The build hiberd was compiled from (the git commit is taken at configure time).
BuildInfo this_build();

// The metric families of one status report, in a fixed order.
std::vector<prometheus::MetricFamily> metric_families(wire::proto::NodeStatus::Reader status,
                                                      const BuildInfo& build);

}  // namespace hiber::server
