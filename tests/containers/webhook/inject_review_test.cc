// hiber-inject's mutation (containers/webhook): AdmissionReview documents as the API server sends
// them (fixtures/), each answer's patch decoded with OpenSSL's base64 and applied with
// nlohmann::json::patch (an independent RFC 6902 implementation), the resulting pod checked field
// by field.
#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "containers/webhook/admission_review.h"
#include "containers/webhook/pod_patch.h"

namespace hiber::inject {
namespace {

using nlohmann::json;

const std::string kPreload =
    "/opt/hiber/shim/libhibercuda.so /opt/hiber/shim/libhibercublas.so "
    "/opt/hiber/shim/libhibercublasLt.so /opt/hiber/shim/libhibercudnn.so "
    "/opt/hiber/shim/libhibernvml.so";

std::string fixture_text(const std::string& name) {
  std::ifstream in(std::string(HIBER_SOURCE_DIR) + "/tests/containers/webhook/fixtures/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

json fixture(const std::string& name) { return json::parse(fixture_text(name)); }

std::string decode_base64(const std::string& text) {
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  EXPECT_GE(n, 0) << "not base64: " << text;
  // EVP_DecodeBlock counts the padding's zero bytes.
  size_t padding = 0;
  for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) ++padding;
  out.resize(static_cast<size_t>(std::max(n, 0)) - padding);
  return out;
}

struct Reviewed {
  ReviewAnswer answer;
  json response;  // the AdmissionReview's response
  json patch;     // decoded; null when none
};

Reviewed run_review(const std::string& body, const InjectConfig& config = {}) {
  Reviewed r;
  r.answer = review(body, config);
  EXPECT_EQ(r.answer.http_status, 200u) << r.answer.body;
  const json doc = json::parse(r.answer.body);
  EXPECT_EQ(doc["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(doc["kind"], "AdmissionReview");
  r.response = doc["response"];
  if (r.response.contains("patch")) {
    EXPECT_EQ(r.response["patchType"], "JSONPatch");
    r.patch = json::parse(decode_base64(r.response["patch"]));
  }
  return r;
}

// The review's pod with the answer's patch applied.
json patched_pod(const json& review_doc, const Reviewed& r) {
  const json& pod = review_doc["request"]["object"];
  return r.patch.is_null() ? pod : pod.patch(r.patch);
}

json review_of(json review_doc, const json& pod) {
  review_doc["request"]["object"] = pod;
  return review_doc;
}

std::map<std::string, json> by_name(const json& list) {
  std::map<std::string, json> out;
  if (!list.is_array()) return out;
  for (const json& item : list) out[item["name"]] = item;
  return out;
}

// Every check of an injected container: the four mounts and the environment.
void expect_injected_container(const json& container, const std::string& function,
                               const std::string& preload = kPreload) {
  SCOPED_TRACE("container " + container["name"].get<std::string>());
  const auto mounts = by_name(container["volumeMounts"]);
  const std::map<std::string, std::string> wanted_mounts = {
      {"hiber-shim", "/opt/hiber/shim"},
      {"hiber-run", "/run/hiber"},
      {"hiber-function-token", "/var/run/secrets/hiber.io/function-token"},
      {"hiber-worker-token", "/var/run/secrets/hiber.io/worker-token"}};
  for (const auto& [name, path] : wanted_mounts) {
    ASSERT_TRUE(mounts.count(name)) << name;
    EXPECT_EQ(mounts.at(name)["mountPath"], path);
    EXPECT_EQ(mounts.at(name)["readOnly"], true);
  }
  std::map<std::string, json> env;
  std::multiset<std::string> names;
  for (const json& e : container["env"]) {
    env[e["name"]] = e;
    names.insert(e["name"].get<std::string>());
  }
  const std::map<std::string, std::string> wanted_env = {
      {"LD_PRELOAD", preload},
      {"HIBER_RUN_DIR", "/run/hiber"},
      {"HIBER_AUTH_TOKEN_FILE", "/var/run/secrets/hiber.io/function-token/auth-token"},
      {"HIBER_FUNCTION_ID", function},
      {"HIBER_WORKER_SOCKET", "tcp:hiber-router.hiber-system.svc:7071"},
      {"HIBER_WORKER_TOKEN_FILE", "/var/run/secrets/hiber.io/worker-token/worker-token"},
      {"NVIDIA_VISIBLE_DEVICES", "void"}};
  for (const auto& [name, value] : wanted_env) {
    ASSERT_TRUE(env.count(name)) << name;
    EXPECT_EQ(env[name], (json{{"name", name}, {"value", value}})) << name;
    EXPECT_EQ(names.count(name), 1u) << name << " appears more than once";
  }
}

void expect_no_gpu(const json& pod) {
  for (const char* list : {"containers", "initContainers"}) {
    if (!pod["spec"].contains(list)) continue;
    for (const json& c : pod["spec"][list]) {
      for (const char* field : {"limits", "requests"}) {
        if (c.contains("resources") && c["resources"].contains(field)) {
          EXPECT_FALSE(c["resources"][field].contains("nvidia.com/gpu"))
              << c["name"] << " " << field;
        }
      }
    }
  }
}

void expect_hiber_volumes(const json& pod) {
  const auto volumes = by_name(pod["spec"]["volumes"]);
  ASSERT_TRUE(volumes.count("hiber-shim"));
  EXPECT_EQ(volumes.at("hiber-shim")["hostPath"],
            (json{{"path", "/var/lib/hiber/shim"}, {"type", "Directory"}}));
  ASSERT_TRUE(volumes.count("hiber-run"));
  EXPECT_EQ(volumes.at("hiber-run")["hostPath"],
            (json{{"path", "/run/hiber"}, {"type", "Directory"}}));
  ASSERT_TRUE(volumes.count("hiber-function-token"));
  EXPECT_EQ(volumes.at("hiber-function-token")["secret"]["secretName"], "hiber-function-token");
  EXPECT_EQ(volumes.at("hiber-function-token")["secret"]["items"],
            json::parse(R"([{"key": "auth-token", "path": "auth-token"}])"));
  ASSERT_TRUE(volumes.count("hiber-worker-token"));
  EXPECT_EQ(volumes.at("hiber-worker-token")["secret"]["secretName"], "hiber-worker-token");
  EXPECT_EQ(volumes.at("hiber-worker-token")["secret"]["items"],
            json::parse(R"([{"key": "worker-token", "path": "worker-token"}])"));
}

// Re-invoking the webhook on the pod it produced changes nothing.
void expect_idempotent(const json& review_doc, const json& pod, const InjectConfig& config = {}) {
  const Reviewed again = run_review(review_of(review_doc, pod).dump(), config);
  EXPECT_EQ(again.response["allowed"], true);
  EXPECT_FALSE(again.response.contains("patch")) << again.patch.dump(2);
}

TEST(InjectReview, PodWithoutLabelIsAllowedUnchanged) {
  for (const char* name : {"review_pod_without_label.json", "review_pod_inject_false.json"}) {
    SCOPED_TRACE(name);
    const json doc = fixture(name);
    const Reviewed r = run_review(doc.dump());
    EXPECT_EQ(r.response["uid"], doc["request"]["uid"]);
    EXPECT_EQ(r.response["allowed"], true);
    EXPECT_FALSE(r.response.contains("patch"));
    EXPECT_FALSE(r.response.contains("patchType"));
  }
}

TEST(InjectReview, GpuPodGetsTheShimAndLosesItsGpuRequests) {
  const json doc = fixture("review_pod_with_gpu.json");
  const Reviewed r = run_review(fixture_text("review_pod_with_gpu.json"));
  EXPECT_EQ(r.response["uid"], "7f3e1c2a-0b4d-4e5f-8a6b-9c0d1e2f3a03");
  EXPECT_EQ(r.response["allowed"], true);
  ASSERT_TRUE(r.patch.is_array());
  // Both GPU requests of the function and the init container: four JSON Pointers with "~1".
  size_t removals = 0;
  for (const json& op : r.patch) {
    if (op["op"] == "remove") {
      ++removals;
      EXPECT_NE(op["path"].get<std::string>().find("/nvidia.com~1gpu"), std::string::npos);
    }
  }
  EXPECT_EQ(removals, 4u);
  ASSERT_TRUE(r.response.contains("warnings"));
  EXPECT_EQ(r.response["warnings"].size(), 2u);
  EXPECT_EQ(r.answer.log.find("functions/resnet-50-7d9f8c6b5d-*: injected function resnet-50 ("),
            0u)
      << r.answer.log;

  const json before = doc["request"]["object"];
  const json pod = patched_pod(doc, r);
  expect_hiber_volumes(pod);
  expect_no_gpu(pod);
  // The user's own volume and everything else of the spec stays.
  EXPECT_EQ(by_name(pod["spec"]["volumes"])["kube-api-access-7xk2p"], before["spec"]["volumes"][0]);
  EXPECT_EQ(pod["spec"]["volumes"].size(), 5u);
  EXPECT_EQ(pod["metadata"], before["metadata"]);
  EXPECT_EQ(pod["spec"]["tolerations"], before["spec"]["tolerations"]);

  ASSERT_EQ(pod["spec"]["containers"].size(), 2u);
  for (const json& c : pod["spec"]["containers"]) expect_injected_container(c, "resnet-50");
  const json& model = pod["spec"]["containers"][0];
  // The user's env and mounts come first and unchanged; CPU and memory stay.
  EXPECT_EQ(model["env"][0], before["spec"]["containers"][0]["env"][0]);
  EXPECT_EQ(model["env"][1], before["spec"]["containers"][0]["env"][1]);
  EXPECT_EQ(model["env"].size(), 9u);
  EXPECT_EQ(model["volumeMounts"][0], before["spec"]["containers"][0]["volumeMounts"][0]);
  EXPECT_EQ(model["resources"]["limits"], (json{{"cpu", "2"}, {"memory", "4Gi"}}));
  EXPECT_EQ(model["resources"]["requests"], (json{{"cpu", "2"}, {"memory", "4Gi"}}));
  // The sidecar had no env and no mounts: it gets both lists whole.
  EXPECT_EQ(pod["spec"]["containers"][1]["env"].size(), 7u);
  EXPECT_EQ(pod["spec"]["containers"][1]["volumeMounts"].size(), 4u);

  // The init container loses its GPU but gets no shim.
  const json& init = pod["spec"]["initContainers"][0];
  EXPECT_EQ(init["env"], before["spec"]["initContainers"][0]["env"]);
  EXPECT_EQ(init["volumeMounts"], before["spec"]["initContainers"][0]["volumeMounts"]);
  EXPECT_EQ(init["resources"]["limits"], (json{{"cpu", "2"}, {"memory", "4Gi"}}));

  expect_idempotent(doc, pod);
}

TEST(InjectReview, ExistingLdPreloadIsKeptAfterTheShim) {
  const json doc = fixture("review_pod_with_ld_preload.json");
  const Reviewed r = run_review(doc.dump());
  EXPECT_EQ(r.response["allowed"], true);
  const json pod = patched_pod(doc, r);
  // The pod had no volumes at all.
  EXPECT_EQ(pod["spec"]["volumes"].size(), 4u);
  expect_hiber_volumes(pod);
  const json& c = pod["spec"]["containers"][0];
  expect_injected_container(c, "bert.encoder_v2",
                            kPreload + " /usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
  // Replaced in place, not appended: LD_PRELOAD and HIBER_FUNCTION_ID keep their positions.
  EXPECT_EQ(c["env"][0]["name"], "LD_PRELOAD");
  EXPECT_EQ(c["env"][1], (json{{"name", "HIBER_FUNCTION_ID"}, {"value", "bert.encoder_v2"}}));
  EXPECT_EQ(c["env"].size(), 7u);
  EXPECT_EQ(c["volumeMounts"].size(), 4u);
  expect_idempotent(doc, pod);
}

TEST(InjectReview, AlreadyInjectedPodGetsNoPatch) {
  const json doc = fixture("review_pod_already_injected.json");
  const Reviewed r = run_review(doc.dump());
  EXPECT_EQ(r.response["allowed"], true);
  EXPECT_FALSE(r.response.contains("patch")) << r.patch.dump(2);
  expect_injected_container(doc["request"]["object"]["spec"]["containers"][0], "resnet-50");
}

TEST(InjectReview, PodsThatCannotBeInjectedAreDenied) {
  const std::map<std::string, std::string> cases = {
      {"review_pod_without_function.json", "no hiber.io/function label"},
      {"review_pod_empty_function.json", "is not a function name"},
      {"review_pod_volume_clash.json", "has its own volume \"hiber-shim\""},
      {"review_deployment.json", "mutates Pods only"},
      {"review_without_object.json", "carries no Pod object"},
  };
  for (const auto& [name, message] : cases) {
    SCOPED_TRACE(name);
    const json doc = fixture(name);
    const Reviewed r = run_review(doc.dump());
    EXPECT_EQ(r.response["uid"], doc["request"]["uid"]);
    EXPECT_EQ(r.response["allowed"], false);
    EXPECT_FALSE(r.response.contains("patch"));
    EXPECT_EQ(r.response["status"]["code"], 400);
    EXPECT_NE(r.response["status"]["message"].get<std::string>().find(message), std::string::npos)
        << r.response["status"]["message"];
  }
}

TEST(InjectReview, WhatIsNotAReviewGets400) {
  const std::map<std::string, std::string> cases = {
      {fixture_text("review_not_json.txt"), "not JSON"},
      {fixture_text("review_v1beta1.json"), "admission.k8s.io/v1 only"},
      {fixture_text("review_without_request.json"), "has no request"},
      {fixture_text("review_without_uid.json"), "has no uid"},
      {"[1, 2, 3]", "not a JSON object"},
      {R"({"apiVersion": "v1", "kind": "Pod"})", "not an AdmissionReview"},
      {"", "not JSON"},
  };
  for (const auto& [body, message] : cases) {
    SCOPED_TRACE(body.substr(0, 60));
    const ReviewAnswer answer = review(body, InjectConfig());
    EXPECT_EQ(answer.http_status, 400u);
    const json error_doc = json::parse(answer.body);
    EXPECT_NE(error_doc["error"].get<std::string>().find(message), std::string::npos)
        << error_doc["error"];
  }
}

TEST(InjectReview, OtherOperationsAreAllowedUnchanged) {
  json doc = fixture("review_pod_with_gpu.json");
  doc["request"]["operation"] = "UPDATE";
  Reviewed r = run_review(doc.dump());
  EXPECT_EQ(r.response["allowed"], true);
  EXPECT_FALSE(r.response.contains("patch"));
  doc["request"]["operation"] = "CREATE";
  doc["request"]["subResource"] = "ephemeralcontainers";
  r = run_review(doc.dump());
  EXPECT_FALSE(r.response.contains("patch"));
}

TEST(InjectReview, ClashingMountsAndEnvironmentAreDenied) {
  const json doc = fixture("review_pod_with_gpu.json");
  auto denial = [&](const std::string& pointer, const json& value) {
    json changed = doc;
    changed["request"]["object"][json::json_pointer(pointer)] = value;
    const Reviewed r = run_review(changed.dump());
    EXPECT_EQ(r.response["allowed"], false) << pointer;
    return r.response["status"]["message"].get<std::string>();
  };
  // Something of the user's at the shim's mount path.
  EXPECT_NE(denial("/spec/containers/0/volumeMounts/0/mountPath", "/opt/hiber/shim")
                .find("where hiber-inject mounts \"hiber-shim\""),
            std::string::npos);
  EXPECT_NE(denial("/spec/containers/0/env/0",
                   json::parse(R"({"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef":
                                  {"name": "c", "key": "k"}}})"))
                .find("LD_PRELOAD from valueFrom"),
            std::string::npos);
  EXPECT_NE(denial("/spec/containers/0/env", "PATH=/bin").find("env is not a list"),
            std::string::npos);
  EXPECT_NE(denial("/spec/containers", json::array()).find("spec.containers"), std::string::npos);
  EXPECT_NE(denial("/metadata/labels/hiber.io~1function", "a/b").find("is not a function name"),
            std::string::npos);
}

TEST(InjectReview, OtherSettingsShowInThePatch) {
  InjectConfig config;
  config.shim_host_path = "/opt/hiber-shim";
  config.shim_mount_path = "/hiber";
  config.shim_libraries = {"libhibercuda.so"};
  config.run_dir_host_path = "/var/run/hiber-node";
  config.run_dir_mount_path = "/hiber-run";
  config.token_secret = "node-token";
  config.token_secret_key = "token";
  config.router_worker_address = "tcp:10.0.0.7:7071";
  ASSERT_TRUE(check_config(config).ok());
  const json doc = fixture("review_pod_with_ld_preload.json");
  const Reviewed r = run_review(doc.dump(), config);
  const json pod = patched_pod(doc, r);
  const auto volumes = by_name(pod["spec"]["volumes"]);
  EXPECT_EQ(volumes.at("hiber-shim")["hostPath"]["path"], "/opt/hiber-shim");
  EXPECT_EQ(volumes.at("hiber-run")["hostPath"]["path"], "/var/run/hiber-node");
  EXPECT_EQ(volumes.at("hiber-function-token")["secret"]["secretName"], "node-token");
  std::map<std::string, std::string> env;
  for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e["value"];
  EXPECT_EQ(env["LD_PRELOAD"], "/hiber/libhibercuda.so /usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
  EXPECT_EQ(env["HIBER_RUN_DIR"], "/hiber-run");
  EXPECT_EQ(env["HIBER_AUTH_TOKEN_FILE"], "/var/run/secrets/hiber.io/function-token/token");
  EXPECT_EQ(env["HIBER_WORKER_SOCKET"], "tcp:10.0.0.7:7071");
  expect_idempotent(doc, pod, config);
}

TEST(InjectReview, BadSettingsAreRefused) {
  auto refused = [](auto change) {
    InjectConfig config;
    change(config);
    const Status status = check_config(config);
    EXPECT_FALSE(status.ok());
    return status.message();
  };
  EXPECT_NE(
      refused([](InjectConfig& c) { c.shim_host_path = "relative/path"; }).find("--shim_host_path"),
      std::string::npos);
  EXPECT_NE(refused([](InjectConfig& c) { c.run_dir_mount_path = c.shim_mount_path; }).find("both"),
            std::string::npos);
  EXPECT_NE(refused([](InjectConfig& c) { c.token_secret = "Not_A_Name"; }).find("--token_secret"),
            std::string::npos);
  EXPECT_NE(refused([](InjectConfig& c) {
              c.worker_token_secret_key = "a/b";
            }).find("--worker_token_secret_key"),
            std::string::npos);
  EXPECT_NE(refused([](InjectConfig& c) { c.shim_libraries = {"lib a.so"}; }).find("not a file"),
            std::string::npos);
  EXPECT_TRUE(check_config(InjectConfig()).ok());
}

// Every value of a real review that hiber-inject reads, and every object or list above one,
// replaced in turn by values of other JSON types: the answer is always a 200 review answer or a
// 400, never an exception. (Parts it never reads, such as userInfo or managedFields, are left
// out to keep the test fast under the sanitizers.)
TEST(InjectReview, AnyShapeOfReviewGetsAnAnswer) {
  const json doc = fixture("review_pod_with_gpu.json");
  const std::vector<std::string> unread = {"/request/userInfo",
                                           "/request/options",
                                           "/request/resource",
                                           "/request/requestKind",
                                           "/request/requestResource",
                                           "/request/object/metadata/managedFields",
                                           "/request/object/metadata/ownerReferences",
                                           "/request/object/spec/tolerations",
                                           "/request/object/spec/volumes/0/projected"};
  const std::set<std::string> unread_leaves = {
      "image", "imagePullPolicy", "terminationMessagePath", "terminationMessagePolicy",
      "cpu",   "memory"};
  std::set<std::string> pointers;
  const json flat = doc.flatten();
  for (const auto& item : flat.items()) {
    const std::string& leaf = item.key();
    if (std::any_of(unread.begin(), unread.end(),
                    [&](const std::string& prefix) { return leaf.starts_with(prefix); }) ||
        unread_leaves.count(leaf.substr(leaf.rfind('/') + 1))) {
      continue;
    }
    for (json::json_pointer p(leaf); !p.empty(); p = p.parent_pointer()) {
      pointers.insert(p.to_string());
    }
  }
  const std::vector<json> replacements = {nullptr, "text", json::array({1}),
                                          json::object({{"k", 1}})};
  size_t answers = 0;
  for (const std::string& pointer : pointers) {
    for (const json& replacement : replacements) {
      json changed = doc;
      changed[json::json_pointer(pointer)] = replacement;
      ReviewAnswer answer;
      ASSERT_NO_THROW(answer = review(changed.dump(), InjectConfig())) << pointer;
      ASSERT_TRUE(answer.http_status == 200 || answer.http_status == 400) << pointer;
      const json body = json::parse(answer.body);
      if (answer.http_status == 200) {
        EXPECT_EQ(body["response"]["uid"], changed["request"]["uid"]) << pointer;
        // An allowed answer's patch applies to the pod it was computed for.
        if (body["response"].contains("patch")) {
          const json patch = json::parse(decode_base64(body["response"]["patch"]));
          EXPECT_NO_THROW(changed["request"]["object"].patch(patch)) << pointer;
        }
      }
      ++answers;
    }
  }
  EXPECT_GT(answers, 200u);
}

TEST(InjectReview, Base64AndPointers) {
  // RFC 4648, section 10.
  const std::map<std::string, std::string> vectors = {{"", ""},
                                                      {"f", "Zg=="},
                                                      {"fo", "Zm8="},
                                                      {"foo", "Zm9v"},
                                                      {"foob", "Zm9vYg=="},
                                                      {"fooba", "Zm9vYmE="},
                                                      {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) EXPECT_EQ(base64(plain), encoded) << plain;
  const std::string bytes("\x00\xff\x10\x80", 4);
  EXPECT_EQ(decode_base64(base64(bytes)), bytes);
  EXPECT_EQ(escape_pointer("nvidia.com/gpu"), "nvidia.com~1gpu");
  EXPECT_EQ(escape_pointer("a~b/c"), "a~0b~1c");
  // The escape is what nlohmann's JSON Pointer reads back.
  const json object = {{"a~b/c", 1}};
  EXPECT_EQ(object[json::json_pointer("/" + escape_pointer("a~b/c"))], 1);
}

}  // namespace
}  // namespace hiber::inject
