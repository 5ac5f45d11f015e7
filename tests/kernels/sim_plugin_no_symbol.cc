// A shared library that is not a kernel plugin: it lacks hiber_sim_kernels_v1. For the
// simulated device's plugin-loading tests.
extern "C" __attribute__((visibility("default"))) int hiber_not_a_plugin() { return 0; }
