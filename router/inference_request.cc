#include "router/inference_request.h"

#include <algorithm>
#include <limits>
#include <set>

namespace hiber::router {
namespace {

using nlohmann::json;

// The largest element count the router accepts in a shape (its body limit is far below).
constexpr int64_t kMaxElements = int64_t{1} << 40;

struct Datatype {
  const char* name;
  enum Kind { kBool, kSigned, kUnsigned, kFloat, kBytes } kind;
  int bits;  // of one element in binary form; 0 for BYTES
};

constexpr Datatype kDatatypes[] = {
    {"BOOL", Datatype::kBool, 8},        {"UINT8", Datatype::kUnsigned, 8},
    {"UINT16", Datatype::kUnsigned, 16}, {"UINT32", Datatype::kUnsigned, 32},
    {"UINT64", Datatype::kUnsigned, 64}, {"INT8", Datatype::kSigned, 8},
    {"INT16", Datatype::kSigned, 16},    {"INT32", Datatype::kSigned, 32},
    {"INT64", Datatype::kSigned, 64},    {"FP16", Datatype::kFloat, 16},
    {"FP32", Datatype::kFloat, 32},      {"FP64", Datatype::kFloat, 64},
    {"BYTES", Datatype::kBytes, 0}};

const Datatype* find_datatype(std::string_view name) {
  for (const Datatype& d : kDatatypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// Whether one JSON value is a value of `type`.
bool holds(const json& value, const Datatype& type) {
  switch (type.kind) {
    case Datatype::kBool: return value.is_boolean();
    case Datatype::kFloat: return value.is_number();
    case Datatype::kBytes: return value.is_string();
    case Datatype::kUnsigned:
      if (!value.is_number_integer()) return false;
      if (value.is_number_unsigned()) {
        return type.bits == 64 || value.get<uint64_t>() < (uint64_t{1} << type.bits);
      }
      return value.get<int64_t>() >= 0 &&
             (type.bits == 64 || value.get<int64_t>() < (int64_t{1} << type.bits));
    case Datatype::kSigned: {
      if (!value.is_number_integer()) return false;
      if (value.is_number_unsigned()) {
        return value.get<uint64_t>() <=
               static_cast<uint64_t>(std::numeric_limits<int64_t>::max() >> (64 - type.bits));
      }
      const int64_t v = value.get<int64_t>();
      if (type.bits == 64) return true;
      const int64_t limit = int64_t{1} << (type.bits - 1);
      return v >= -limit && v < limit;
    }
  }
  return false;
}

// Counts the values of `data` (nested arrays flattened), stopping at the first that is not of
// `type`. Returns the count, or none with `bad` set.
std::optional<int64_t> count_values(const json& data, const Datatype& type, std::string& bad) {
  if (!data.is_array()) {
    if (holds(data, type)) return 1;
    bad = data.dump();
    return std::nullopt;
  }
  int64_t n = 0;
  for (const json& item : data) {
    std::optional<int64_t> inner = count_values(item, type, bad);
    if (!inner) return std::nullopt;
    n += *inner;
  }
  return n;
}

Status shape_error(std::string_view where, std::string_view what) {
  return error(ErrorCode::kInvalidValue, where, ": ", what);
}

// A shape: an array of integers, each >= `lowest`. Returns the element count (with -1 dims
// counting as 1).
Result<int64_t> read_shape(const json& shape, int64_t lowest, std::string_view where,
                           std::vector<int64_t>& out) {
  if (!shape.is_array()) return shape_error(where, "\"shape\" must be an array of integers");
  int64_t elements = 1;
  for (const json& dim : shape) {
    if (!dim.is_number_integer() ||
        (dim.is_number_unsigned() && dim.get<uint64_t>() > kMaxElements)) {
      return shape_error(where, "\"shape\" must hold integers, got " + dim.dump());
    }
    const int64_t d = dim.get<int64_t>();
    if (d < lowest) {
      return shape_error(where, str_cat("\"shape\" has the dimension ", d,
                                        lowest == 0 ? " (dimensions are 0 or more)"
                                                    : " (dimensions are -1 or more)"));
    }
    out.push_back(d);
    if (d > 0) {
      if (elements > kMaxElements / d) return shape_error(where, "\"shape\" is too large");
      elements *= d;
    } else if (d == 0) {
      elements = 0;
    }
  }
  return elements;
}

Result<std::string> read_name(const json& tensor, std::string_view where) {
  auto name = tensor.find("name");
  if (name == tensor.end() || !name->is_string() || name->get<std::string>().empty()) {
    return shape_error(where, "needs a \"name\" string");
  }
  return name->get<std::string>();
}

std::string shape_text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

// An input's "parameters"."binary_data_size": none when absent.
Result<std::optional<uint64_t>> binary_data_size(const json& input, std::string_view where) {
  auto parameters = input.find("parameters");
  if (parameters == input.end()) return std::optional<uint64_t>();
  if (!parameters->is_object()) return shape_error(where, "\"parameters\" must be an object");
  auto size = parameters->find("binary_data_size");
  if (size == parameters->end()) return std::optional<uint64_t>();
  if (!size->is_number_integer() || (!size->is_number_unsigned() && size->get<int64_t>() < 0)) {
    return shape_error(where, "\"binary_data_size\" must be a byte count, got " + size->dump());
  }
  return std::optional<uint64_t>(size->get<uint64_t>());
}

// Checks one input's binary data against its datatype and element count.
Status check_binary_data(std::string_view bytes, const Datatype& type, int64_t elements,
                         const std::vector<int64_t>& dims, std::string_view where) {
  if (type.kind != Datatype::kBytes) {
    const uint64_t element = static_cast<uint64_t>(type.bits / 8);
    if (bytes.size() != static_cast<uint64_t>(elements) * element) {
      return error(ErrorCode::kInvalidValue, where, ": ", bytes.size(),
                   " bytes of binary data for the shape ", shape_text(dims), " (", elements, " ",
                   type.name, " elements of ", element, " bytes)");
    }
    return Status();
  }
  int64_t count = 0;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 4) {
      return error(ErrorCode::kInvalidValue, where, ": the length of BYTES element ", count,
                   " is cut off");
    }
    uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[at + i]);
    at += 4;
    if (length > bytes.size() - at) {
      return error(ErrorCode::kInvalidValue, where, ": BYTES element ", count, " needs ", length,
                   " bytes, ", bytes.size() - at, " are left");
    }
    at += length;
    ++count;
  }
  if (count != elements) {
    return error(ErrorCode::kInvalidValue, where, ": ", count, " BYTES elements for the shape ",
                 shape_text(dims), " (", elements, " elements)");
  }
  return Status();
}

}  // namespace

std::optional<size_t> binary_element_bytes(std::string_view datatype) {
  const Datatype* type = find_datatype(datatype);
  if (type == nullptr || type->kind == Datatype::kBytes) return std::nullopt;
  return static_cast<size_t>(type->bits / 8);
}

Result<BinaryExtensionHeader> binary_extension_header(std::string_view body,
                                                      std::string_view header_bytes) {
  uint64_t length = 0;
  const bool digits = !header_bytes.empty() && header_bytes.size() <= 19 &&
                      std::all_of(header_bytes.begin(), header_bytes.end(),
                                  [](char c) { return c >= '0' && c <= '9'; });
  if (digits) {
    for (char c : header_bytes) length = length * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!digits || length > body.size()) {
    return error(ErrorCode::kInvalidValue, "Inference-Header-Content-Length must be the byte ",
                 "count of the JSON at the start of the body (at most ", body.size(), "), got \"",
                 header_bytes.substr(0, 40), "\"");
  }
  json header = json::parse(body.substr(0, length), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) {
    return error(ErrorCode::kInvalidValue, "the first ", length,
                 " bytes of the body (Inference-Header-Content-Length) are not a JSON object");
  }
  return BinaryExtensionHeader{std::move(header), length};
}

json TensorSpec::to_json() const {
  return {{"name", name}, {"datatype", datatype}, {"shape", shape}};
}

bool is_tensor_datatype(std::string_view datatype) { return find_datatype(datatype) != nullptr; }

Result<std::vector<TensorSpec>> parse_tensor_specs(const json& specs, std::string_view field) {
  const std::string where = str_cat("registration field \"", field, "\"");
  if (!specs.is_array()) return shape_error(where, "must be an array of tensors");
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  for (const json& spec : specs) {
    if (!spec.is_object()) return shape_error(where, "must hold {name, datatype, shape} objects");
    HIBER_ASSIGN_OR_RETURN(std::string name, read_name(spec, where));
    const std::string tensor = str_cat(where, ", tensor \"", name, "\"");
    for (const auto& [key, value] : spec.items()) {
      if (key != "name" && key != "datatype" && key != "shape") {
        return shape_error(tensor, str_cat("unknown field \"", key, "\""));
      }
    }
    if (!names.insert(name).second) return shape_error(tensor, "is declared twice");
    auto datatype = spec.find("datatype");
    if (datatype == spec.end() || !datatype->is_string() ||
        !is_tensor_datatype(datatype->get<std::string>())) {
      return shape_error(tensor,
                         "\"datatype\" must be one of BOOL, UINT8, UINT16, UINT32, "
                         "UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES");
    }
    auto shape = spec.find("shape");
    if (shape == spec.end()) return shape_error(tensor, "needs a \"shape\"");
    TensorSpec t{name, datatype->get<std::string>(), {}};
    HIBER_RETURN_IF_ERROR(read_shape(*shape, -1, tensor, t.shape).status());
    out.push_back(std::move(t));
  }
  return out;
}

Result<CheckedInference> check_inference_request(const json& request,
                                                 const std::vector<TensorSpec>& inputs,
                                                 const std::vector<TensorSpec>& outputs,
                                                 std::optional<std::string_view> binary) {
  const auto bad = [](auto&&... what) {
    return error(ErrorCode::kInvalidValue, std::forward<decltype(what)>(what)...);
  };
  if (!request.is_object()) return bad("the body is not a JSON object (an inference request)");
  CheckedInference checked;
  if (auto id = request.find("id"); id != request.end()) {
    if (!id->is_string()) return bad("\"id\" must be a string");
    checked.id = id->get<std::string>();
  }
  auto given = request.find("inputs");
  if (given == request.end() || !given->is_array() || given->empty()) {
    return bad("the request needs a non-empty \"inputs\" array");
  }
  if (auto parameters = request.find("parameters"); parameters != request.end()) {
    if (!parameters->is_object()) return bad("\"parameters\" must be an object");
    auto binary_output = parameters->find("binary_data_output");
    if (binary_output != parameters->end() && !binary_output->is_boolean()) {
      return bad("\"binary_data_output\" must be true or false");
    }
  }
  std::set<std::string> names;
  uint64_t binary_used = 0;
  for (const json& input : *given) {
    if (!input.is_object()) return bad("each input must be an object");
    HIBER_ASSIGN_OR_RETURN(std::string name, read_name(input, "an input"));
    const std::string where = str_cat("input \"", name, "\"");
    if (!names.insert(name).second) return bad(where, " is given twice");
    auto datatype = input.find("datatype");
    if (datatype == input.end() || !datatype->is_string()) {
      return bad(where, ": needs a \"datatype\" string");
    }
    const Datatype* type = find_datatype(datatype->get<std::string>());
    if (type == nullptr) {
      return bad(where, ": unknown datatype \"", datatype->get<std::string>(), "\"");
    }
    auto shape = input.find("shape");
    if (shape == input.end()) return bad(where, ": needs a \"shape\"");
    std::vector<int64_t> dims;
    HIBER_ASSIGN_OR_RETURN(const int64_t elements, read_shape(*shape, 0, where, dims));
    auto data = input.find("data");
    HIBER_ASSIGN_OR_RETURN(const std::optional<uint64_t> binary_size,
                           binary_data_size(input, where));
    if (binary_size) {
      if (!binary) {
        return bad(where, ": \"binary_data_size\" needs the binary tensor data extension (the ",
                   "Inference-Header-Content-Length header)");
      }
      if (data != input.end()) return bad(where, ": has both \"data\" and \"binary_data_size\"");
      if (*binary_size > binary->size() - binary_used) {
        return bad(where, ": \"binary_data_size\" is ", *binary_size, " bytes, and ",
                   binary->size() - binary_used, " bytes of binary data are left after the JSON");
      }
      HIBER_RETURN_IF_ERROR(check_binary_data(binary->substr(binary_used, *binary_size), *type,
                                              elements, dims, where));
      binary_used += *binary_size;
    } else {
      if (data == input.end()) return bad(where, ": needs \"data\"");
      std::string wrong;
      const std::optional<int64_t> values = count_values(*data, *type, wrong);
      if (!values) {
        return bad(where, ": ", wrong.size() > 40 ? wrong.substr(0, 40) + "..." : wrong,
                   " is not a ", type->name, " value");
      }
      if (*values != elements) {
        return bad(where, ": ", *values, " values for the shape ", shape_text(dims), " (", elements,
                   " elements)");
      }
    }
    if (inputs.empty()) continue;
    auto declared = std::find_if(inputs.begin(), inputs.end(),
                                 [&](const TensorSpec& t) { return t.name == name; });
    if (declared == inputs.end()) {
      std::string known;
      for (const TensorSpec& t : inputs) known += (known.empty() ? "" : ", ") + t.name;
      return bad(where, " is not an input of this function (its inputs: ", known, ")");
    }
    if (declared->datatype != type->name) {
      return bad(where, " is ", type->name, "; the function takes ", declared->datatype);
    }
    bool fits = declared->shape.size() == dims.size();
    for (size_t i = 0; fits && i < dims.size(); ++i) {
      fits = declared->shape[i] == -1 || declared->shape[i] == dims[i];
    }
    if (!fits) {
      return bad(where, " has the shape ", shape_text(dims), "; the function takes ",
                 shape_text(declared->shape), " (-1: any size)");
    }
  }
  for (const TensorSpec& t : inputs) {
    if (names.count(t.name) == 0) return bad("the input \"", t.name, "\" is missing");
  }
  if (binary && binary_used != binary->size()) {
    return bad(binary->size() - binary_used,
               " bytes of binary data after the JSON belong to no input (binary_data_size)");
  }
  if (auto requested = request.find("outputs"); requested != request.end()) {
    if (!requested->is_array()) return bad("\"outputs\" must be an array");
    for (const json& output : *requested) {
      if (!output.is_object()) return bad("each requested output must be an object");
      HIBER_ASSIGN_OR_RETURN(std::string name, read_name(output, "a requested output"));
      if (auto parameters = output.find("parameters"); parameters != output.end()) {
        auto binary_data =
            parameters->is_object() ? parameters->find("binary_data") : parameters->end();
        if (!parameters->is_object() ||
            (binary_data != parameters->end() && !binary_data->is_boolean())) {
          return bad("the output \"", name,
                     "\": \"parameters\" must be an object and \"binary_data\" true or false");
        }
      }
      if (!outputs.empty() && std::none_of(outputs.begin(), outputs.end(),
                                           [&](const TensorSpec& t) { return t.name == name; })) {
        return bad("the output \"", name, "\" is not an output of this function");
      }
    }
  }
  return checked;
}

}  // namespace hiber::router
