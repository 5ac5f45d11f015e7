// The Open Inference Protocol v2 (KServe's predict_v2) against a real hiber-router in front of
// a real hiberd, over HTTP: server metadata and its extensions, HEAD on the health endpoints,
// model metadata with declared tensors, a client's mistakes answered 400 and counted as
// rejected (never reaching the worker, never the function's failure), the answer's id
// being the client's, the binary tensor data extension, and a handler's own 4xx.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using nlohmann::json;

// The test worker answers "application/json; x-test=kserve" with its inputs as outputs, through
// the SDK's outputs_response and the request's id, as functions do. No shim: hiberd is not
// involved, so every answer is the worker's alone.
json kserve_registration() {
  return {{"command", {test_worker_path()}},
          {"slo_ms", 5000},
          {"idle_timeout_s", 600},
          {"inputs", json::parse(R"([{"name": "x", "datatype": "FP32", "shape": [-1, 2]},
                                     {"name": "tag", "datatype": "BYTES", "shape": [1]}])")},
          {"outputs", json::parse(R"([{"name": "x", "datatype": "FP32", "shape": [-1, 2]}])")}};
}
constexpr const char* kKserve = "application/json; x-test=kserve";

// The test worker without declarations: it takes raw bodies of any content type.
json raw_registration() { return {{"command", {test_worker_path()}}, {"slo_ms", 5000}}; }

json good_request() {
  return {{"id", "client-request-42"},
          {"inputs",
           {{{"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 2}}, {"data", {1, 2, 3, 4}}},
            {{"name", "tag"}, {"datatype", "BYTES"}, {"shape", {1}}, {"data", {"t"}}}}}};
}

// A raw HTTP exchange: everything the server sent until it closed.
std::string raw_exchange(uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) out.append(buffer, n);
  ::close(fd);
  return out;
}

class RouterProtocolTest : public ::testing::Test {
 protected:
  RouterProtocolTest()
      : state_(temp_dir("hiber-router-protocol")),
        router_(state_, {"--run_dir=" + hiberd_.run_dir()}) {}

  Hiberd hiberd_;
  std::string state_;
  RouterProcess router_;
};

TEST_F(RouterProtocolTest, ServerMetadataNamesTheExtensions) {
  router::HttpResponse r = router_.anonymous_request("GET", "/v2");
  ASSERT_EQ(r.status, 200);
  const json metadata = json::parse(r.body);
  EXPECT_EQ(metadata["name"], "hiber-router");
  const json& extensions = metadata["extensions"];
  EXPECT_NE(std::find(extensions.begin(), extensions.end(), "model_repository"), extensions.end())
      << extensions;
  EXPECT_EQ(std::find(extensions.begin(), extensions.end(), "repository"), extensions.end());
}

TEST_F(RouterProtocolTest, HeadOnTheHealthEndpointsAnswersLikeGetWithoutABody) {
  for (const char* path : {"/v2/health/live", "/v2/health/ready"}) {
    const router::HttpResponse get = router_.anonymous_request("GET", path);
    ASSERT_EQ(get.status, 200) << path;
    const std::string head = raw_exchange(
        router_.target().port,
        std::string("HEAD ") + path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
    EXPECT_NE(head.find("Content-Length: " + std::to_string(get.body.size()) + "\r\n"),
              std::string::npos)
        << head;
    const size_t end = head.find("\r\n\r\n");
    ASSERT_NE(end, std::string::npos) << head;
    EXPECT_EQ(head.size(), end + 4) << "a body after HEAD's header: " << head;
  }
  // HEAD is for the health endpoints: elsewhere it is a method not allowed.
  const std::string other = raw_exchange(
      router_.target().port, "HEAD /v2/status HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(other.rfind("HTTP/1.1 405", 0), 0u) << other;
}

TEST_F(RouterProtocolTest, ModelMetadataDescribesTheDeclaredTensors) {
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  router::HttpResponse r = router_.anonymous_request("GET", "/v2/models/k");
  ASSERT_EQ(r.status, 200);
  const json metadata = json::parse(r.body);
  EXPECT_EQ(metadata["inputs"], kserve_registration()["inputs"]);
  EXPECT_EQ(metadata["outputs"], kserve_registration()["outputs"]);
  EXPECT_FALSE(metadata["parameters"].contains("inputs"));
  // A declaration that makes no sense is refused at load time.
  json bad = kserve_registration();
  bad["inputs"][0]["datatype"] = "FP33";
  r = router_.load("bad", bad);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("datatype"), std::string::npos) << r.body;
}

TEST_F(RouterProtocolTest, AClientsMistakeIsA400CountedAsRejected) {
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  ASSERT_EQ(router_.infer("k", good_request().dump(), kKserve).status, 200);  // a warm worker

  const auto with = [](const std::function<void(json&)>& change) {
    json r = good_request();
    change(r);
    return r.dump();
  };
  const std::vector<std::pair<std::string, std::string>> mistakes = {
      {"{not json", "not JSON"},
      {"[1, 2]", "not a JSON object"},
      {with([](json& r) { r.erase("inputs"); }), "\"inputs\""},
      {with([](json& r) { r["inputs"][0]["name"] = "nope"; }), "\"nope\" is not an input"},
      {with([](json& r) { r["inputs"][0]["datatype"] = "FP33"; }), "unknown datatype \"FP33\""},
      {with([](json& r) { r["inputs"][0]["datatype"] = "FP64"; }), "the function takes FP32"},
      {with([](json& r) { r["inputs"][0]["shape"] = {4}; }), "has the shape [4]"},
      {with([](json& r) {
         r["inputs"][0]["shape"] = {3, 2};
       }),
       "4 values for the shape [3,2]"},
      {with([](json& r) {
         r["inputs"][0]["shape"] = {-2, 2};
       }),
       "the dimension -2"},
      {with([](json& r) { r["inputs"].erase(1); }), "\"tag\" is missing"},
  };
  for (const auto& [body, why] : mistakes) {
    router::HttpResponse r = router_.infer("k", body, kKserve);
    EXPECT_EQ(r.status, 400) << body << ": " << r.body;
    const json error = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << r.body;
    EXPECT_NE(error["error"].get<std::string>().find(why), std::string::npos)
        << body << ": " << r.body;
  }
  const json status = router_.function_status("k");
  EXPECT_EQ(status["rejected"], mistakes.size()) << status;
  EXPECT_EQ(status["failed"], 0) << status;
  EXPECT_EQ(status["requests"], 1) << "the mistakes never reached the worker: " << status;
  EXPECT_EQ(status["on_time"], 1) << status;
  EXPECT_EQ(router_.metric(R"(hiber_invocations_total{function="k",status="400"})"),
            static_cast<double>(mistakes.size()));
  EXPECT_EQ(router_.metric(R"(hiber_slo_violations_total{function="k"})"), 0);
  // And the worker still answers.
  EXPECT_EQ(router_.infer("k", good_request().dump(), kKserve).status, 200);
}

TEST_F(RouterProtocolTest, TheAnswersIdIsTheClients) {
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  router::HttpResponse r =
      router_.infer("k", good_request().dump(), kKserve, {{"X-Request-Id", "trace-9"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json answer = json::parse(r.body);
  // The worker wrote its request id (the X-Request-Id); the protocol's id is the client's.
  EXPECT_EQ(answer["id"], "client-request-42") << answer;
  EXPECT_EQ(r.header("X-Request-Id").value_or(""), "trace-9");
  EXPECT_EQ(answer["model_name"], "test");
  // The outputs are what was sent, computed here: the inputs, flattened.
  ASSERT_EQ(answer["outputs"].size(), 2u) << answer;
  EXPECT_EQ(answer["outputs"][0]["name"], "x");
  EXPECT_EQ(answer["outputs"][0]["data"], json({1.0, 2.0, 3.0, 4.0}));
  EXPECT_EQ(answer["outputs"][0]["shape"], json({2, 2}));
  // Each answer carries its own request's id.
  json other = good_request();
  other["id"] = "client-request-43";
  r = router_.infer("k", other.dump(), kKserve);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["id"], "client-request-43");
}

// Little-endian bytes of floats, written here for the test's own reference.
std::string float_bytes(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());  // x86 and Arm servers are little-endian
  return out;
}

// The binary tensor data extension: the JSON's length in Inference-Header-Content-Length, the
// tensors' bytes after it, in both directions; its mistakes are 400s like the JSON ones.
TEST_F(RouterProtocolTest, BinaryTensorDataGoesBothWays) {
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  const std::vector<float> x = {1.5f, -2.0f, 3.25f, 1e-20f};
  const std::string tag = std::string(
      "\x03\x00\x00\x00"
      "abc",
      7);
  const json header = {{"id", "binary-7"},
                       {"inputs",
                        {{{"name", "x"},
                          {"datatype", "FP32"},
                          {"shape", {2, 2}},
                          {"parameters", {{"binary_data_size", 16}}}},
                         {{"name", "tag"},
                          {"datatype", "BYTES"},
                          {"shape", {1}},
                          {"parameters", {{"binary_data_size", tag.size()}}}}}},
                       {"outputs", {{{"name", "x"}, {"parameters", {{"binary_data", true}}}}}}};
  const std::string json_part = header.dump();
  const std::string body = json_part + float_bytes(x) + tag;
  const router::HttpHeaders binary = {
      {"Inference-Header-Content-Length", std::to_string(json_part.size())}};
  router::HttpResponse r =
      router_.infer("k", body, "application/octet-stream; x-test=kserve", binary);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::optional<std::string> length = r.header("Inference-Header-Content-Length");
  ASSERT_TRUE(length.has_value()) << "an answer in binary form names its JSON's length";
  const size_t answer_json = std::stoul(*length);
  ASSERT_LE(answer_json, r.body.size());
  const json answer = json::parse(r.body.substr(0, answer_json));
  EXPECT_EQ(answer["id"], "binary-7") << answer;
  ASSERT_EQ(answer["outputs"].size(), 2u) << answer;
  EXPECT_EQ(answer["outputs"][0]["parameters"]["binary_data_size"], 16) << answer;
  // The worker's outputs are its inputs: the same bytes come back after the JSON.
  EXPECT_EQ(r.body.substr(answer_json), float_bytes(x) + tag);

  // The same tensors as JSON answer in JSON, with the same values.
  r = router_.infer("k", good_request().dump(), kKserve);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.header("Inference-Header-Content-Length").has_value());

  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> mistakes = {
      {{body, "abc"}, "Inference-Header-Content-Length must be the byte count"},
      {{body, std::to_string(body.size() + 1)}, "Inference-Header-Content-Length must be"},
      {{body, "3"}, "are not a JSON object"},
      {{body + "!", std::to_string(json_part.size())}, "1 bytes of binary data after the JSON"},
      {{json_part + float_bytes(x), std::to_string(json_part.size())},
       "bytes of binary data are left"},
  };
  for (const auto& [request, why] : mistakes) {
    r = router_.infer("k", request.first, "application/octet-stream; x-test=kserve",
                      {{"Inference-Header-Content-Length", request.second}});
    EXPECT_EQ(r.status, 400) << why << ": " << r.body;
    EXPECT_NE(r.body.find(why), std::string::npos) << r.body;
  }
  const json status = router_.function_status("k");
  EXPECT_EQ(status["rejected"], mistakes.size()) << status;
  EXPECT_EQ(status["failed"], 0) << status;
}

// A function that declares its tensors takes inference requests, not raw text.
TEST_F(RouterProtocolTest, AFunctionWithDeclaredInputsRefusesOtherContentTypes) {
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  router::HttpResponse r = router_.infer("k", "hello", "text/plain");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("declares its inputs"), std::string::npos) << r.body;
  EXPECT_EQ(router_.function_status("k")["rejected"], 1);
  // A function that declares none takes the caller's own types, as they are.
  ASSERT_EQ(router_.load("raw", raw_registration()).status, 200);
  r = router_.infer("raw", "hello", "text/plain");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "hello");
}

// A handler that finds the request wrong answers a 4xx of its own: the client's mistake,
// counted as rejected, never as the function's failure nor against its SLO.
TEST_F(RouterProtocolTest, AHandlersClientErrorIsA4xxCountedAsRejected) {
  ASSERT_EQ(router_.load("w", raw_registration()).status, 200);
  router::HttpResponse r =
      router_.infer("w", "x must be positive", "application/x-test-client-error");
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("x must be positive"), std::string::npos) << r.body;
  r = router_.infer("w", "the model is sad", "application/x-test-error");
  EXPECT_EQ(r.status, 500) << r.body;
  const json status = router_.function_status("w");
  EXPECT_EQ(status["rejected"], 1) << status;
  EXPECT_EQ(status["failed"], 1) << status;
  EXPECT_EQ(router_.metric(R"(hiber_invocations_total{function="w",status="422"})"), 1);
  EXPECT_EQ(router_.metric(R"(hiber_slo_violations_total{function="w"})"), 1)
      << "only the function's own failure violates its SLO";
}

// Unloading drops every series of the function, counters and histograms alike, and its router
// counts; loading it again starts them all from zero.
TEST_F(RouterProtocolTest, UnloadAndReloadResetEveryMetricOfTheFunction) {
  const std::string ok = R"(hiber_invocations_total{function="k",status="200"})";
  const std::string bad = R"(hiber_invocations_total{function="k",status="400"})";
  const std::string durations = R"(hiber_invocation_duration_seconds_count{function="k"})";
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  ASSERT_EQ(router_.infer("k", "a").status, 200);
  ASSERT_EQ(router_.infer("k", "b").status, 200);
  ASSERT_EQ(router_.infer("k", "[1]", "application/json").status, 400);
  EXPECT_EQ(router_.metric(ok), 2);
  EXPECT_EQ(router_.metric(bad), 1);
  // The rejected request took no time of the function's: it is counted, not timed.
  ASSERT_EQ(router_.metric(durations), 2) << router_.request("GET", "/metrics").body;
  ASSERT_EQ(router_.request("POST", "/v2/repository/models/k/unload").status, 200);
  ASSERT_TRUE(eventually([&] { return router_.function_status("k").is_null(); }));
  ASSERT_TRUE(eventually([&] { return router_.metric(ok) == -1; }))
      << router_.request("GET", "/metrics").body;
  const std::string metrics = router_.request("GET", "/metrics").body;
  EXPECT_EQ(metrics.find("function=\"k\""), std::string::npos) << metrics;
  ASSERT_EQ(router_.load("k", kserve_registration()).status, 200);
  ASSERT_EQ(router_.infer("k", "c").status, 200);
  EXPECT_EQ(router_.metric(ok), 1);
  EXPECT_EQ(router_.metric(bad), -1);
  EXPECT_EQ(router_.metric(durations), 1);
  const json status = router_.function_status("k");
  EXPECT_EQ(status["requests"], 1) << status;
  EXPECT_EQ(status["rejected"], 0) << status;
}

// A deadline that passes while a function without the shim runs is the function's, not hiberd's:
// such a request never reaches hiberd.
TEST_F(RouterProtocolTest, ADeadlineOfAFunctionWithoutTheShimDoesNotBlameHiberd) {
  ASSERT_EQ(router_.load("k", raw_registration()).status, 200);
  ASSERT_EQ(router_.infer("k", "warm").status, 200);
  // A barrier of two that only one request reaches: it runs until its deadline.
  router::HttpResponse r =
      router_.infer("k", "2", "application/x-test-barrier", {{"X-Hiber-Deadline-Ms", "300"}});
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_NE(r.body.find("while the function ran"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("hiberd"), std::string::npos) << r.body;
}

// A function registered without the shim uses no GPU: hiberd going away neither refuses its
// requests nor stops its worker, and a new worker of such a function starts without a node.
TEST_F(RouterProtocolTest, AHiberdOutageDoesNotStopFunctionsWithoutTheShim) {
  ASSERT_EQ(router_.load("k", raw_registration()).status, 200);
  ASSERT_EQ(router_.infer("k", "warm").body, "warm");
  const std::string pid = router_.infer("k", "", "application/x-test-pid").body;
  ASSERT_GT(std::atoi(pid.c_str()), 0) << pid;
  ASSERT_EQ(hiberd_.stop(), 0);
  ASSERT_TRUE(eventually([&] {
    return router_.anonymous_request("GET", "/v2/health/ready").status == 503;
  })) << "the router did not notice hiberd left";
  for (int i = 0; i < 3; ++i) {
    router::HttpResponse r = router_.infer("k", "still " + std::to_string(i));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, "still " + std::to_string(i));
  }
  EXPECT_EQ(router_.infer("k", "", "application/x-test-pid").body, pid) << "the worker was stopped";
  // A second function, registered now: its first worker starts with no node up.
  ASSERT_EQ(router_.load("k2", kserve_registration()).status, 200);
  router::HttpResponse r = router_.infer("k2", good_request().dump(), kKserve);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["id"], "client-request-42");
}

}  // namespace
}  // namespace hiber::testing
