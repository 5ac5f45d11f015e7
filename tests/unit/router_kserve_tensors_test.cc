// function_sdk.h's KServe v2 JSON helpers against hand-written requests and answers.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/function_sdk.h"

namespace hiber::function {
namespace {

using nlohmann::json;

std::vector<Tensor> parse_ok(const std::string& body) {
  auto parsed = parse_inputs(body);
  if (auto* problem = std::get_if<std::string>(&parsed)) {
    ADD_FAILURE() << *problem << "\n" << body;
    return {};
  }
  return std::get<std::vector<Tensor>>(parsed);
}

std::string parse_error(const std::string& body) {
  auto parsed = parse_inputs(body);
  if (auto* problem = std::get_if<std::string>(&parsed)) return *problem;
  ADD_FAILURE() << "accepted " << body;
  return "";
}

TEST(KserveTensors, ParsesFp32Int64AndBytesInputs) {
  const std::vector<Tensor> inputs = parse_ok(R"({
    "id": "r1",
    "inputs": [
      {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1.5, -2], [0.25, 3]]},
      {"name": "n", "shape": [3], "datatype": "INT64", "data": [1, -9007199254740993, 4]},
      {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["ab", ""]},
      {"name": "b", "shape": [2], "datatype": "BOOL", "data": [true, false]},
      {"name": "d", "shape": [1], "datatype": "FP64", "data": [0.1]}
    ]})");
  ASSERT_EQ(inputs.size(), 5u);
  EXPECT_EQ(inputs[0].name, "x");
  EXPECT_EQ(inputs[0].datatype, "FP32");
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::get<std::vector<float>>(inputs[0].data),
            (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(inputs[1].data),
            (std::vector<int64_t>{1, -9007199254740993LL, 4}));  // beyond a double's precision
  EXPECT_EQ(std::get<std::vector<std::string>>(inputs[2].data),
            (std::vector<std::string>{"ab", ""}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(inputs[3].data), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(std::get<std::vector<double>>(inputs[4].data), (std::vector<double>{0.1}));
}

TEST(KserveTensors, RejectsMalformedRequests) {
  EXPECT_NE(parse_error("not json"), "");
  EXPECT_NE(parse_error("[]"), "");
  EXPECT_NE(parse_error(R"({"outputs": []})").find("inputs"), std::string::npos);
  // A count that is not the shape's product.
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]})")
                .find("x"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[128]}]})"),
            "");
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[-1]}]})"),
            "");
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1.5]}]})"),
            "");
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":[1]}]})"),
            "");
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":["a"]}]})"),
            "");
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[1],"datatype":"BF17","data":[1]}]})")
                .find("BF17"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[]}]})"),
            "");
}

TEST(KserveTensors, BuildsAnOutputsAnswer) {
  const Response response =
      outputs_response({Tensor{"y", "FP32", {1, 2}, std::vector<float>{0.5f, -1.0f}},
                        Tensor{"k", "INT64", {2}, std::vector<int64_t>{7, -8}},
                        Tensor{"t", "BYTES", {1}, std::vector<std::string>{"hi"}},
                        Tensor{"b", "BOOL", {2}, std::vector<int64_t>{1, 0}}},
                       "r1", "fn");
  EXPECT_EQ(response.content_type, "application/json");
  EXPECT_EQ(json::parse(response.body), json::parse(R"({
    "model_name": "fn", "id": "r1",
    "outputs": [
      {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [0.5, -1.0]},
      {"name": "k", "datatype": "INT64", "shape": [2], "data": [7, -8]},
      {"name": "t", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
      {"name": "b", "datatype": "BOOL", "shape": [2], "data": [true, false]}
    ]})"));
  EXPECT_EQ(json::parse(outputs_response({}).body), json::parse(R"({"outputs": []})"));
}

TEST(KserveTensors, OutputsRoundTripThroughParseInputs) {
  const std::vector<float> values = {0.1f, 3.4028235e38f, -1e-30f};
  const Response response = outputs_response({Tensor{"v", "FP32", {3}, values}});
  std::string as_request = response.body;
  as_request.replace(as_request.find("outputs"), 7, "inputs");
  const std::vector<Tensor> back = parse_ok(as_request);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(std::get<std::vector<float>>(back[0].data), values);  // exact, not approximate
}

TEST(KserveTensors, RejectsOutputsThatDoNotMatchTheirDatatypeOrShape) {
  EXPECT_THROW(outputs_response({Tensor{"y", "FP32", {1}, std::vector<int64_t>{1}}}),
               std::invalid_argument);
  EXPECT_THROW(outputs_response({Tensor{"y", "INT64", {3}, std::vector<int64_t>{1}}}),
               std::invalid_argument);
  EXPECT_THROW(outputs_response({Tensor{"y", "NOPE", {1}, std::vector<int64_t>{1}}}),
               std::invalid_argument);
}

}  // namespace
}  // namespace hiber::function
