#include "containers/webhook/admission_review.h"

#include <algorithm>
#include <cstdint>

namespace hiber::inject {
namespace {

using nlohmann::json;

constexpr char kApiVersion[] = "admission.k8s.io/v1";

ReviewAnswer not_a_review(const std::string& why) {
  return ReviewAnswer{400, json{{"error", why}}.dump(), "rejected a request: " + why};
}

// A field's string value; empty when absent or not a string (value() would throw).
std::string string_field(const json& object, const char* key) {
  const json value = object.is_object() ? object.value(key, json()) : json();
  return value.is_string() ? value.get<std::string>() : std::string();
}

json answer(const std::string& uid, json response) {
  response["uid"] = uid;
  return json{{"apiVersion", kApiVersion}, {"kind", "AdmissionReview"}, {"response", response}};
}

// A value for a message or the log: JSON, ASCII only (so cutting it splits no character), short.
std::string printable(const json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  if (text.size() > 80) text = text.substr(0, 80) + "...";
  return text;
}

// "namespace/name" of the pod, or its generateName prefix: names are given after admission for
// pods that a ReplicaSet or Job creates.
std::string pod_name(const json& request, const json& object) {
  std::string name = string_field(request, "name");
  if (name.empty() && object.is_object()) {
    const json metadata = object.value("metadata", json());
    name = string_field(metadata, "name");
    if (name.empty()) name = string_field(metadata, "generateName") + "*";
  }
  // Without printable()'s quotes: names the API server sends are plain already.
  auto bare = [](const std::string& text) {
    const std::string quoted = printable(text);
    return quoted.substr(1, quoted.size() - (quoted.back() == '"' ? 2 : 1));
  };
  return bare(string_field(request, "namespace")) + "/" + bare(name);
}

}  // namespace

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t j = 0; j < 3; ++j) {
      group = (group << 8) | (j < n ? static_cast<unsigned char>(bytes[i + j]) : 0u);
    }
    for (size_t j = 0; j < 4; ++j) {
      out += j <= n ? kAlphabet[(group >> (18 - 6 * j)) & 63] : '=';
    }
  }
  return out;
}

ReviewAnswer review(std::string_view body, const InjectConfig& config) {
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return not_a_review("the body is not JSON");
  if (!doc.is_object()) return not_a_review("the body is not a JSON object");
  if (doc.value("kind", json()) != "AdmissionReview") {
    return not_a_review("the body is not an AdmissionReview (its kind is " +
                        printable(doc.value("kind", json())) + ")");
  }
  if (doc.value("apiVersion", json()) != kApiVersion) {
    return not_a_review("hiber-inject answers AdmissionReview " + std::string(kApiVersion) +
                        " only, not " + printable(doc.value("apiVersion", json())) +
                        ": list v1 in the webhook's admissionReviewVersions");
  }
  auto request_it = doc.find("request");
  if (request_it == doc.end() || !request_it->is_object()) {
    return not_a_review("the AdmissionReview has no request");
  }
  const json& request = *request_it;
  const json uid_value = request.value("uid", json());
  if (!uid_value.is_string() || uid_value.get<std::string>().empty()) {
    return not_a_review("the AdmissionReview's request has no uid");
  }
  const std::string uid = uid_value.get<std::string>();
  const json object = request.value("object", json());
  const std::string who = pod_name(request, object);

  auto allow = [&](const std::string& why) {
    return ReviewAnswer{200, answer(uid, {{"allowed", true}}).dump(), who + ": allowed, " + why};
  };
  auto deny = [&](const std::string& why) {
    json response = {{"allowed", false}, {"status", {{"code", 400}, {"message", why}}}};
    return ReviewAnswer{200, answer(uid, response).dump(), who + ": denied: " + why};
  };

  const json kind = request.value("kind", json());
  if (!kind.is_object() || kind.value("group", json()) != "" ||
      kind.value("kind", json()) != "Pod") {
    return deny("hiber-inject mutates Pods only; this request is for " + printable(kind) +
                ": the webhook's rules should select pods alone");
  }
  const json operation = request.value("operation", json());
  if (operation != "CREATE") return allow("unchanged: the operation is " + printable(operation));
  if (!string_field(request, "subResource").empty()) {
    return allow("unchanged: a subresource");
  }
  if (!object.is_object()) return deny("the request carries no Pod object");
  if (object.contains("kind") && object["kind"] != "Pod") {
    return deny("the request's object is a " + printable(object["kind"]) + ", not a Pod");
  }

  Result<PodPatch> patched = patch_pod(object, config);
  if (!patched.ok()) return deny("hiber-inject: " + patched.status().message());
  if (!patched->opted_in) return allow("unchanged: no hiber.io/inject=true label");
  json response = {{"allowed", true}};
  if (!patched->patch.empty()) {
    response["patchType"] = "JSONPatch";
    response["patch"] = base64(patched->patch.dump());
  }
  if (!patched->warnings.empty()) response["warnings"] = patched->warnings;
  return ReviewAnswer{200, answer(uid, response).dump(),
                      who + ": injected function " + patched->function_id + " (" +
                          std::to_string(patched->patch.size()) + " patch operations)"};
}

}  // namespace hiber::inject
