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

// Checks a JSON inference request: an object with a non-empty "inputs" array, each input with a
// unique name, a known datatype, a shape of non-negative dimensions and "data" holding as many
// values of that datatype as the shape has elements (nested arrays are flattened, as the
// protocol allows); "id", when present, a string; "outputs", when present, an array of objects
// with a name. With declarations, every input must be declared with the same datatype and a
// shape that matches (same rank; -1 matches any size), every declared input must be given, and
// every requested output must be declared. kInvalidValue with the reason otherwise.
Result<CheckedInference> check_inference_request(const nlohmann::json& request,
                                                 const std::vector<TensorSpec>& inputs,
                                                 const std::vector<TensorSpec>& outputs);

}  // namespace hiber::router
