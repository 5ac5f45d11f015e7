#include "server/metrics_exporter.h"

#include <exception>

#include <glog/logging.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include "wire/message.h"
#include "wire/schema/control.capnp.h"

namespace hiber::server {

class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  explicit Collector(StatusSource source) : source_(std::move(source)), build_(this_build()) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    auto families = collect();
    if (!families.ok()) {
      // A scrape without data shows as missing series (and the log says why), not as zeros.
      LOG_EVERY_N(WARNING, 100) << "/metrics: no status report: " << families.status();
      return {};
    }
    return std::move(families).value();
  }

 private:
  Result<std::vector<prometheus::MetricFamily>> collect() const {
    HIBER_ASSIGN_OR_RETURN(wire::Message status, source_());
    std::vector<prometheus::MetricFamily> families;
    HIBER_RETURN_IF_ERROR(wire::read_message<wire::proto::ControlReply>(
        status, "status reply", [&](wire::proto::ControlReply::Reader reply) -> Status {
          if (reply.isError()) {
            return error(ErrorCode::kUnknown, reply.getError().getMessage().cStr());
          }
          if (!reply.isStatus()) return Status(ErrorCode::kInvalidValue, "not a status reply");
          families = metric_families(reply.getStatus(), build_);
          return Status();
        }));
    return families;
  }

  const StatusSource source_;
  const BuildInfo build_;
};

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::create(const std::string& listen,
                                                                 StatusSource source) {
  std::unique_ptr<MetricsExporter> exporter(new MetricsExporter());
  exporter->collector_ = std::make_shared<Collector>(std::move(source));
  try {
    // One thread: scrapes are rare, and each waits for hiberd's own threads anyway.
    exporter->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return error(ErrorCode::kOperatingSystem, "cannot serve metrics on '", listen, "': ", e.what());
  }
  exporter->exposer_->RegisterCollectable(exporter->collector_, "/metrics");
  const std::vector<int> ports = exporter->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return error(ErrorCode::kOperatingSystem, "serving metrics on '", listen,
                 "': no listening port");
  }
  exporter->port_ = ports.front();
  return exporter;
}

MetricsExporter::~MetricsExporter() {
  // The server (and its threads) first: a scrape in progress still uses the collector.
  exposer_.reset();
}

}  // namespace hiber::server
