// function_sdk.h's KServe v2 JSON tensor helpers.
#include <cstdint>
#include <cstring>
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

// Little-endian bytes, as the binary tensor data extension lays elements out.
uint64_t read_le(const char* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = bytes; i-- > 0;) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
void append_le(std::string& out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// IEEE 754 binary16 to binary32 and back (round to nearest even), for FP16 in binary form.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff);
  uint32_t mantissa = bits & 0x7fffff;
  if (exponent == 0xff) return sign | 0x7c00 | (mantissa != 0 ? 0x200 : 0);  // inf, NaN
  const int32_t e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;  // overflow: inf
  if (e <= 0) {
    if (e < -10) return sign;  // underflow: zero
    mantissa |= 0x800000;
    const int shift = 14 - e;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into inf: right
  return sign | static_cast<uint16_t>(half);
}

// The bytes of one element in binary form; 0 for BYTES (length-prefixed).
size_t element_bytes(const std::string& datatype) {
  if (datatype == "BOOL" || datatype == "INT8" || datatype == "UINT8") return 1;
  if (datatype == "INT16" || datatype == "UINT16" || datatype == "FP16") return 2;
  if (datatype == "INT32" || datatype == "UINT32" || datatype == "FP32") return 4;
  if (datatype == "INT64" || datatype == "FP64") return 8;
  return 0;
}

// An input's "parameters"."binary_data_size", or -1 when it has none; -2 when it is malformed.
int64_t binary_data_size(const json& input) {
  const auto parameters = input.find("parameters");
  if (parameters == input.end() || !parameters->is_object()) return -1;
  const auto size = parameters->find("binary_data_size");
  if (size == parameters->end()) return -1;
  if (!size->is_number_integer()) return -2;
  if (size->is_number_unsigned()) {
    const uint64_t bytes = size->get<uint64_t>();
    return bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? -2
               : static_cast<int64_t>(bytes);
  }
  return size->get<int64_t>() < 0 ? -2 : size->get<int64_t>();
}

// Reads a tensor's values from its binary form; returns an error message or "".
std::string decode_binary(std::string_view bytes, const std::string& where, int64_t count,
                          Tensor& tensor) {
  const Storage storage = storage_of(tensor.datatype);
  if (storage == kBytes) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < bytes.size()) {
      if (bytes.size() - at < 4) return where + "a BYTES element's length is cut off";
      const uint64_t length = read_le(bytes.data() + at, 4);
      at += 4;
      if (length > bytes.size() - at) return where + "a BYTES element is cut off";
      out.emplace_back(bytes.substr(at, length));
      at += length;
    }
    if (static_cast<int64_t>(out.size()) != count) {
      return where + std::to_string(out.size()) + " BYTES elements for a shape of " +
             std::to_string(count) + " elements";
    }
    tensor.data = std::move(out);
    return "";
  }
  const size_t size = element_bytes(tensor.datatype);
  if (bytes.size() != static_cast<uint64_t>(count) * size) {
    return where + std::to_string(bytes.size()) + " bytes of binary data for " +
           std::to_string(count) + " elements of " + std::to_string(size) + " bytes";
  }
  const char* p = bytes.data();
  if (storage == kFloat || storage == kDouble) {
    std::vector<double> out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i, p += size) {
      const uint64_t raw = read_le(p, size);
      if (size == 2) {
        out.push_back(half_to_float(static_cast<uint16_t>(raw)));
      } else if (size == 4) {
        const auto bits = static_cast<uint32_t>(raw);
        float f;
        std::memcpy(&f, &bits, sizeof f);
        out.push_back(f);
      } else {
        double d;
        std::memcpy(&d, &raw, sizeof d);
        out.push_back(d);
      }
    }
    if (storage == kDouble) {
      tensor.data = std::move(out);
    } else {
      tensor.data = std::vector<float>(out.begin(), out.end());
    }
    return "";
  }
  const bool is_signed = tensor.datatype.rfind("INT", 0) == 0;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i, p += size) {
    uint64_t raw = read_le(p, size);
    if (is_signed && size < 8 && (raw >> (8 * size - 1)) != 0) raw |= ~uint64_t{0} << (8 * size);
    if (tensor.datatype == "BOOL" && raw > 1) return where + "a BOOL byte that is not 0 or 1";
    out.push_back(static_cast<int64_t>(raw));
  }
  tensor.data = std::move(out);
  return "";
}

// Reads one tensor of "inputs"; returns an error message or "". `binary` is the binary part of
// a request in the binary tensor data extension (none for JSON), and `binary_used` how much of
// it the inputs before this one took.
std::string parse_tensor(const json& input, Tensor& tensor,
                         std::optional<std::string_view> binary = std::nullopt,
                         size_t* binary_used = nullptr) {
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
  const int64_t count = element_count(tensor.shape);
  if (count < 0) return where + "the shape is too large";
  const int64_t binary_size = binary_data_size(input);
  if (binary_size == -2) return where + "\"binary_data_size\" is not a byte count";
  if (binary_size >= 0) {
    if (!binary) return where + "binary data without the binary tensor data extension";
    if (static_cast<uint64_t>(binary_size) > binary->size() - *binary_used) {
      return where + "binary_data_size is larger than the binary data left";
    }
    const std::string_view bytes = binary->substr(*binary_used, static_cast<size_t>(binary_size));
    *binary_used += static_cast<size_t>(binary_size);
    return decode_binary(bytes, where, count, tensor);
  }
  const auto data = input.find("data");
  if (data == input.end() || !data->is_array()) return where + "no \"data\" array";
  std::vector<const json*> values;
  flatten(*data, values);
  if (static_cast<uint64_t>(count) != values.size()) {
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

namespace {

std::variant<std::vector<Tensor>, std::string> parse_request(
    std::string_view json_body, std::optional<std::string_view> binary) {
  const json request = json::parse(json_body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return std::string("the request is not a JSON object");
  }
  const auto inputs = request.find("inputs");
  if (inputs == request.end() || !inputs->is_array()) {
    return std::string("the request has no \"inputs\" array");
  }
  std::vector<Tensor> tensors;
  size_t binary_used = 0;
  for (const json& input : *inputs) {
    Tensor tensor;
    std::string problem = parse_tensor(input, tensor, binary, &binary_used);
    if (!problem.empty()) return problem;
    tensors.push_back(std::move(tensor));
  }
  if (binary && binary_used != binary->size()) {
    return std::to_string(binary->size() - binary_used) +
           " bytes of binary data belong to no input";
  }
  return tensors;
}

}  // namespace

std::variant<std::vector<Tensor>, std::string> parse_inputs(std::string_view json_body) {
  return parse_request(json_body, std::nullopt);
}

std::variant<std::vector<Tensor>, std::string> parse_inputs(const Request& request) {
  if (!request.inference_header_bytes) return parse_request(request.body, std::nullopt);
  const size_t header = *request.inference_header_bytes;
  if (header > request.body.size()) return std::string("the inference header is cut off");
  const std::string_view body(request.body);
  return parse_request(body.substr(0, header), body.substr(header));
}

bool wants_binary_outputs(const Request& request) {
  const std::string_view body(request.body);
  const json parsed = json::parse(
      request.inference_header_bytes ? body.substr(0, *request.inference_header_bytes) : body,
      nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return false;
  const auto parameters = parsed.find("parameters");
  if (parameters != parsed.end() && parameters->is_object() &&
      parameters->value("binary_data_output", false)) {
    return true;
  }
  const auto outputs = parsed.find("outputs");
  if (outputs == parsed.end() || !outputs->is_array()) return false;
  for (const json& output : *outputs) {
    const auto p = output.is_object() ? output.find("parameters") : output.end();
    if (p != output.end() && p->is_object() && p->value("binary_data", false)) return true;
  }
  return false;
}

namespace {

// One output's values in binary form.
std::string encode_binary(const Tensor& tensor) {
  std::string out;
  const size_t size = element_bytes(tensor.datatype);
  if (const auto* strings = std::get_if<std::vector<std::string>>(&tensor.data)) {
    for (const std::string& s : *strings) {
      if (s.size() > std::numeric_limits<uint32_t>::max()) {
        throw std::invalid_argument("output \"" + tensor.name + "\": a BYTES element over 4 GiB");
      }
      append_le(out, s.size(), 4);
      out += s;
    }
  } else if (const auto* floats = std::get_if<std::vector<float>>(&tensor.data)) {
    for (float f : *floats) {
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      append_le(out, size == 2 ? float_to_half(f) : bits, size);
    }
  } else if (const auto* doubles = std::get_if<std::vector<double>>(&tensor.data)) {
    for (double d : *doubles) {
      uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      append_le(out, bits, 8);
    }
  } else {
    for (int64_t v : std::get<std::vector<int64_t>>(tensor.data)) {
      append_le(out, static_cast<uint64_t>(tensor.datatype == "BOOL" ? (v != 0) : v), size);
    }
  }
  return out;
}

}  // namespace

Response outputs_response(const std::vector<Tensor>& outputs, const std::string& id,
                          const std::string& model_name, bool binary) {
  json answer = json::object();
  if (!model_name.empty()) answer["model_name"] = model_name;
  if (!id.empty()) answer["id"] = id;
  json out = json::array();
  std::string binary_part;
  for (const Tensor& tensor : outputs) {
    const std::string where = "output \"" + tensor.name + "\": ";
    const Storage storage = storage_of(tensor.datatype);
    if (storage == kUnsupported) {
      throw std::invalid_argument(where + "unsupported datatype " + tensor.datatype);
    }
    if (tensor.data.index() != storage) {
      throw std::invalid_argument(where + "data does not hold " + tensor.datatype + " values");
    }
    const size_t values = std::visit([](const auto& v) { return v.size(); }, tensor.data);
    const int64_t count = element_count(tensor.shape);
    if (count < 0 || static_cast<uint64_t>(count) != values) {
      throw std::invalid_argument(where + std::to_string(values) + " values for a shape of " +
                                  std::to_string(count) + " elements");
    }
    json output = {{"name", tensor.name}, {"datatype", tensor.datatype}, {"shape", tensor.shape}};
    if (binary) {
      std::string bytes = encode_binary(tensor);
      output["parameters"] = {{"binary_data_size", bytes.size()}};
      binary_part += bytes;
    } else {
      json data = std::visit([](const auto& v) { return json(v); }, tensor.data);
      if (tensor.datatype == "BOOL") {
        for (json& value : data) value = value.get<int64_t>() != 0;
      }
      output["data"] = std::move(data);
    }
    out.push_back(std::move(output));
  }
  answer["outputs"] = std::move(out);
  std::string text = answer.dump(-1, ' ', false, json::error_handler_t::replace);
  if (!binary) return Response{"application/json", std::move(text)};
  Response response{"application/octet-stream", text + binary_part};
  response.inference_header_bytes = text.size();
  return response;
}

}  // namespace hiber::function
