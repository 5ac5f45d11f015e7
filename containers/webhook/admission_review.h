// An AdmissionReview (admission.k8s.io/v1) in, the answer out: the pod's patch (pod_patch.h)
// wrapped as the API server expects it. Pure; the HTTPS server (tls_server.h) carries it.
#pragma once

#include <string>
#include <string_view>

#include "containers/webhook/pod_patch.h"

namespace hiber::inject {

struct ReviewAnswer {
  unsigned http_status = 200;  // 400 when the body is not an AdmissionReview v1 with a uid
  std::string body;            // JSON: the AdmissionReview response, or {"error": "..."}
  std::string log;             // one line on what was decided, for hiber-inject's log
};

// Pods that opt in (label hiber.io/inject=true) on CREATE get allowed with a JSONPatch; other
// pods and operations are allowed unchanged. A review whose request is not about a Pod, or whose
// pod cannot be injected, is denied (allowed=false) with the reason in status.message.
ReviewAnswer review(std::string_view body, const InjectConfig& config);

// Standard base64 (RFC 4648, with padding), as the response's patch field is.
std::string base64(std::string_view bytes);

}  // namespace hiber::inject
