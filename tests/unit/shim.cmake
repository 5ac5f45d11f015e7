# The shim's pieces that need neither the toolkit nor hiberd.
hiber_test(range_allocator_test LABEL unit
  SOURCES range_allocator_test.cc ${PROJECT_SOURCE_DIR}/client_shim/range_allocator.cc)
