# Unit tests of common/.
hiber_test(node_config_test LABEL unit SOURCES node_config_test.cc LIBS hiber_common)
hiber_test(mailbox_test LABEL unit SOURCES mailbox_test.cc LIBS hiber_common)
hiber_test(gpu_set_test LABEL unit SOURCES gpu_set_test.cc LIBS hiber_common)

# Code images read without the driver. The nvcc-built images from tests/kernels are compiled in
# where the toolkit was present; without it those tests are compiled out.
hiber_test(fatbin_test LABEL unit SOURCES fatbin_test.cc
  LIBS hiber_fatbin PkgConfig::ZSTD PkgConfig::LZ4)
hiber_test_uses_kernel_images(fatbin_test)
