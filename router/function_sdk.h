// The C++ function SDK: the worker side of the worker protocol (docs/router.md, "Workers").
//
// A function is a program that calls serve() with a handler; hiber-router starts it with
// $HIBER_WORKER_SOCKET set and sends it requests (or a container runtime starts it, and it
// attaches to the router by itself). Depends only on the C++ standard library and
// POSIX in this header (C++17, so nvcc-built CUDA programs include it), and links nothing but
// hiber_worker_protocol, hiber_status and the standard library: no logging or flag library.
//
//   #include "router/function_sdk.h"
//   int main() {
//     return hiber::function::serve([](const hiber::function::Request& request)
//         -> std::variant<hiber::function::Response, std::string> {
//       return hiber::function::Response{request.content_type, request.body};
//     });
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace hiber::function {

struct Request {
  std::string id;            // the invocation's id (X-Request-Id)
  std::string content_type;  // "application/json" (a KServe request) or the caller's type
  std::string body;
  // Time left to answer when the router sent the request; none when the caller set none.
  std::optional<std::chrono::milliseconds> deadline;
  // Set for a request in the binary tensor data extension: the body's first this many bytes
  // are the JSON request, its tensors' bytes follow (parse_inputs(Request) reads both).
  std::optional<uint64_t> inference_header_bytes;
};

struct Response {
  Response() = default;
  // A constructor, not an aggregate: Response{type, body} stays warning-free under -Wextra in
  // functions' own builds as fields are added.
  Response(std::string type, std::string text, std::optional<uint64_t> header_bytes = std::nullopt)
      : content_type(std::move(type)),
        body(std::move(text)),
        inference_header_bytes(header_bytes) {}

  std::string content_type = "application/json";
  std::string body;
  // Set for an answer in the binary tensor data extension (outputs_response(..., binary)):
  // the router sends it as the Inference-Header-Content-Length header.
  std::optional<uint64_t> inference_header_bytes;
};

// A handler returns its answer, or an error message (the router answers 500 with it).
using Handler = std::function<std::variant<Response, std::string>(const Request&)>;

// Thrown by a handler for a request that is the client's mistake (a missing field, a value out
// of range): the router answers `status` (400 to 499) with the message, and counts the request
// as rejected, not as the function's failure. Any other exception, or a returned error string,
// is the function's own failure (500).
class ClientError : public std::runtime_error {
 public:
  explicit ClientError(const std::string& message, unsigned status = 400)
      : std::runtime_error(message), status_(status >= 400 && status < 500 ? status : 400) {}
  unsigned status() const { return status_; }

 private:
  unsigned status_;
};

// Connects to $HIBER_WORKER_SOCKET (a Unix socket's path, or tcp:HOST:PORT), says hello and
// serves invokes until the router closes the connection (returns 0) or the protocol breaks
// (prints why on stderr and returns nonzero: 2 when the environment is wrong, 3 for a connection
// or protocol failure). With $HIBER_WORKER_TOKEN_FILE set it is an attached worker
// (docs/router.md, "Attached workers"): it retries until the router is up and attaches again
// whenever the connection ends, returning only for the failures above. Up to
// $HIBER_CONCURRENCY requests (default 1) run at once, each on its own thread; with 1 the
// handler runs on the calling thread. A handler that throws answers an error with the
// exception's message, and the worker keeps serving. Call it once per process.
int serve(const Handler& handler);

// ---- KServe v2 JSON tensors ----

// One tensor of a KServe v2 JSON request or answer. `data` is flat, in row-major order, and
// holds the alternative its datatype maps to:
//   FP32, FP16                                        std::vector<float>
//   FP64                                              std::vector<double>
//   INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, BOOL   std::vector<int64_t>
//   BYTES                                             std::vector<std::string>
struct Tensor {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::variant<std::vector<float>, std::vector<double>, std::vector<int64_t>,
               std::vector<std::string>>
      data;
};

// The "inputs" of a KServe v2 JSON inference request (nested "data" arrays are flattened), or
// an error message: not a JSON object, no "inputs" array, an unsupported datatype, a value that
// does not fit it, or an element count that is not the shape's product.
std::variant<std::vector<Tensor>, std::string> parse_inputs(std::string_view json_body);

// The same for a request as the router sent it: JSON, or the binary tensor data extension
// (inputs with "parameters": {"binary_data_size": n} read from the bytes after the JSON:
// little-endian, FP16 widened to float, BYTES elements each after a 4-byte length).
std::variant<std::vector<Tensor>, std::string> parse_inputs(const Request& request);

// Whether the request asks for its outputs in binary form: "parameters":
// {"binary_data_output": true}, or "binary_data": true in a requested output's parameters.
bool wants_binary_outputs(const Request& request);

// A KServe v2 answer {"model_name"?, "id"?, "outputs": [...]} (empty strings are left out):
// JSON, or with `binary` in the binary tensor data extension (every output's values after the
// JSON, "binary_data_size" in its parameters). Throws std::invalid_argument for a tensor whose
// data alternative does not match its datatype or whose element count is not its shape's
// product: a handler that lets it escape answers an error.
Response outputs_response(const std::vector<Tensor>& outputs, const std::string& id = "",
                          const std::string& model_name = "", bool binary = false);

}  // namespace hiber::function
