// A test-only function worker on the C++ SDK (router_function_sdk_test.cc drives it;
// router_test_worker.py is its Python twin). By the request's content type:
//   application/x-test-error    answers the error message <body>
//   application/x-test-throw    throws std::runtime_error(<body>)
//   application/x-test-client-error
//                               throws ClientError(<body>, 422): the client's mistake
//   application/x-test-barrier  waits until <body> requests (a decimal count) are inside the
//                               handler at once, then answers "together"; after 60 s without
//                               them it answers the error "barrier timed out", so a worker that
//                               runs requests one at a time fails the test instead of hanging
//   application/x-test-file-barrier
//                               the barrier across processes: <body> is "<dir> <count>"; it
//                               writes a file named by its pid into <dir> and waits until <dir>
//                               holds <count> files (several workers inside their handlers at
//                               once), then answers "together"; "barrier timed out" after 60 s
//   application/x-test-hold     holds the request <body> ms (sleeps) and answers "held": a
//                               request that keeps its GPU lease that long, as a kernel of
//                               that length would (scripts/instances-bench.sh)
//   application/x-test-deadline answers the request's deadline in ms, or "none"
//   application/x-test-pid      answers the worker's process id (tests kill it)
//   application/x-test-alloc    allocates <body> MiB of device memory with cuMemAlloc and keeps
//                               it (the request's: a function's model is what it allocated
//                               before its first request); answers "allocated <n> MiB" (an
//                               error without the shim preloaded)
// With HIBER_TEST_MODEL_MIB=<n> it allocates its model of n MiB at start-up, before serving.
//   ...; x-test=kserve          answers a KServe v2 response whose outputs are its inputs (the
//                               SDK's parse_inputs and outputs_response, with the request's id,
//                               as functions do), in binary form when the request asks for it;
//                               a request it cannot read is a ClientError (400). With
//                               HIBER_TEST_KSERVE=1 in its environment, so are application/json
//                               and binary tensor data requests: it is then a KServe model
//                               (router_conformance_test)
//   anything else               echoes the body with its content type (and its
//                               inference_header_bytes, when set)
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>

#include "router/function_sdk.h"

namespace {

using hiber::function::Request;
using hiber::function::Response;

std::mutex barrier_mutex;
std::condition_variable barrier_changed;
int barrier_arrived = 0;

// cuMemAlloc of the preloaded shim, found at run time: the worker links no CUDA library.
std::variant<Response, std::string> allocate(const std::string& mib_text) {
  using CuMemAlloc = int (*)(unsigned long long*, size_t);
  auto cu_mem_alloc = reinterpret_cast<CuMemAlloc>(::dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  if (cu_mem_alloc == nullptr) return std::string("no cuMemAlloc: the shim is not preloaded");
  const size_t mib = std::stoul(mib_text);
  unsigned long long pointer = 0;  // kept: the allocation is the model
  if (const int result = cu_mem_alloc(&pointer, mib << 20); result != 0) {
    return "cuMemAlloc failed (CUresult " + std::to_string(result) + ")";
  }
  return Response{"text/plain", "allocated " + std::to_string(mib) + " MiB"};
}

std::variant<Response, std::string> handle(const Request& request) {
  if (request.content_type == "application/x-test-error") return request.body;
  if (request.content_type == "application/x-test-throw") throw std::runtime_error(request.body);
  if (request.content_type == "application/x-test-client-error") {
    throw hiber::function::ClientError(request.body, 422);
  }
  if (request.content_type == "application/x-test-deadline") {
    return Response{"text/plain",
                    request.deadline ? std::to_string(request.deadline->count()) : "none"};
  }
  if (request.content_type == "application/x-test-pid") {
    return Response{"text/plain", std::to_string(::getpid())};
  }
  if (request.content_type == "application/x-test-alloc") return allocate(request.body);
  static const bool kserve_model = std::getenv("HIBER_TEST_KSERVE") != nullptr;
  const bool kserve_request = request.content_type.rfind("application/json", 0) == 0 ||
                              request.inference_header_bytes.has_value();
  if (request.content_type.find("; x-test=kserve") != std::string::npos ||
      (kserve_model && kserve_request)) {
    auto inputs = hiber::function::parse_inputs(request);
    if (auto* problem = std::get_if<std::string>(&inputs)) {
      throw hiber::function::ClientError(*problem);
    }
    return hiber::function::outputs_response(std::get<std::vector<hiber::function::Tensor>>(inputs),
                                             request.id, "test",
                                             hiber::function::wants_binary_outputs(request));
  }
  if (request.content_type == "application/x-test-hold") {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stol(request.body)));
    return Response{"text/plain", "held"};
  }
  if (request.content_type == "application/x-test-file-barrier") {
    std::istringstream words(request.body);
    std::string dir;
    size_t needed = 0;
    if (!(words >> dir >> needed)) throw hiber::function::ClientError("want \"<dir> <count>\"");
    std::ofstream(dir + "/" + std::to_string(::getpid())) << "here\n";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      const auto entries = std::filesystem::directory_iterator(dir);
      if (static_cast<size_t>(std::distance(begin(entries), end(entries))) >= needed) break;
      if (std::chrono::steady_clock::now() >= deadline) return std::string("barrier timed out");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Response{"text/plain", "together"};
  }
  if (request.content_type == "application/x-test-barrier") {
    const int needed = std::stoi(request.body);
    std::unique_lock<std::mutex> lock(barrier_mutex);
    ++barrier_arrived;
    barrier_changed.notify_all();
    if (!barrier_changed.wait_for(lock, std::chrono::seconds(60),
                                  [&] { return barrier_arrived >= needed; })) {
      return std::string("barrier timed out");
    }
    return Response{"text/plain", "together"};
  }
  return Response{request.content_type, request.body, request.inference_header_bytes};
}

}  // namespace

int main() {
  // HIBER_TEST_MODEL_MIB: a model allocated at start-up, before the first request, as a real
  // function loads its weights (an allocation made inside a request is that request's scratch).
  if (const char* mib = std::getenv("HIBER_TEST_MODEL_MIB"); mib != nullptr && *mib != '\0') {
    auto loaded = allocate(mib);
    if (auto* problem = std::get_if<std::string>(&loaded)) {
      std::fprintf(stderr, "hiber_router_test_worker: %s\n", problem->c_str());
      return 1;
    }
  }
  return hiber::function::serve(handle);
}
