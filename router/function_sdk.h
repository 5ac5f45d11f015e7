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
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace hiber::function {

struct Request {
  std::string id;            // the invocation's id (X-Request-Id)
  std::string content_type;  // "application/json" (a KServe request) or the caller's type
  std::string body;
  // Time left to answer when the router sent the request; none when the caller set none.
  std::optional<std::chrono::milliseconds> deadline;
};

struct Response {
  std::string content_type = "application/json";
  std::string body;
};

// A handler returns its answer, or an error message (the router answers 500 with it).
using Handler = std::function<std::variant<Response, std::string>(const Request&)>;

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

// A KServe v2 JSON answer {"model_name"?, "id"?, "outputs": [...]} (empty strings are left
// out). Throws std::invalid_argument for a tensor whose data alternative does not match its
// datatype or whose element count is not its shape's product: a handler that lets it escape
// answers an error.
Response outputs_response(const std::vector<Tensor>& outputs, const std::string& id = "",
                          const std::string& model_name = "");

}  // namespace hiber::function
