// "slack" eviction: least recently used, with a model kept longer the more of its SLO a host
// load would eat (see eviction.h).
#include <algorithm>
#include <cmath>

#include "scheduler/eviction.h"

namespace hiber::scheduler {
namespace {

class SlackEviction final : public EvictionPolicy {
 public:
  explicit SlackEviction(const EvictionOptions& options) : options_(options) {}
  std::string_view name() const override { return "slack"; }
  void score(std::span<EvictionCandidate> candidates, const EvictionContext& ctx) override {
    for (EvictionCandidate& c : candidates) {
      const FunctionSpec& spec = ctx.functions.spec(c.function);
      const double share = static_cast<double>(ctx.functions.swap_estimate(c.function) +
                                               ctx.functions.exec_estimate(c.function)) /
                           static_cast<double>(spec.slo);
      const double risk = std::pow(std::min(share, 1.0), options_.slack_power);
      c.key = static_cast<double>(c.last_used) + risk * static_cast<double>(options_.slack_weight);
    }
  }

 private:
  EvictionOptions options_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_slack_eviction(const EvictionOptions& options) {
  return std::make_unique<SlackEviction>(options);
}

}  // namespace hiber::scheduler
