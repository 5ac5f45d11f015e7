// A conformance walk of the Open Inference Protocol v2 (KServe's predict_v2: health, server and
// model metadata, readiness, inference) and its binary tensor data and model repository
// extensions, over HTTP against a real hiber-router in front of a real hiberd. Every endpoint is
// called with a good request and with each kind of bad one the protocol defines, and each answer
// is checked against the protocol's own text: its status code, its JSON shape ({"error": ...}
// for every failure) and its values, computed here.
//
// The function is the test worker in its KServe mode (HIBER_TEST_KSERVE=1): it answers a request
// with its inputs as outputs, through the SDK, as a model would.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using nlohmann::json;

constexpr const char* kModel = "echo-model";

json registration() {
  return {{"command", {test_worker_path()}},
          {"slo_ms", 5000},
          {"env", {{"HIBER_TEST_KSERVE", "1"}}},
          {"inputs", json::parse(R"([{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 3]},
                                     {"name": "INPUT1", "datatype": "INT64", "shape": [1]}])")},
          {"outputs", json::parse(R"([{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 3]},
                                      {"name": "INPUT1", "datatype": "INT64", "shape": [1]}])")}};
}

json request(json x = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, json shape = {2, 3}) {
  return {{"id", "conformance-1"},
          {"inputs",
           {{{"name", "INPUT0"}, {"datatype", "FP32"}, {"shape", shape}, {"data", x}},
            {{"name", "INPUT1"}, {"datatype", "INT64"}, {"shape", {1}}, {"data", {7}}}}}};
}

const router::HttpHeaders kJson = {{"Content-Type", "application/json"}};

// The protocol's error answer: a JSON object with an "error" string.
void expect_error(const router::HttpResponse& r, int status, const std::string& says = "") {
  EXPECT_EQ(r.status, status) << r.body;
  const json body = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error") && body["error"].is_string()) << r.body;
  if (!says.empty()) {
    EXPECT_NE(body["error"].get<std::string>().find(says), std::string::npos) << r.body;
  }
}

class RouterConformanceTest : public ::testing::Test {
 protected:
  RouterConformanceTest()
      : state_(temp_dir("hiber-router-conformance")),
        router_(state_, {"--run_dir=" + hiberd_.run_dir()}) {}

  void SetUp() override { ASSERT_EQ(router_.load(kModel, registration()).status, 200); }

  router::HttpResponse call(const std::string& method, const std::string& path,
                            std::string body = {}, const router::HttpHeaders& headers = {}) {
    return router_.anonymous_request(method, path, std::move(body), headers);
  }

  Hiberd hiberd_;
  std::string state_;
  RouterProcess router_;
};

TEST_F(RouterConformanceTest, HealthAndServerMetadata) {
  router::HttpResponse r = call("GET", "/v2/health/live");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json({{"live", true}}));
  r = call("GET", "/v2/health/ready");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), json({{"ready", true}}));
  r = call("HEAD", "/v2/health/ready");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.empty());

  // $metadata_server_response: name, version, extensions.
  r = call("GET", "/v2");
  ASSERT_EQ(r.status, 200);
  const json server = json::parse(r.body);
  EXPECT_TRUE(server["name"].is_string());
  EXPECT_TRUE(server["version"].is_string());
  const std::vector<std::string> extensions = server["extensions"];
  for (const char* e : {"model_repository", "binary_tensor_data"}) {
    EXPECT_NE(std::find(extensions.begin(), extensions.end(), e), extensions.end()) << e;
  }
}

TEST_F(RouterConformanceTest, ModelMetadataAndReadiness) {
  // $metadata_model_response: name, versions, platform, inputs, outputs ($metadata_tensor:
  // name, datatype, shape).
  for (const std::string& path :
       {std::string("/v2/models/") + kModel, std::string("/v2/models/") + kModel + "/versions/1"}) {
    router::HttpResponse r = call("GET", path);
    ASSERT_EQ(r.status, 200) << path << ": " << r.body;
    const json model = json::parse(r.body);
    EXPECT_EQ(model["name"], kModel);
    EXPECT_TRUE(model["platform"].is_string());
    EXPECT_TRUE(model["versions"].is_array());
    EXPECT_EQ(model["inputs"], registration()["inputs"]);
    EXPECT_EQ(model["outputs"], registration()["outputs"]);
  }
  router::HttpResponse r = call("GET", std::string("/v2/models/") + kModel + "/ready");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["ready"], true);
  // An unknown model: 404 with an error, on every model endpoint.
  expect_error(call("GET", "/v2/models/nope"), 404, "nope");
  expect_error(call("GET", "/v2/models/nope/ready"), 404);
  expect_error(call("POST", "/v2/models/nope/infer", request().dump(), kJson), 404);
  // A method the endpoint does not take.
  r = call("DELETE", std::string("/v2/models/") + kModel);
  EXPECT_EQ(r.status, 405) << r.body;
}

TEST_F(RouterConformanceTest, InferenceInJson) {
  // $inference_response: model_name, id (the request's), outputs with name, shape, datatype
  // and data, the values computed here: the worker's outputs are its inputs.
  for (const std::string& path : {std::string("/v2/models/") + kModel + "/infer",
                                  std::string("/v2/models/") + kModel + "/versions/1/infer"}) {
    router::HttpResponse r = call("POST", path, request().dump(), kJson);
    ASSERT_EQ(r.status, 200) << path << ": " << r.body;
    const json answer = json::parse(r.body);
    EXPECT_TRUE(answer["model_name"].is_string());
    EXPECT_EQ(answer["id"], "conformance-1");
    ASSERT_EQ(answer["outputs"].size(), 2u) << answer;
    EXPECT_EQ(answer["outputs"][0]["name"], "INPUT0");
    EXPECT_EQ(answer["outputs"][0]["datatype"], "FP32");
    EXPECT_EQ(answer["outputs"][0]["shape"], json({2, 3}));
    EXPECT_EQ(answer["outputs"][0]["data"], json({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}));
    EXPECT_EQ(answer["outputs"][1]["data"], json({7}));
  }
  // Nested data (the protocol's row-major nesting) is the same tensor.
  router::HttpResponse r = call("POST", std::string("/v2/models/") + kModel + "/infer",
                                request(json::parse("[[1, 2, 3], [4, 5, 6]]")).dump(), kJson);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}));

  // Every way a request can be wrong: 400 with an error, never reaching the model.
  const auto with = [](const std::function<void(json&)>& change) {
    json r = request();
    change(r);
    return r.dump();
  };
  const std::vector<std::pair<std::string, std::string>> wrong = {
      {"not json", "not JSON"},
      {"[]", "not a JSON object"},
      {with([](json& r) { r.erase("inputs"); }), "inputs"},
      {with([](json& r) { r["inputs"] = json::array(); }), "inputs"},
      {with([](json& r) { r["id"] = 5; }), "\"id\" must be a string"},
      {with([](json& r) { r["inputs"][0].erase("name"); }), "name"},
      {with([](json& r) { r["inputs"][1]["name"] = "INPUT0"; }), "given twice"},
      {with([](json& r) { r["inputs"][0]["name"] = "INPUT9"; }), "is not an input"},
      {with([](json& r) { r["inputs"][0]["datatype"] = "FP33"; }), "unknown datatype"},
      {with([](json& r) { r["inputs"][0]["datatype"] = "FP64"; }), "takes FP32"},
      {with([](json& r) { r["inputs"][0]["shape"] = {6}; }), "has the shape [6]"},
      {with([](json& r) {
         r["inputs"][0]["shape"] = {-2, 3};
       }),
       "the dimension -2"},
      {with([](json& r) {
         r["inputs"][0]["shape"] = {3, 3};
       }),
       "6 values for the shape [3,3]"},
      {with([](json& r) { r["inputs"][0]["data"][0] = "one"; }), "is not a FP32 value"},
      {with([](json& r) { r["inputs"][1]["data"] = {1.5}; }), "is not a INT64 value"},
      {with([](json& r) { r["inputs"].erase(1); }), "\"INPUT1\" is missing"},
      {with([](json& r) {
         r["outputs"] = {{{"name", "OUTPUT9"}}};
       }),
       "is not an output"},
      {with([](json& r) { r["parameters"] = 3; }), "\"parameters\" must be an object"},
  };
  for (const auto& [body, says] : wrong) {
    expect_error(call("POST", std::string("/v2/models/") + kModel + "/infer", body, kJson), 400,
                 says);
  }
  expect_error(call("POST", std::string("/v2/models/") + kModel + "/infer", "x",
                    {{"Content-Type", "text/plain"}}),
               400, "declares its inputs");
  expect_error(call("GET", std::string("/v2/models/") + kModel + "/infer"), 405);
}

// Little-endian floats and int64s, written here.
std::string le_bytes(const void* data, size_t bytes) {
  return std::string(static_cast<const char*>(data), bytes);  // the test hosts are little-endian
}

TEST_F(RouterConformanceTest, BinaryTensorData) {
  const std::vector<float> x = {0.5f, -1.25f, 3e-5f};
  const int64_t y = -9;
  const json header = {{"id", "binary-1"},
                       {"inputs",
                        {{{"name", "INPUT0"},
                          {"datatype", "FP32"},
                          {"shape", {1, 3}},
                          {"parameters", {{"binary_data_size", 12}}}},
                         {{"name", "INPUT1"},
                          {"datatype", "INT64"},
                          {"shape", {1}},
                          {"parameters", {{"binary_data_size", 8}}}}}},
                       {"parameters", {{"binary_data_output", true}}}};
  const std::string json_part = header.dump();
  const std::string tensors = le_bytes(x.data(), 12) + le_bytes(&y, 8);
  router::HttpResponse r =
      call("POST", std::string("/v2/models/") + kModel + "/infer", json_part + tensors,
           {{"Content-Type", "application/octet-stream"},
            {"Inference-Header-Content-Length", std::to_string(json_part.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::optional<std::string> length = r.header("Inference-Header-Content-Length");
  ASSERT_TRUE(length.has_value());
  const size_t answer_bytes = std::stoul(*length);
  const json answer = json::parse(r.body.substr(0, answer_bytes));
  EXPECT_EQ(answer["id"], "binary-1");
  ASSERT_EQ(answer["outputs"].size(), 2u);
  EXPECT_EQ(answer["outputs"][0]["parameters"]["binary_data_size"], 12);
  EXPECT_EQ(answer["outputs"][1]["parameters"]["binary_data_size"], 8);
  EXPECT_EQ(r.body.substr(answer_bytes), tensors);

  // Binary in, JSON out (no binary output asked for): the same values as JSON.
  json json_out = header;
  json_out.erase("parameters");
  const std::string plain = json_out.dump();
  r = call("POST", std::string("/v2/models/") + kModel + "/infer", plain + tensors,
           {{"Inference-Header-Content-Length", std::to_string(plain.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.header("Inference-Header-Content-Length").has_value());
  const json values = json::parse(r.body);
  EXPECT_EQ(values["outputs"][0]["data"], json(std::vector<double>(x.begin(), x.end())));
  EXPECT_EQ(values["outputs"][1]["data"], json({-9}));

  // Wrong lengths and sizes: 400.
  const std::string url = std::string("/v2/models/") + kModel + "/infer";
  expect_error(
      call("POST", url, json_part + tensors, {{"Inference-Header-Content-Length", "twelve"}}), 400,
      "Inference-Header-Content-Length");
  expect_error(call("POST", url, json_part + tensors.substr(1),
                    {{"Inference-Header-Content-Length", std::to_string(json_part.size())}}),
               400, "binary_data_size");
  expect_error(call("POST", url, json_part + tensors + "x",
                    {{"Inference-Header-Content-Length", std::to_string(json_part.size())}}),
               400, "belong to no input");
}

TEST_F(RouterConformanceTest, ModelRepository) {
  // The index (POST, as the extension has it; GET too): every model, with its state.
  for (const char* method : {"POST", "GET"}) {
    router::HttpResponse r = router_.request(method, "/v2/repository/index");
    ASSERT_EQ(r.status, 200) << r.body;
    const json index = json::parse(r.body);
    ASSERT_EQ(index.size(), 1u) << index;
    EXPECT_EQ(index[0]["name"], kModel);
    EXPECT_TRUE(index[0]["state"].is_string());
  }
  // Without the operator's credential, no repository call is allowed.
  EXPECT_EQ(call("POST", "/v2/repository/index").status, 401);
  EXPECT_EQ(call("POST", std::string("/v2/repository/models/") + kModel + "/unload").status, 401);

  // Unload: still in the repository, unavailable; not ready; inference refused.
  ASSERT_EQ(
      router_.request("POST", std::string("/v2/repository/models/") + kModel + "/unload").status,
      200);
  ASSERT_TRUE(eventually([&] {
    const json index = json::parse(router_.request("POST", "/v2/repository/index").body);
    return index.size() == 1 && index[0]["state"] == "UNAVAILABLE";
  }));
  router::HttpResponse ready = call("GET", std::string("/v2/models/") + kModel + "/ready");
  EXPECT_EQ(ready.status, 400) << ready.body;
  EXPECT_EQ(json::parse(ready.body)["ready"], false);
  expect_error(
      call("POST", std::string("/v2/models/") + kModel + "/infer", request().dump(), kJson), 400,
      "is unloaded");
  // Load without a body: the repository's registration, ready again.
  ASSERT_EQ(
      router_.request("POST", std::string("/v2/repository/models/") + kModel + "/load").status,
      200);
  router::HttpResponse r =
      call("POST", std::string("/v2/models/") + kModel + "/infer", request().dump(), kJson);
  EXPECT_EQ(r.status, 200) << r.body;
  // Errors of the extension: a model the repository does not hold; a bad registration.
  expect_error(router_.request("POST", "/v2/repository/models/nope/load"), 404);
  expect_error(router_.request("POST", "/v2/repository/models/nope/unload"), 404);
  expect_error(router_.request("POST", "/v2/repository/models/bad/load", "{\"slo_ms\": -1}"), 400);
}

}  // namespace
}  // namespace hiber::testing
