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

// A binary tensor data input: its JSON names the byte count instead of "data".
json binary_input(const std::string& name, const std::string& datatype, json shape, size_t bytes) {
  return {{"name", name},
          {"datatype", datatype},
          {"shape", shape},
          {"parameters", {{"binary_data_size", bytes}}}};
}

std::string binary_refusal(const json& r, std::string_view binary,
                           const std::vector<TensorSpec>& inputs = {}) {
  Result<CheckedInference> checked = check_inference_request(r, inputs, {}, binary);
  if (checked.ok()) return "";
  EXPECT_EQ(checked.status().code(), ErrorCode::kInvalidValue);
  return checked.status().message();
}

// Four bytes of little-endian length, then the bytes: one BYTES element in binary form.
std::string bytes_element(const std::string& s) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xff));
  return out + s;
}

TEST(InferenceRequest, BinaryDataMatchesEachDatatypesSize) {
  const std::vector<std::pair<std::string, size_t>> sizes = {
      {"BOOL", 1},   {"UINT8", 1}, {"INT8", 1}, {"UINT16", 2}, {"INT16", 2}, {"FP16", 2},
      {"UINT32", 4}, {"INT32", 4}, {"FP32", 4}, {"UINT64", 8}, {"INT64", 8}, {"FP64", 8}};
  for (const auto& [datatype, bytes] : sizes) {
    EXPECT_EQ(binary_element_bytes(datatype), bytes) << datatype;
    const std::string data(3 * bytes, '\1');
    EXPECT_EQ(binary_refusal(request({binary_input("x", datatype, {3}, data.size())}), data), "")
        << datatype;
    // One byte short, and one element too many.
    EXPECT_NE(binary_refusal(request({binary_input("x", datatype, {3}, data.size() - 1)}),
                             data.substr(1)),
              "")
        << datatype;
    EXPECT_NE(binary_refusal(request({binary_input("x", datatype, {2}, data.size())}), data), "")
        << datatype;
  }
  EXPECT_EQ(binary_element_bytes("BYTES"), std::nullopt);
  EXPECT_EQ(binary_element_bytes("FP33"), std::nullopt);
}

TEST(InferenceRequest, BinaryInputsTileTheBinaryPartInOrder) {
  const std::string floats(8, '\0'), strings = bytes_element("ab") + bytes_element("");
  // JSON and binary inputs mixed: the binary ones take the binary part in order.
  const json mixed = request({binary_input("x", "FP32", {2}, 8), input("k", "INT32", {1}, {7}),
                              binary_input("s", "BYTES", {2}, strings.size())});
  EXPECT_EQ(binary_refusal(mixed, floats + strings), "");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {binary_refusal(mixed, floats + strings + "!"), "1 bytes of binary data after the JSON"},
      {binary_refusal(mixed, floats), "is 10 bytes, and 0 bytes of binary data are left"},
      {binary_refusal(request({binary_input("s", "BYTES", {3}, strings.size())}), strings),
       "2 BYTES elements for the shape [3]"},
      {binary_refusal(request({binary_input("s", "BYTES", {1}, 5)}),
                      bytes_element("abc").substr(0, 5)),
       "BYTES element 0 needs 3 bytes, 1 are left"},
      {binary_refusal(request({binary_input("s", "BYTES", {1}, 3)}), "abc"), "is cut off"},
      {binary_refusal(request({{{"name", "x"},
                                {"datatype", "FP32"},
                                {"shape", {1}},
                                {"data", {1.0}},
                                {"parameters", {{"binary_data_size", 4}}}}}),
                      floats.substr(0, 4)),
       "both \"data\" and \"binary_data_size\""},
      {binary_refusal(request({{{"name", "x"},
                                {"datatype", "FP32"},
                                {"shape", {1}},
                                {"parameters", {{"binary_data_size", -4}}}}}),
                      ""),
       "must be a byte count"},
      {binary_refusal({{"inputs", {input("k", "INT32", {1}, {7})}},
                       {"parameters", {{"binary_data_output", "yes"}}}},
                      ""),
       "\"binary_data_output\" must be true or false"},
      // Without the extension, binary_data_size has no bytes to refer to.
      {refusal(request({binary_input("x", "FP32", {2}, 8)})),
       "needs the binary tensor data extension"},
  };
  for (const auto& [message, why] : cases) {
    EXPECT_NE(message.find(why), std::string::npos) << "'" << message << "' lacks '" << why << "'";
  }
}

TEST(InferenceRequest, TheBinaryExtensionHeaderIsTheJsonsLength) {
  const std::string json_part = R"({"inputs": []})";
  const std::string body = json_part + "tensor bytes";
  Result<BinaryExtensionHeader> header =
      binary_extension_header(body, std::to_string(json_part.size()));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(header->json.contains("inputs"));
  EXPECT_EQ(header->bytes, json_part.size());
  for (const std::string bad : {"", "-1", "1e3", "12x", "99999999999999999999", "1000"}) {
    Result<BinaryExtensionHeader> refused = binary_extension_header(body, bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("Inference-Header-Content-Length"), std::string::npos)
        << refused.status();
  }
  // The right length of something that is not a JSON object.
  EXPECT_FALSE(binary_extension_header("[1, 2]xyz", "6").ok());
  EXPECT_FALSE(binary_extension_header(body, "5").ok());
}

}  // namespace
}  // namespace hiber::router
