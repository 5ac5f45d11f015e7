# Unit tests of device/.

# The simulated GPU: the behavioural suite (device_contract.cc) instantiated for it, and its own
# tests. Kernel tests use tests/kernels' fatbins where the toolkit was found, and its plugin.
hiber_test(sim_device_test LABEL unit TIMEOUT 120
  SOURCES sim_device_test.cc device_contract.cc
  LIBS hiber_device hiber_common)
target_compile_definitions(sim_device_test PRIVATE
  HIBER_TEST_KERNELS_PLUGIN="$<TARGET_FILE:hiber_test_kernels_plugin>"
  HIBER_TEST_PLUGIN_NO_SYMBOL="$<TARGET_FILE:hiber_test_plugin_no_symbol>"
  HIBER_TEST_PLUGIN_DUPLICATE="$<TARGET_FILE:hiber_test_plugin_duplicate>")
add_dependencies(sim_device_test
  hiber_test_kernels_plugin hiber_test_plugin_no_symbol hiber_test_plugin_duplicate)
hiber_test_uses_kernel_images(sim_device_test)

# cuBLAS/cuBLASLt host implementations of the simulated GPU against a double reference, and
# hiberd's checks of their arguments (server/blas_checks.cc).
hiber_test(sim_blas_test LABEL unit TIMEOUT 120
  SOURCES sim_blas_test.cc
  LIBS hiber_device hiber_server hiber_common)
