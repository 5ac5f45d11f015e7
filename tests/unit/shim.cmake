# The shim's pieces that need neither the toolkit nor hiberd.
hiber_test(range_allocator_test LABEL unit
  SOURCES range_allocator_test.cc ${PROJECT_SOURCE_DIR}/client_shim/range_allocator.cc)

# One device state per thread (client_shim/thread_context.h); CUcontext is cuda.h's type.
if(HIBER_HAVE_CUDA)
  hiber_test(thread_context_test LABEL unit
    SOURCES thread_context_test.cc ${PROJECT_SOURCE_DIR}/client_shim/thread_context.cc)
  target_include_directories(thread_context_test PRIVATE ${HIBER_CUDA_INCLUDE_DIR})
endif()
