// function_sdk.h's KServe v2 JSON tensor helpers.
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "router/function_sdk.h"

namespace hiber::function {
namespace {

using nlohmann::json;

enum Storage : size_t { kFloat = 0, kDouble = 1, kInteger = 2, kBytes = 3, kUnsupported = 99 };

struct IntegerRange {
  int64_t min;
  int64_t max;
};

Storage storage_of(const std::string& datatype) {
  if (datatype == "FP32" || datatype == "FP16") return kFloat;
  if (datatype == "FP64") return kDouble;
  if (datatype == "BYTES") return kBytes;
  if (datatype == "INT8" || datatype == "INT16" || datatype == "INT32" || datatype == "INT64" ||
      datatype == "UINT8" || datatype == "UINT16" || datatype == "UINT32" || datatype == "BOOL") {
    return kInteger;
  }
  return kUnsupported;
}

IntegerRange range_of(const std::string& datatype) {
  if (datatype == "INT8") return {-128, 127};
  if (datatype == "INT16") return {-32768, 32767};
  if (datatype == "INT32")
    return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  if (datatype == "UINT8") return {0, 255};
  if (datatype == "UINT16") return {0, 65535};
  if (datatype == "UINT32") return {0, std::numeric_limits<uint32_t>::max()};
  if (datatype == "BOOL") return {0, 1};
  return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
}

// The product of a shape's dimensions, or -1 if one is negative or it overflows.
int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || (dim > 0 && count > std::numeric_limits<int64_t>::max() / dim)) return -1;
    count *= dim;
  }
  return count;
}

void flatten(const json& data, std::vector<const json*>& out) {
  if (!data.is_array()) {
    out.push_back(&data);
    return;
  }
  for (const json& element : data) flatten(element, out);
}

// Reads one tensor of "inputs"; returns an error message or "".
std::string parse_tensor(const json& input, Tensor& tensor) {
  if (!input.is_object()) return "an input is not a JSON object";
  const auto name = input.find("name");
  if (name == input.end() || !name->is_string()) return "an input has no string \"name\"";
  tensor.name = name->get<std::string>();
  const std::string where = "input \"" + tensor.name + "\": ";
  const auto datatype = input.find("datatype");
  if (datatype == input.end() || !datatype->is_string()) return where + "no string \"datatype\"";
  tensor.datatype = datatype->get<std::string>();
  const Storage storage = storage_of(tensor.datatype);
  if (storage == kUnsupported) return where + "unsupported datatype " + tensor.datatype;
  const auto shape = input.find("shape");
  if (shape == input.end() || !shape->is_array()) return where + "no \"shape\" array";
  for (const json& dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return where + "a shape dimension is not a non-negative integer";
    }
    tensor.shape.push_back(dim.get<int64_t>());
  }
  const auto data = input.find("data");
  if (data == input.end() || !data->is_array()) return where + "no \"data\" array";
  std::vector<const json*> values;
  flatten(*data, values);
  const int64_t count = element_count(tensor.shape);
  if (count < 0 || static_cast<uint64_t>(count) != values.size()) {
    return where + std::to_string(values.size()) + " values for a shape of " +
           std::to_string(count) + " elements";
  }
  const std::string bad_value = where + "a value that is not " + tensor.datatype;
  switch (storage) {
    case kFloat:
    case kDouble: {
      std::vector<double> out;
      out.reserve(values.size());
      for (const json* value : values) {
        if (!value->is_number()) return bad_value;
        out.push_back(value->get<double>());
      }
      if (storage == kDouble) {
        tensor.data = std::move(out);
      } else {
        tensor.data = std::vector<float>(out.begin(), out.end());
      }
      break;
    }
    case kInteger: {
      const IntegerRange range = range_of(tensor.datatype);
      const bool is_bool = tensor.datatype == "BOOL";
      std::vector<int64_t> out;
      out.reserve(values.size());
      for (const json* value : values) {
        int64_t v = 0;
        if (is_bool && value->is_boolean()) {
          v = value->get<bool>() ? 1 : 0;
        } else if (value->is_number_unsigned()) {
          if (value->get<uint64_t>() > static_cast<uint64_t>(range.max)) return bad_value;
          v = static_cast<int64_t>(value->get<uint64_t>());
        } else if (value->is_number_integer()) {
          v = value->get<int64_t>();
        } else {
          return bad_value;
        }
        if (v < range.min || v > range.max) return bad_value;
        out.push_back(v);
      }
      tensor.data = std::move(out);
      break;
    }
    case kBytes: {
      std::vector<std::string> out;
      out.reserve(values.size());
      for (const json* value : values) {
        if (!value->is_string()) return bad_value;
        out.push_back(value->get<std::string>());
      }
      tensor.data = std::move(out);
      break;
    }
    case kUnsupported: break;
  }
  return "";
}

}  // namespace

std::variant<std::vector<Tensor>, std::string> parse_inputs(std::string_view json_body) {
  const json request = json::parse(json_body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return std::string("the request is not a JSON object");
  }
  const auto inputs = request.find("inputs");
  if (inputs == request.end() || !inputs->is_array()) {
    return std::string("the request has no \"inputs\" array");
  }
  std::vector<Tensor> tensors;
  for (const json& input : *inputs) {
    Tensor tensor;
    std::string problem = parse_tensor(input, tensor);
    if (!problem.empty()) return problem;
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

Response outputs_response(const std::vector<Tensor>& outputs, const std::string& id,
                          const std::string& model_name) {
  json answer = json::object();
  if (!model_name.empty()) answer["model_name"] = model_name;
  if (!id.empty()) answer["id"] = id;
  json out = json::array();
  for (const Tensor& tensor : outputs) {
    const std::string where = "output \"" + tensor.name + "\": ";
    const Storage storage = storage_of(tensor.datatype);
    if (storage == kUnsupported) {
      throw std::invalid_argument(where + "unsupported datatype " + tensor.datatype);
    }
    if (tensor.data.index() != storage) {
      throw std::invalid_argument(where + "data does not hold " + tensor.datatype + " values");
    }
    json data = std::visit([](const auto& values) { return json(values); }, tensor.data);
    const int64_t count = element_count(tensor.shape);
    if (count < 0 || static_cast<uint64_t>(count) != data.size()) {
      throw std::invalid_argument(where + std::to_string(data.size()) + " values for a shape of " +
                                  std::to_string(count) + " elements");
    }
    if (tensor.datatype == "BOOL") {
      for (json& value : data) value = value.get<int64_t>() != 0;
    }
    out.push_back({{"name", tensor.name},
                   {"datatype", tensor.datatype},
                   {"shape", tensor.shape},
                   {"data", std::move(data)}});
  }
  answer["outputs"] = std::move(out);
  return Response{"application/json", answer.dump(-1, ' ', false, json::error_handler_t::replace)};
}

}  // namespace hiber::function
