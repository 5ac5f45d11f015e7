// A kernel plugin that collides with hiber_test_kernels_plugin: it also implements _Z4noopv,
// besides a kernel of its own. For the simulated device's duplicate-registration tests.

#include "server/device/sim_kernel_plugin.h"

namespace {

int noop_again(const HiberSimLaunch*) { return 0; }
int only_here(const HiberSimLaunch*) { return 0; }

const HiberSimKernel kKernels[] = {
    {"_Z9only_herev", only_here},
    {"_Z4noopv", noop_again},
};

}  // namespace

HIBER_SIM_KERNELS_V1(kKernels)
