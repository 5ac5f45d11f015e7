// The router's Prometheus metrics (prometheus-cpp): names with the hiber_ prefix, base units,
// _total on counters, and labels by function, status and node only, never per request.
//
// Thread safety: prometheus-cpp's metrics are safe to update and collect from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace hiber::router {

class RouterMetrics {
 public:
  RouterMetrics();

  // A finished invocation: its HTTP status, and the times it took (seconds). queue_wait and
  // execution are absent for a request that never reached a worker.
  void invocation(const std::string& function, unsigned status, double total_seconds,
                  std::optional<double> queue_wait_seconds, std::optional<double> execution_seconds,
                  bool slo_violated);
  // An invocation the router refused before it reached a worker (a client's mistake, a full
  // queue, no node): counted by status, but no time observed and no SLO violation.
  void rejected(const std::string& function, unsigned status);
  // An invocation hiberd answered "overloaded" (its --shed): counted apart from failures, after
  // its invocation().
  void shed(const std::string& function);
  void set_queued(const std::string& function, double queued);
  void set_instances(const std::string& function, double instances);
  void worker_started(const std::string& function);
  void worker_lost(const std::string& function);
  void set_node_up(const std::string& node, bool up);
  void set_connections(double connections);
  // Drops every series of a function (unloaded): a reload starts them all from zero, as the
  // router's own counts in /v2/status.
  void forget(const std::string& function);

  // The text exposition of every metric.
  std::string serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& invocations_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Histogram>& queue_wait_;
  prometheus::Family<prometheus::Histogram>& execution_;
  prometheus::Family<prometheus::Counter>& slo_violations_;
  prometheus::Family<prometheus::Counter>& shed_;
  prometheus::Family<prometheus::Gauge>& queued_;
  prometheus::Family<prometheus::Gauge>& instances_;
  prometheus::Family<prometheus::Counter>& worker_starts_;
  prometheus::Family<prometheus::Counter>& worker_losses_;
  prometheus::Family<prometheus::Gauge>& node_up_;
  prometheus::Family<prometheus::Gauge>& connections_;
};

}  // namespace hiber::router
