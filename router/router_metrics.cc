#include "router/router_metrics.h"

#include <prometheus/text_serializer.h>

#include "common/build_info.h"

namespace hiber::router {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// From 1 ms to a minute: inference requests, their queueing, and cold starts.
const prometheus::Histogram::BucketBoundaries& latency_buckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return kBuckets;
}

}  // namespace

RouterMetrics::RouterMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      invocations_(BuildCounter()
                       .Name("hiber_invocations_total")
                       .Help("Invocations answered, by function and HTTP status")
                       .Register(*registry_)),
      duration_(BuildHistogram()
                    .Name("hiber_invocation_duration_seconds")
                    .Help("From the request's arrival at the router to its answer")
                    .Register(*registry_)),
      queue_wait_(BuildHistogram()
                      .Name("hiber_queue_wait_seconds")
                      .Help("From arrival to start: the router's queue, then hiberd's")
                      .Register(*registry_)),
      execution_(BuildHistogram()
                     .Name("hiber_execution_duration_seconds")
                     .Help("From start to the function's answer (swap-in overlapped included)")
                     .Register(*registry_)),
      slo_violations_(BuildCounter()
                          .Name("hiber_slo_violations_total")
                          .Help("Invocations answered after their function's SLO, or failed")
                          .Register(*registry_)),
      shed_(BuildCounter()
                .Name("hiber_invocations_shed_total")
                .Help("Invocations answered 503 because hiberd shed them as overloaded (they "
                      "could not meet their deadline)")
                .Register(*registry_)),
      queued_(BuildGauge()
                  .Name("hiber_router_queued_requests")
                  .Help("Requests waiting at the router for a free worker")
                  .Register(*registry_)),
      instances_(BuildGauge()
                     .Name("hiber_worker_instances")
                     .Help("Running worker processes (warm or starting)")
                     .Register(*registry_)),
      worker_starts_(BuildCounter()
                         .Name("hiber_worker_starts_total")
                         .Help("Worker processes started")
                         .Register(*registry_)),
      worker_losses_(BuildCounter()
                         .Name("hiber_worker_failures_total")
                         .Help("Workers that died or broke the protocol, not stopped by the router")
                         .Register(*registry_)),
      node_up_(BuildGauge()
                   .Name("hiber_node_up")
                   .Help("1 when the node's hiberd answers its control calls")
                   .Register(*registry_)),
      connections_(BuildGauge()
                       .Name("hiber_router_http_connections")
                       .Help("Open HTTP connections")
                       .Register(*registry_)) {
  BuildGauge()
      .Name("hiber_build_info")
      .Help("The build: version and git commit (always 1)")
      .Register(*registry_)
      .Add({{"version", build_version()}, {"commit", build_commit()}, {"program", "hiber-router"}})
      .Set(1);
}

void RouterMetrics::invocation(const std::string& function, unsigned status, double total_seconds,
                               std::optional<double> queue_wait_seconds,
                               std::optional<double> execution_seconds, bool slo_violated) {
  invocations_.Add({{"function", function}, {"status", std::to_string(status)}}).Increment();
  duration_.Add({{"function", function}}, latency_buckets()).Observe(total_seconds);
  if (queue_wait_seconds) {
    queue_wait_.Add({{"function", function}}, latency_buckets()).Observe(*queue_wait_seconds);
  }
  if (execution_seconds) {
    execution_.Add({{"function", function}}, latency_buckets()).Observe(*execution_seconds);
  }
  auto& violations = slo_violations_.Add({{"function", function}});
  if (slo_violated) violations.Increment();
  shed_.Add({{"function", function}});  // 0 until one is shed, so rates have a series
}

void RouterMetrics::rejected(const std::string& function, unsigned status) {
  invocations_.Add({{"function", function}, {"status", std::to_string(status)}}).Increment();
}

void RouterMetrics::shed(const std::string& function) {
  shed_.Add({{"function", function}}).Increment();
}

void RouterMetrics::set_queued(const std::string& function, double queued) {
  queued_.Add({{"function", function}}).Set(queued);
}

void RouterMetrics::set_instances(const std::string& function, double instances) {
  instances_.Add({{"function", function}}).Set(instances);
}

void RouterMetrics::worker_started(const std::string& function) {
  worker_starts_.Add({{"function", function}}).Increment();
}

void RouterMetrics::worker_lost(const std::string& function) {
  worker_losses_.Add({{"function", function}}).Increment();
}

void RouterMetrics::set_node_up(const std::string& node, bool up) {
  node_up_.Add({{"node", node}}).Set(up ? 1 : 0);
}

void RouterMetrics::set_connections(double connections) { connections_.Add({}).Set(connections); }

void RouterMetrics::forget(const std::string& function) {
  const std::map<std::string, std::string> labels = {{"function", function}};
  for (auto* family : {&queued_, &instances_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
  for (auto* family : {&worker_starts_, &worker_losses_, &slo_violations_, &shed_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
  for (auto* family : {&duration_, &queue_wait_, &execution_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels, latency_buckets()));
  }
  // One series per status the function answered: found in what the family holds.
  for (const prometheus::MetricFamily& collected : invocations_.Collect()) {
    for (const prometheus::ClientMetric& metric : collected.metric) {
      std::map<std::string, std::string> series;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        series[label.name] = label.value;
      }
      if (series.count("function") && series["function"] == function && invocations_.Has(series)) {
        invocations_.Remove(&invocations_.Add(series));
      }
    }
  }
}

std::string RouterMetrics::serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace hiber::router
