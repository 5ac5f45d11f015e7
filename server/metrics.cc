#include "server/metrics.h"

#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "common/build_info.h"

namespace hiber::server {
namespace {

namespace proto = wire::proto;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

class Families {
 public:
  // add() hands out references that must stay valid while later families are added.
  Families() { families_.reserve(64); }
  MetricFamily& add(std::string name, std::string help, MetricType type) {
    families_.push_back(MetricFamily{std::move(name), std::move(help), type, {}});
    return families_.back();
  }
  // One family holding one sample without labels.
  void single(std::string name, std::string help, MetricType type, double value) {
    sample(add(std::move(name), std::move(help), type), {}, value);
  }
  std::vector<MetricFamily> take() { return std::move(families_); }

  static void sample(MetricFamily& family, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    if (family.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    family.metric.push_back(std::move(m));
  }

 private:
  std::vector<MetricFamily> families_;
};

double as_double(uint64_t v) { return static_cast<double>(v); }

// A status Histogram (per-bucket counts, the last for +Inf) as Prometheus's (cumulative).
ClientMetric histogram(proto::Histogram::Reader in) {
  ClientMetric m;
  m.histogram.sample_count = in.getCount();
  m.histogram.sample_sum = in.getSum();
  auto bounds = in.getUpperBounds();
  auto counts = in.getCounts();
  uint64_t cumulative = 0;
  for (unsigned i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    const double bound = i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity();
    m.histogram.bucket.push_back({cumulative, bound});
  }
  return m;
}

std::string gpu_label(uint32_t ordinal) { return std::to_string(ordinal); }

}  // namespace

std::vector<MetricFamily> metric_families(proto::NodeStatus::Reader status,
                                          const BuildInfo& build) {
  Families out;
  const auto counters = status.getCounters();
  const auto sched = status.getScheduler();

  Families::sample(out.add("hiber_build_info", "The hiberd build: its version and git commit",
                           MetricType::Gauge),
                   {{"version", build.version}, {"commit", build.commit}}, 1);
  out.single("hiber_uptime_seconds", "Time since hiberd started", MetricType::Gauge,
             status.getUptimeSeconds());

  // Sessions and the calls they remote.
  out.single("hiber_sessions", "Connected sessions (function instances)", MetricType::Gauge,
             status.getSessions().size());
  out.single("hiber_sessions_opened_total", "Sessions opened", MetricType::Counter,
             as_double(counters.getSessionsOpened()));
  out.single("hiber_sessions_closed_total", "Sessions closed", MetricType::Counter,
             as_double(counters.getSessionsClosed()));
  out.single("hiber_handshakes_rejected_total", "Connections refused", MetricType::Counter,
             as_double(counters.getHandshakesRejected()));
  out.single("hiber_malformed_messages_total",
             "Handshakes, batches and control requests hiberd could not read", MetricType::Counter,
             as_double(counters.getMalformedMessages()));
  out.single("hiber_control_requests_total", "Requests on the control socket", MetricType::Counter,
             as_double(counters.getControlRequests()));
  out.single("hiber_remoted_calls_total", "Calls functions remoted to hiberd (executed or failed)",
             MetricType::Counter, as_double(counters.getRemotedCalls()));
  out.single("hiber_remoted_batches_total", "Batches of calls functions sent", MetricType::Counter,
             as_double(counters.getRemotedBatches()));
  out.add("hiber_remoted_batch_size", "Calls per batch", MetricType::Histogram)
      .metric.push_back(histogram(counters.getBatchSize()));

  // Requests.
  out.single("hiber_queue_depth", "Requests waiting for a GPU", MetricType::Gauge,
             as_double(sched.getQueued()));
  out.single("hiber_requests_arrived_total", "Requests the router reported arrived",
             MetricType::Counter, as_double(sched.getArrivals()));
  out.single("hiber_requests_completed_total", "Requests completed", MetricType::Counter,
             as_double(sched.getCompleted()));
  out.single("hiber_requests_on_time_total", "Requests completed within their SLO",
             MetricType::Counter, as_double(sched.getOnTime()));
  out.single("hiber_background_requests_total",
             "GPU uses outside any request (a function's start-up and the like)",
             MetricType::Counter, as_double(sched.getBackground()));
  out.single("hiber_requests_shed_total",
             "Requests answered 'overloaded' without running: they could not meet their "
             "deadline (--shed)",
             MetricType::Counter, as_double(sched.getShed()));
  out.single("hiber_lease_preemptions_total",
             "GPU uses outside any request ended after their slice because another function "
             "waited (--lease_slice_ms)",
             MetricType::Counter, as_double(sched.getPreemptions()));

  // Swaps and evictions.
  MetricFamily& swaps =
      out.add("hiber_swaps_total", "Models brought onto a GPU, by link", MetricType::Counter);
  MetricFamily& swap_bytes =
      out.add("hiber_swap_bytes_total", "Bytes those swaps moved, by link", MetricType::Counter);
  for (auto link : status.getSwapsByLink()) {
    Families::sample(swaps, {{"link", link.getLink().cStr()}}, as_double(link.getSwaps()));
    Families::sample(swap_bytes, {{"link", link.getLink().cStr()}}, as_double(link.getBytes()));
  }
  out.add("hiber_swap_duration_seconds", "Time per swap, first copy to last group done",
          MetricType::Histogram)
      .metric.push_back(histogram(status.getSwapDuration()));
  MetricFamily& evictions =
      out.add("hiber_evictions_total", "Models evicted from a GPU, by why", MetricType::Counter);
  for (auto device : status.getDevices()) {
    for (auto reason : device.getEvictionsByReason()) {
      Families::sample(evictions,
                       {{"gpu", gpu_label(device.getOrdinal())}, {"reason", reason.getReason()}},
                       as_double(reason.getCount()));
    }
  }

  // Models: resident on some GPU, or asleep with only their host copy.
  uint64_t resident = 0;
  uint64_t sleeping = 0;
  for (auto f : status.getFunctions()) {
    if (f.getResidentGpus().size() > 0) {
      ++resident;
    } else if (f.getHostCopyBytes() > 0) {
      ++sleeping;
    }
  }
  out.single("hiber_models_resident", "Models on at least one GPU", MetricType::Gauge,
             as_double(resident));
  out.single("hiber_models_sleeping", "Models held only as a host copy", MetricType::Gauge,
             as_double(sleeping));
  out.single("hiber_functions", "Functions hiberd knows: registered, or connected on their own",
             MetricType::Gauge, as_double(status.getFunctions().size()));

  // Memory.
  MetricFamily& pool =
      out.add("hiber_pool_bytes", "GPU pool memory, used and free", MetricType::Gauge);
  MetricFamily& fragmentation = out.add("hiber_pool_fragmentation_ratio",
                                        "1 - the largest free block / the largest there could be "
                                        "(the free bytes, at most one chunk): 0 for an empty pool",
                                        MetricType::Gauge);
  MetricFamily& healthy =
      out.add("hiber_gpu_healthy", "1 while the GPU takes requests' work (no failed transfer)",
              MetricType::Gauge);
  for (auto device : status.getDevices()) {
    const std::string gpu = gpu_label(device.getOrdinal());
    const uint64_t used = device.getPoolAllocatedBytes();
    const uint64_t total = device.getPoolBytes();
    Families::sample(pool, {{"gpu", gpu}, {"state", "used"}}, as_double(used));
    Families::sample(pool, {{"gpu", gpu}, {"state", "free"}},
                     as_double(total > used ? total - used : 0));
    Families::sample(fragmentation, {{"gpu", gpu}}, device.getPoolFragmentation());
    Families::sample(healthy, {{"gpu", gpu}}, device.getHealthy() ? 1 : 0);
  }
  MetricFamily& host =
      out.add("hiber_host_repository_bytes",
              "Host memory for model copies: used and the most it may take", MetricType::Gauge);
  Families::sample(host, {{"state", "used"}}, as_double(sched.getHostPoolUsedBytes()));
  Families::sample(host, {{"state", "capacity"}}, as_double(sched.getHostPoolBytes()));

  // The module cache.
  out.single("hiber_module_cache_images", "Code images loaded", MetricType::Gauge,
             as_double(counters.getCachedModules()));
  out.single("hiber_module_cache_image_bytes", "The size of those images", MetricType::Gauge,
             as_double(counters.getCachedModuleBytes()));
  out.single("hiber_module_cache_hits_total", "Module loads served by an image already loaded",
             MetricType::Counter, as_double(counters.getModuleCacheHits()));
  out.single("hiber_module_cache_misses_total", "Module loads that loaded an image",
             MetricType::Counter, as_double(counters.getModuleCacheMisses()));
  out.single("hiber_module_cache_unknown_hashes_total",
             "moduleLoadCached calls for an image hiberd did not hold", MetricType::Counter,
             as_double(counters.getModuleCacheUnknownHashes()));
  return out.take();
}

BuildInfo this_build() { return BuildInfo{build_version(), build_commit()}; }

}  // namespace hiber::server
