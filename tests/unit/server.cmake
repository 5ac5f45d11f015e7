# Unit tests of server/.
hiber_test(staging_tracker_test LABEL unit SOURCES staging_tracker_test.cc LIBS hiber_server)
hiber_test(queue_meter_test LABEL unit SOURCES queue_meter_test.cc LIBS hiber_server)
hiber_test(auth_test LABEL unit SOURCES auth_test.cc LIBS hiber_server)
hiber_test(io_loop_test LABEL unit SOURCES io_loop_test.cc LIBS hiber_server)
hiber_test(module_cache_test LABEL unit SOURCES module_cache_test.cc LIBS hiber_server)
hiber_test_uses_kernel_images(module_cache_test)
hiber_test(model_repository_test LABEL unit SOURCES model_repository_test.cc LIBS hiber_server)
hiber_test(session_store_test LABEL unit SOURCES session_store_test.cc LIBS hiber_server)
hiber_test(function_memory_test LABEL unit SOURCES function_memory_test.cc LIBS hiber_server)
hiber_test(handle_table_test LABEL unit SOURCES handle_table_test.cc LIBS hiber_server)
hiber_test(context_pool_test LABEL unit SOURCES context_pool_test.cc LIBS hiber_server)
hiber_test(swap_engine_test LABEL unit SOURCES swap_engine_test.cc LIBS hiber_server)
hiber_test(library_calls_test LABEL unit SOURCES library_calls_test.cc LIBS hiber_server)
# cuDNN remoting: graph codec, the session's checks, the simulated GPU's host implementations.
hiber_test(dnn_test LABEL unit SOURCES dnn_test.cc LIBS hiber_server)
# server/metrics.h: a hand-built NodeStatus to metric families.
hiber_test(metrics_test LABEL unit SOURCES metrics_test.cc LIBS hiber_server)
