// function_sdk.h's KServe v2 helpers (JSON and the binary tensor data extension) against
// hand-written requests and answers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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

// A request in the binary tensor data extension, as a Request the router hands a worker.
Request binary_request(const std::string& json_part, const std::string& binary) {
  Request request;
  request.content_type = "application/octet-stream";
  request.body = json_part + binary;
  request.inference_header_bytes = json_part.size();
  return request;
}

// Little-endian bytes of each value, written out here independently of the SDK.
template <typename T>
std::string little_endian(const std::vector<T>& values) {
  std::string out;
  for (T v : values) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    for (size_t i = 0; i < sizeof v; ++i)
      out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  return out;
}

TEST(KserveTensors, ParsesBinaryInputsOfEveryStorage) {
  const std::vector<float> floats = {1.5f, -2.25f};
  const std::vector<int16_t> shorts = {-3, 32767};
  const std::vector<double> doubles = {1e300};
  // FP16: 1.0 = 0x3c00, -2.0 = 0xc000, 65504 (the largest) = 0x7bff, 2^-24 (the smallest
  // subnormal) = 0x0001.
  const std::string halves = std::string("\x00\x3c\x00\xc0\xff\x7b\x01\x00", 8);
  const std::string strings = std::string("\x02\x00\x00\x00hi\x00\x00\x00\x00", 10);
  const std::string bools = std::string("\x01\x00", 2);
  const std::string json_part = R"({"inputs": [
      {"name": "f", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
      {"name": "j", "datatype": "INT32", "shape": [1], "data": [9]},
      {"name": "s", "datatype": "INT16", "shape": [2], "parameters": {"binary_data_size": 4}},
      {"name": "d", "datatype": "FP64", "shape": [1], "parameters": {"binary_data_size": 8}},
      {"name": "h", "datatype": "FP16", "shape": [4], "parameters": {"binary_data_size": 8}},
      {"name": "b", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 10}},
      {"name": "o", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}}]})";
  auto parsed = parse_inputs(
      binary_request(json_part, little_endian(floats) + little_endian(shorts) +
                                    little_endian(doubles) + halves + strings + bools));
  ASSERT_TRUE(std::holds_alternative<std::vector<Tensor>>(parsed)) << std::get<std::string>(parsed);
  const auto& t = std::get<std::vector<Tensor>>(parsed);
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(std::get<std::vector<float>>(t[0].data), floats);
  EXPECT_EQ(std::get<std::vector<int64_t>>(t[1].data), std::vector<int64_t>{9});
  EXPECT_EQ(std::get<std::vector<int64_t>>(t[2].data), (std::vector<int64_t>{-3, 32767}));
  EXPECT_EQ(std::get<std::vector<double>>(t[3].data), doubles);
  EXPECT_EQ(std::get<std::vector<float>>(t[4].data),
            (std::vector<float>{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(std::get<std::vector<std::string>>(t[5].data), (std::vector<std::string>{"hi", ""}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(t[6].data), (std::vector<int64_t>{1, 0}));

  // Bytes left over, too few, and a BOOL byte of 2.
  const std::string one = R"({"inputs": [{"name": "f", "datatype": "FP32", "shape": [1],
                                          "parameters": {"binary_data_size": 4}}]})";
  EXPECT_TRUE(std::holds_alternative<std::string>(parse_inputs(binary_request(one, "12345"))));
  EXPECT_TRUE(std::holds_alternative<std::string>(parse_inputs(binary_request(one, "123"))));
  const std::string flag = R"({"inputs": [{"name": "o", "datatype": "BOOL", "shape": [1],
                                           "parameters": {"binary_data_size": 1}}]})";
  EXPECT_TRUE(std::holds_alternative<std::string>(parse_inputs(binary_request(flag, "\x02"))));
}

TEST(KserveTensors, BinaryOutputsRoundTripExactly) {
  const std::vector<Tensor> outputs = {
      Tensor{"f", "FP32", {2}, std::vector<float>{0.1f, -3.4028235e38f}},
      Tensor{"h", "FP16", {3}, std::vector<float>{1.0f, -0.5f, 65504.0f}},
      Tensor{"i", "INT8", {2}, std::vector<int64_t>{-128, 127}},
      Tensor{"u", "UINT32", {1}, std::vector<int64_t>{4294967295LL}},
      Tensor{"s", "BYTES", {1}, std::vector<std::string>{"bytes"}}};
  const Response response = outputs_response(outputs, "id-1", "m", /*binary=*/true);
  ASSERT_TRUE(response.inference_header_bytes.has_value());
  EXPECT_EQ(response.content_type, "application/octet-stream");
  const json header = json::parse(response.body.substr(0, *response.inference_header_bytes));
  EXPECT_EQ(header["id"], "id-1");
  EXPECT_EQ(header["outputs"][0]["parameters"]["binary_data_size"], 8);
  EXPECT_FALSE(header["outputs"][0].contains("data"));
  // The FP32 bytes are exactly the values' own.
  EXPECT_EQ(response.body.substr(*response.inference_header_bytes, 8),
            little_endian(std::vector<float>{0.1f, -3.4028235e38f}));
  // As a request (outputs renamed inputs), the SDK reads back the same values.
  std::string json_part = response.body.substr(0, *response.inference_header_bytes);
  json_part.replace(json_part.find("outputs"), 7, "inputs");
  auto back = parse_inputs(
      binary_request(json_part, response.body.substr(*response.inference_header_bytes)));
  ASSERT_TRUE(std::holds_alternative<std::vector<Tensor>>(back)) << std::get<std::string>(back);
  const auto& t = std::get<std::vector<Tensor>>(back);
  ASSERT_EQ(t.size(), outputs.size());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i].data, outputs[i].data) << t[i].name;
}

TEST(KserveTensors, Fp16RoundsToNearestEven) {
  // 1 + 2^-11 lies half-way between 1 and 1 + 2^-10: it rounds to the even one, 1; 1 + 3*2^-11
  // rounds up to 1 + 2^-9. 1e-8 is below half the smallest subnormal: 0. 70000 overflows: inf.
  const std::vector<float> in = {1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11),
                                 1e-8f, 70000.0f};
  const Response r = outputs_response({Tensor{"h", "FP16", {4}, in}}, "", "", true);
  EXPECT_EQ(r.body.substr(*r.inference_header_bytes),
            std::string("\x00\x3c\x02\x3c\x00\x00\x00\x7c", 8));
}

TEST(KserveTensors, WantsBinaryOutputsWhenTheRequestAsks) {
  Request r;
  r.body = R"({"inputs": [], "parameters": {"binary_data_output": true}})";
  EXPECT_TRUE(wants_binary_outputs(r));
  r.body = R"({"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})";
  EXPECT_TRUE(wants_binary_outputs(r));
  r.body = R"({"inputs": [], "outputs": [{"name": "y"}]})";
  EXPECT_FALSE(wants_binary_outputs(r));
  r = binary_request(R"({"parameters": {"binary_data_output": true}})", "binary tail");
  EXPECT_TRUE(wants_binary_outputs(r));
}

}  // namespace
}  // namespace hiber::function
