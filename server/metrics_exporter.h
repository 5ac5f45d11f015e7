// hiberd's /metrics endpoint: prometheus-cpp's pull Exposer (civetweb) serves, on each scrape,
// the metric families of a fresh status report (server/metrics.h).
//
// Thread safety: scrapes run on the Exposer's threads and call the status source there; the
// exporter must be destroyed before whatever the source uses.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/metrics.h"
#include "wire/message.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace hiber::server {

class MetricsExporter {
 public:
  // A status reply (a ControlReply holding a NodeStatus that lists every function), or why
  // none came.
  using StatusSource = std::function<Result<wire::Message>()>;

  // Listens on `listen` ("host:port"; port 0 picks a free one) and serves GET /metrics.
  static Result<std::unique_ptr<MetricsExporter>> create(const std::string& listen,
                                                         StatusSource source);
  ~MetricsExporter();

  int port() const { return port_; }

 private:
  class Collector;

  MetricsExporter() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace hiber::server
