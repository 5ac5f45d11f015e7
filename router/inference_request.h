// The Open Inference Protocol v2's tensors as the router checks them (KServe's predict_v2,
// "Inference Request JSON Object"): a registration's declared inputs and outputs, and a JSON
// inference request checked against them before it reaches a worker, so that a client's
// mistake is its own 400 with a message, not the function's 500.
//
// Thread safety: plain functions and values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace hiber::router {

// One declared tensor: the model metadata's {"name", "datatype", "shape"}; -1 in the shape is a
// dimension of any size.
struct TensorSpec {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;

  nlohmann::json to_json() const;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Whether `datatype` is one of the protocol's: BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32,
// FP64, BYTES.
bool is_tensor_datatype(std::string_view datatype);

// A registration's "inputs" or "outputs" (`field` names it in errors): an array of tensor specs
// with distinct names, known datatypes and dimensions of -1 or more. kInvalidValue otherwise.
Result<std::vector<TensorSpec>> parse_tensor_specs(const nlohmann::json& specs,
                                                   std::string_view field);

// What the router keeps of a request it checked.
struct CheckedInference {
  std::optional<std::string> id;  // the request's "id", which its answer carries
};

// The bytes one element of `datatype` takes in the binary tensor data extension (BOOL 1, FP16
// 2, ...); none for BYTES (each element is a 4-byte little-endian length and its bytes) and for
// a name that is not a datatype.
std::optional<size_t> binary_element_bytes(std::string_view datatype);

// Checks a JSON inference request: an object with a non-empty "inputs" array, each input with a
// unique name, a known datatype, a shape of non-negative dimensions and "data" holding as many
// values of that datatype as the shape has elements (nested arrays are flattened, as the
// protocol allows); "id", when present, a string; "outputs", when present, an array of objects
// with a name. With declarations, every input must be declared with the same datatype and a
// shape that matches (same rank; -1 matches any size), every declared input must be given, and
// every requested output must be declared. kInvalidValue with the reason otherwise.
//
// `binary` is the part of the body after the JSON of a request in the binary tensor data
// extension (KServe's and Triton's `Inference-Header-Content-Length`), none for a plain JSON
// request. There an input may carry `"parameters": {"binary_data_size": N}` instead of "data":
// its N bytes follow in the binary part, in the order of the inputs, little-endian, elements of
// the datatype's size (BYTES: a 4-byte length before each element). The sizes must match the
// shapes and add up to the binary part exactly.
Result<CheckedInference> check_inference_request(
    const nlohmann::json& request, const std::vector<TensorSpec>& inputs,
    const std::vector<TensorSpec>& outputs, std::optional<std::string_view> binary = std::nullopt);

// The JSON of a request or an answer in the binary tensor data extension: `header_bytes` (the
// `Inference-Header-Content-Length` header's text) must be a decimal byte count no larger than
// the body, and those bytes a JSON object. kInvalidValue otherwise.
struct BinaryExtensionHeader {
  nlohmann::json json;  // the object
  uint64_t bytes = 0;   // its length: the tensors' bytes start there
};
Result<BinaryExtensionHeader> binary_extension_header(std::string_view body,
                                                      std::string_view header_bytes);

}  // namespace hiber::router
