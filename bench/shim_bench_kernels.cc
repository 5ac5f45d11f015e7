// Host implementations of the kernels in shim_bench.cu, for the simulated GPU
// (server/device/sim_kernel_plugin.h): built as the kernel plugin hiber_shim_bench_kernels,
// which scripts/shim-bench.sh gives hiberd --device=sim with --sim_kernel_plugins.
//
// The benchmark measures what a launch costs the client and the channel, so the kernels do no
// work here: both return at once, as shim_bench_params does on a GPU for the arguments the
// benchmark passes (n = 0). The mangled names must not collide with other plugins' (hiberd
// refuses a kernel registered twice).

#include "server/device/sim_kernel_plugin.h"

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE

// shim_bench_empty()
int empty(const HiberSimLaunch* l) { return l->param_count == 0 ? kSuccess : kInvalidValue; }

// shim_bench_params(float* p, int n, float a): with n = 0 no thread writes.
int params(const HiberSimLaunch* l) { return l->param_count == 3 ? kSuccess : kInvalidValue; }

const HiberSimKernel kKernels[] = {
    {"_Z16shim_bench_emptyv", empty},
    {"_Z17shim_bench_paramsPfif", params},
};

}  // namespace

HIBER_SIM_KERNELS_V1(kKernels)
