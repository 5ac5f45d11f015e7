# Unit tests of memory/ (pools, buddy allocator, baselines, pinned host pool).
hiber_test(pool_allocator_test LABEL unit SOURCES pool_allocator_test.cc LIBS hiber_memory)
hiber_test(buddy_allocator_test LABEL unit SOURCES buddy_allocator_test.cc LIBS hiber_memory)
hiber_test(block_allocator_test LABEL unit SOURCES block_allocator_test.cc LIBS hiber_memory)
hiber_test(gpu_pools_test LABEL unit SOURCES gpu_pools_test.cc LIBS hiber_memory)
hiber_test(host_pool_test LABEL unit SOURCES host_pool_test.cc LIBS hiber_memory)
