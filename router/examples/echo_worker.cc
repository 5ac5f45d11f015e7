// hiber-echo-worker: the no-op function. It answers each request's body unchanged, with the
// request's content type; benchmarks use it to measure the router and the worker protocol
// alone, and tests to check that bytes pass through exactly.
#include <cstdio>
#include <cstring>
#include <string>
#include <variant>

#include "router/function_sdk.h"

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf(
        "usage: %s\n  A function worker that answers every request's body unchanged. "
        "hiber-router starts it\n  with HIBER_WORKER_SOCKET and HIBER_CONCURRENCY set "
        "(docs/router.md, \"Workers\").\n",
        argv[0]);
    return 0;
  }
  return hiber::function::serve([](const hiber::function::Request& request)
                                    -> std::variant<hiber::function::Response, std::string> {
    return hiber::function::Response{request.content_type, request.body};
  });
}
