// The shim's refused entry points: calls it defines with a documented refusal rather than
// remoting them (docs/shim.md). Each has a hand-written body that checks its arguments as CUDA
// does and then refuses; this list, X(name, why), is what hiber-coverage reports as "refused"
// (tools/coverage.cc) and what coverage_programs_test holds against the shim's exports. It is
// the first part of the one declaration table for every entry point (issue 30).
#pragma once

#define HIBER_SHIM_REFUSED_CALLS(X)                                  \
  X(cudaHostGetDevicePointer,                                        \
    "mapped host memory: a function's host memory is not mapped "    \
    "into GPU address space")                                        \
  X(cuMemHostGetDevicePointer_v2,                                    \
    "mapped host memory: a function's host memory is not "           \
    "mapped into GPU address space")                                 \
  X(cuModuleGetGlobal_v2,                                            \
    "__device__ variables: hiberd shares one loaded module between " \
    "functions, so a variable's storage would be shared")
