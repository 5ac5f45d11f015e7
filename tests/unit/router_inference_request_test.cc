// router/inference_request.h: declarations parsed, JSON inference requests checked. Each bad
// request is written out here with the reason a client should read; each good one passes.
#include "router/inference_request.h"

#include <gtest/gtest.h>

namespace hiber::router {
namespace {

using nlohmann::json;

json input(const std::string& name, const std::string& datatype, json shape, json data) {
  return {{"name", name}, {"datatype", datatype}, {"shape", shape}, {"data", data}};
}

json request(json inputs) { return {{"inputs", inputs}}; }

// The message of a refused request, or "" when it passed.
std::string refusal(const json& r, const std::vector<TensorSpec>& inputs = {},
                    const std::vector<TensorSpec>& outputs = {}) {
  Result<CheckedInference> checked = check_inference_request(r, inputs, outputs);
  if (checked.ok()) return "";
  EXPECT_EQ(checked.status().code(), ErrorCode::kInvalidValue);
  return checked.status().message();
}

TEST(InferenceRequest, AcceptsEveryDatatypeWithMatchingData) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"BOOL", {true, false}},
      {"UINT8", {0, 255}},
      {"UINT16", {0, 65535}},
      {"UINT32", {0, 4294967295u}},
      {"UINT64", {0, 18446744073709551615u}},
      {"INT8", {-128, 127}},
      {"INT16", {-32768, 32767}},
      {"INT32", {-2147483648, 7}},
      {"INT64", {-9223372036854775807LL, 9223372036854775807LL}},
      {"FP16", {0.5, 1}},
      {"FP32", {1.5, -2}},
      {"FP64", {1e300, 0}},
      {"BYTES", {"a", ""}}};
  for (const auto& [datatype, data] : cases) {
    EXPECT_EQ(refusal(request({input("x", datatype, {2}, data)})), "") << datatype;
  }
  // Nested data is flattened; a 0-sized dimension takes no data; an id is kept.
  EXPECT_EQ(refusal(request({input("x", "FP32", {2, 3}, {{1, 2, 3}, {4, 5, 6}})})), "");
  EXPECT_EQ(refusal(request({input("x", "FP32", {0, 3}, json::array())})), "");
  Result<CheckedInference> with_id =
      check_inference_request({{"id", "r-7"}, {"inputs", {input("x", "INT8", {1}, {3})}}}, {}, {});
  ASSERT_TRUE(with_id.ok()) << with_id.status();
  EXPECT_EQ(with_id->id, "r-7");
}

TEST(InferenceRequest, RefusesWhatTheProtocolDoesNotAllow) {
  const json x = input("x", "FP32", {2}, {1, 2});
  const std::vector<std::pair<json, std::string>> cases = {
      {json::array(), "not a JSON object"},
      {json::object(), "non-empty \"inputs\""},
      {request(json::array()), "non-empty \"inputs\""},
      {{{"inputs", x}}, "non-empty \"inputs\""},
      {request({input("x", "FP33", {2}, {1, 2})}), "unknown datatype \"FP33\""},
      {request({input("x", "FP32", {-1}, {1})}), "the dimension -1"},
      {request({input("x", "FP32", {2.5}, {1})}), "integers"},
      {request({input("x", "FP32", {3}, {1, 2})}), "2 values for the shape [3] (3 elements)"},
      {request({input("x", "FP32", {2}, {1, "a"})}), "\"a\" is not a FP32 value"},
      {request({input("x", "INT8", {1}, {128})}), "128 is not a INT8 value"},
      {request({input("x", "UINT8", {1}, {-1})}), "-1 is not a UINT8 value"},
      {request({input("x", "INT32", {1}, {1.5})}), "1.5 is not a INT32 value"},
      {request({input("x", "BOOL", {1}, {1})}), "1 is not a BOOL value"},
      {request({input("x", "BYTES", {1}, {7})}), "7 is not a BYTES value"},
      {request({x, x}), "input \"x\" is given twice"},
      {request({{{"datatype", "FP32"}, {"shape", {1}}, {"data", {1}}}}), "needs a \"name\""},
      {request({{{"name", "x"}, {"shape", {1}}, {"data", {1}}}}), "needs a \"datatype\""},
      {request({{{"name", "x"}, {"datatype", "FP32"}, {"data", {1}}}}), "needs a \"shape\""},
      {request({{{"name", "x"}, {"datatype", "FP32"}, {"shape", {1}}}}), "needs \"data\""},
      {{{"id", 7}, {"inputs", {x}}}, "\"id\" must be a string"},
      {{{"inputs", {x}}, {"outputs", 3}}, "\"outputs\" must be an array"},
  };
  for (const auto& [r, why] : cases) {
    const std::string message = refusal(r);
    EXPECT_NE(message.find(why), std::string::npos) << r << " -> '" << message << "'";
  }
}

TEST(InferenceRequest, ChecksAgainstTheDeclarations) {
  Result<std::vector<TensorSpec>> inputs =
      parse_tensor_specs(json::parse(R"([{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                      {"name": "mask", "datatype": "BOOL", "shape": [4]}])"),
                         "inputs");
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  Result<std::vector<TensorSpec>> outputs = parse_tensor_specs(
      json::parse(R"([{"name": "y", "datatype": "FP32", "shape": [-1]}])"), "outputs");
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const json mask = input("mask", "BOOL", {4}, {true, true, false, true});
  const json x2 = input("x", "FP32", {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(refusal(request({x2, mask}), *inputs, *outputs), "");
  EXPECT_EQ(refusal({{"inputs", {x2, mask}}, {"outputs", {{{"name", "y"}}}}}, *inputs, *outputs),
            "");
  const std::vector<std::pair<json, std::string>> cases = {
      {request({x2}), "the input \"mask\" is missing"},
      {request({x2, mask, input("z", "FP32", {1}, {1})}), "\"z\" is not an input"},
      {request({input("x", "FP64", {1, 4}, {1, 2, 3, 4}), mask}),
       "is FP64; the function takes FP32"},
      {request({input("x", "FP32", {2, 2}, {1, 2, 3, 4}), mask}), "the shape [2,2]"},
      {request({input("x", "FP32", {8}, {1, 2, 3, 4, 5, 6, 7, 8}), mask}), "the shape [8]"},
      {{{"inputs", {x2, mask}}, {"outputs", {{{"name", "q"}}}}}, "\"q\" is not an output"},
  };
  for (const auto& [r, why] : cases) {
    const std::string message = refusal(r, *inputs, *outputs);
    EXPECT_NE(message.find(why), std::string::npos) << r << " -> '" << message << "'";
  }
}

TEST(InferenceRequest, DeclarationsMustBeWellFormed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"name": "x"})", "must be an array"},
      {R"([{"datatype": "FP32", "shape": [1]}])", "needs a \"name\""},
      {R"([{"name": "x", "datatype": "FP33", "shape": [1]}])", "\"datatype\" must be one of"},
      {R"([{"name": "x", "datatype": "FP32"}])", "needs a \"shape\""},
      {R"([{"name": "x", "datatype": "FP32", "shape": [-2]}])", "the dimension -2"},
      {R"([{"name": "x", "datatype": "FP32", "shape": [1], "colour": 1}])", "unknown field"},
      {R"([{"name": "x", "datatype": "FP32", "shape": [1]},
           {"name": "x", "datatype": "FP32", "shape": [1]}])",
       "declared twice"},
  };
  for (const auto& [text, why] : cases) {
    Result<std::vector<TensorSpec>> parsed = parse_tensor_specs(json::parse(text), "inputs");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().message().find(why), std::string::npos)
        << text << " -> " << parsed.status().message();
  }
}

}  // namespace
}  // namespace hiber::router
