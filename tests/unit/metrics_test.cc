// server/metrics.h: a hand-built status report maps to exactly the metric families and values
// docs/hiberd.md lists (names, labels, types, cumulative histogram buckets).
#include "server/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <capnp/message.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <set>

namespace hiber::server {
namespace {

namespace proto = wire::proto;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

const MetricFamily* family(const std::vector<MetricFamily>& all, const std::string& name) {
  for (const MetricFamily& f : all) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The sample of `name` with exactly `labels` (in any order), if there is one.
std::optional<ClientMetric> sample(const std::vector<MetricFamily>& all, const std::string& name,
                                   Labels labels = {}) {
  const MetricFamily* f = family(all, name);
  if (f == nullptr) return std::nullopt;
  std::sort(labels.begin(), labels.end());
  for (const ClientMetric& m : f->metric) {
    Labels have = m.label;
    std::sort(have.begin(), have.end());
    if (have == labels) return m;
  }
  return std::nullopt;
}

double counter(const std::vector<MetricFamily>& all, const std::string& name, Labels labels = {}) {
  EXPECT_EQ(family(all, name) ? family(all, name)->type : MetricType::Untyped, MetricType::Counter)
      << name;
  auto m = sample(all, name, std::move(labels));
  EXPECT_TRUE(m.has_value()) << name;
  return m ? m->counter.value : NAN;
}

double gauge(const std::vector<MetricFamily>& all, const std::string& name, Labels labels = {}) {
  EXPECT_EQ(family(all, name) ? family(all, name)->type : MetricType::Untyped, MetricType::Gauge)
      << name;
  auto m = sample(all, name, std::move(labels));
  EXPECT_TRUE(m.has_value()) << name;
  return m ? m->gauge.value : NAN;
}

void set_histogram(proto::Histogram::Builder h, std::vector<double> bounds,
                   std::vector<uint64_t> counts, double sum) {
  auto b = h.initUpperBounds(static_cast<unsigned>(bounds.size()));
  for (unsigned i = 0; i < bounds.size(); ++i) b.set(i, bounds[i]);
  auto c = h.initCounts(static_cast<unsigned>(counts.size()));
  uint64_t total = 0;
  for (unsigned i = 0; i < counts.size(); ++i) {
    c.set(i, counts[i]);
    total += counts[i];
  }
  h.setSum(sum);
  h.setCount(total);
}

// A node of two GPUs, three sessions, four functions.
class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = message_->initRoot<proto::NodeStatus>();
    s.setUptimeSeconds(12.5);
    auto devices = s.initDevices(2);
    for (unsigned g = 0; g < 2; ++g) {
      auto d = devices[g];
      d.setOrdinal(g);
      d.setHealthy(g == 0);
      d.setPoolBytes(1000 + g);
      d.setPoolAllocatedBytes(300 + 100 * g);
      d.setPoolFragmentation(0.25 * (g + 1));
      auto reasons = d.initEvictionsByReason(3);
      const char* names[] = {"placement", "memory", "drain"};
      for (unsigned r = 0; r < 3; ++r) {
        reasons[r].setReason(names[r]);
        reasons[r].setCount(10 * g + r);
      }
    }
    s.initSessions(3);
    auto functions = s.initFunctions(4);
    functions[0].setFunctionId("resident-two");
    functions[0].initResidentGpus(2);
    functions[0].setHostCopyBytes(5);
    functions[1].setFunctionId("resident-one");
    functions[1].initResidentGpus(1);
    functions[2].setFunctionId("sleeping");
    functions[2].setHostCopyBytes(7);
    functions[3].setFunctionId("never-ran");  // no replica, no host copy: neither
    auto sched = s.initScheduler();
    sched.setQueued(4);
    sched.setArrivals(40);
    sched.setCompleted(33);
    sched.setOnTime(30);
    sched.setBackground(6);
    sched.setShed(5);
    sched.setPreemptions(2);
    sched.setHostPoolBytes(1 << 30);
    sched.setHostPoolUsedBytes(123456);
    auto links = s.initSwapsByLink(3);
    const char* link_names[] = {"nvlink", "pcie", "host"};
    for (unsigned l = 0; l < 3; ++l) {
      links[l].setLink(link_names[l]);
      links[l].setSwaps(l + 1);
      links[l].setBytes(1000 * (l + 1));
    }
    set_histogram(s.initSwapDuration(), {0.01, 0.1, 1}, {2, 0, 3, 1}, 4.5);
    auto c = s.initCounters();
    c.setSessionsOpened(9);
    c.setSessionsClosed(6);
    c.setHandshakesRejected(2);
    c.setMalformedMessages(1);
    c.setControlRequests(77);
    c.setCachedModules(3);
    c.setCachedModuleBytes(4096);
    c.setModuleCacheHits(8);
    c.setModuleCacheMisses(3);
    c.setModuleCacheUnknownHashes(1);
    c.setRemotedCalls(500);
    c.setRemotedBatches(20);
    set_histogram(c.initBatchSize(), {1, 8, 64}, {5, 10, 4, 1}, 500);
    families_ = metric_families(message_->getRoot<proto::NodeStatus>().asReader(),
                                BuildInfo{"1.2.3", "abc123"});
  }

  // Held by pointer: its destructor may throw, which a test fixture's may not.
  std::unique_ptr<capnp::MallocMessageBuilder> message_ =
      std::make_unique<capnp::MallocMessageBuilder>();
  std::vector<MetricFamily> families_;
};

TEST_F(MetricsTest, SessionsRequestsAndCounters) {
  const auto& f = families_;
  EXPECT_EQ(gauge(f, "hiber_build_info", {{"version", "1.2.3"}, {"commit", "abc123"}}), 1);
  EXPECT_EQ(gauge(f, "hiber_uptime_seconds"), 12.5);
  EXPECT_EQ(gauge(f, "hiber_sessions"), 3);
  EXPECT_EQ(counter(f, "hiber_sessions_opened_total"), 9);
  EXPECT_EQ(counter(f, "hiber_sessions_closed_total"), 6);
  EXPECT_EQ(counter(f, "hiber_handshakes_rejected_total"), 2);
  EXPECT_EQ(counter(f, "hiber_malformed_messages_total"), 1);
  EXPECT_EQ(counter(f, "hiber_control_requests_total"), 77);
  EXPECT_EQ(counter(f, "hiber_remoted_calls_total"), 500);
  EXPECT_EQ(counter(f, "hiber_remoted_batches_total"), 20);
  EXPECT_EQ(gauge(f, "hiber_queue_depth"), 4);
  EXPECT_EQ(counter(f, "hiber_requests_arrived_total"), 40);
  EXPECT_EQ(counter(f, "hiber_requests_completed_total"), 33);
  EXPECT_EQ(counter(f, "hiber_requests_on_time_total"), 30);
  EXPECT_EQ(counter(f, "hiber_background_requests_total"), 6);
  EXPECT_EQ(counter(f, "hiber_requests_shed_total"), 5);
  EXPECT_EQ(counter(f, "hiber_lease_preemptions_total"), 2);
  EXPECT_EQ(gauge(f, "hiber_module_cache_images"), 3);
  EXPECT_EQ(gauge(f, "hiber_module_cache_image_bytes"), 4096);
  EXPECT_EQ(counter(f, "hiber_module_cache_hits_total"), 8);
  EXPECT_EQ(counter(f, "hiber_module_cache_misses_total"), 3);
  EXPECT_EQ(counter(f, "hiber_module_cache_unknown_hashes_total"), 1);
}

TEST_F(MetricsTest, SwapsByLinkAndEvictionsByGpuAndReason) {
  const auto& f = families_;
  EXPECT_EQ(counter(f, "hiber_swaps_total", {{"link", "nvlink"}}), 1);
  EXPECT_EQ(counter(f, "hiber_swaps_total", {{"link", "pcie"}}), 2);
  EXPECT_EQ(counter(f, "hiber_swaps_total", {{"link", "host"}}), 3);
  EXPECT_EQ(counter(f, "hiber_swap_bytes_total", {{"link", "nvlink"}}), 1000);
  EXPECT_EQ(counter(f, "hiber_swap_bytes_total", {{"link", "pcie"}}), 2000);
  EXPECT_EQ(counter(f, "hiber_swap_bytes_total", {{"link", "host"}}), 3000);
  EXPECT_EQ(family(f, "hiber_swaps_total")->metric.size(), 3u);
  EXPECT_EQ(counter(f, "hiber_evictions_total", {{"gpu", "0"}, {"reason", "placement"}}), 0);
  EXPECT_EQ(counter(f, "hiber_evictions_total", {{"gpu", "0"}, {"reason", "drain"}}), 2);
  EXPECT_EQ(counter(f, "hiber_evictions_total", {{"gpu", "1"}, {"reason", "placement"}}), 10);
  EXPECT_EQ(counter(f, "hiber_evictions_total", {{"gpu", "1"}, {"reason", "memory"}}), 11);
  EXPECT_EQ(counter(f, "hiber_evictions_total", {{"gpu", "1"}, {"reason", "drain"}}), 12);
  EXPECT_EQ(family(f, "hiber_evictions_total")->metric.size(), 6u);
}

TEST_F(MetricsTest, ModelsAndMemory) {
  const auto& f = families_;
  EXPECT_EQ(gauge(f, "hiber_models_resident"), 2);
  EXPECT_EQ(gauge(f, "hiber_models_sleeping"), 1);
  EXPECT_EQ(gauge(f, "hiber_pool_bytes", {{"gpu", "0"}, {"state", "used"}}), 300);
  EXPECT_EQ(gauge(f, "hiber_pool_bytes", {{"gpu", "0"}, {"state", "free"}}), 700);
  EXPECT_EQ(gauge(f, "hiber_pool_bytes", {{"gpu", "1"}, {"state", "used"}}), 400);
  EXPECT_EQ(gauge(f, "hiber_pool_bytes", {{"gpu", "1"}, {"state", "free"}}), 601);
  EXPECT_EQ(gauge(f, "hiber_pool_fragmentation_ratio", {{"gpu", "0"}}), 0.25);
  EXPECT_EQ(gauge(f, "hiber_pool_fragmentation_ratio", {{"gpu", "1"}}), 0.5);
  EXPECT_EQ(gauge(f, "hiber_gpu_healthy", {{"gpu", "0"}}), 1);
  EXPECT_EQ(gauge(f, "hiber_gpu_healthy", {{"gpu", "1"}}), 0);
  EXPECT_EQ(gauge(f, "hiber_host_repository_bytes", {{"state", "used"}}), 123456);
  EXPECT_EQ(gauge(f, "hiber_host_repository_bytes", {{"state", "capacity"}}), 1 << 30);
}

TEST_F(MetricsTest, HistogramsHaveCumulativeBucketsEndingAtInfinity) {
  auto swap = sample(families_, "hiber_swap_duration_seconds");
  ASSERT_TRUE(swap.has_value());
  EXPECT_EQ(family(families_, "hiber_swap_duration_seconds")->type, MetricType::Histogram);
  EXPECT_EQ(swap->histogram.sample_count, 6u);
  EXPECT_EQ(swap->histogram.sample_sum, 4.5);
  ASSERT_EQ(swap->histogram.bucket.size(), 4u);
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<double, uint64_t>> expected = {{0.01, 2}, {0.1, 2}, {1, 5}, {inf, 6}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(swap->histogram.bucket[i].upper_bound, expected[i].first) << i;
    EXPECT_EQ(swap->histogram.bucket[i].cumulative_count, expected[i].second) << i;
  }
  auto batch = sample(families_, "hiber_remoted_batch_size");
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->histogram.sample_count, 20u);
  EXPECT_EQ(batch->histogram.sample_sum, 500);
  ASSERT_EQ(batch->histogram.bucket.size(), 4u);
  EXPECT_EQ(batch->histogram.bucket[1].cumulative_count, 15u);
  EXPECT_EQ(batch->histogram.bucket[3].cumulative_count, 20u);

  // As text: one +Inf bucket, equal to the count.
  const std::string text = prometheus::TextSerializer().Serialize(families_);
  EXPECT_NE(text.find("hiber_swap_duration_seconds_bucket{le=\"+Inf\"} 6\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("hiber_swap_duration_seconds_bucket{le=\"1\"} 5\n"), std::string::npos);
  EXPECT_EQ(text.find("le=\"+Inf\"} 6\nhiber_swap_duration_seconds_bucket{le=\"+Inf\""),
            std::string::npos);
}

TEST_F(MetricsTest, NamesFollowPrometheusConventions) {
  std::set<std::string> names;
  for (const MetricFamily& f : families_) {
    EXPECT_TRUE(names.insert(f.name).second) << "duplicate " << f.name;
    EXPECT_EQ(f.name.rfind("hiber_", 0), 0u) << f.name;
    const bool total = f.name.size() > 6 && f.name.substr(f.name.size() - 6) == "_total";
    EXPECT_EQ(total, f.type == MetricType::Counter) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
  }
}

}  // namespace
}  // namespace hiber::server
