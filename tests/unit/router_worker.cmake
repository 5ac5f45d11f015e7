# Unit tests of router/'s worker side: the worker protocol's frames and the function SDKs
# (C++ and Python) as real worker processes on a real Unix socket.
hiber_test(router_worker_protocol_test LABEL unit TIMEOUT 60
  SOURCES router_worker_protocol_test.cc LIBS hiber_worker_protocol)

# A test-only worker built on the C++ SDK: echo, plus requests that fail, throw or wait for
# others (router_test_worker.py is its Python twin).
add_executable(hiber_router_test_worker router_test_worker.cc)
target_link_libraries(hiber_router_test_worker PRIVATE hiber_function_sdk)

hiber_test(router_function_sdk_test LABEL unit TIMEOUT 120
  SOURCES router_function_sdk_test.cc LIBS hiber_worker_protocol hiber_function_sdk)
target_compile_definitions(router_function_sdk_test PRIVATE
  HIBER_ECHO_WORKER="$<TARGET_FILE:hiber-echo-worker>"
  HIBER_TEST_WORKER="$<TARGET_FILE:hiber_router_test_worker>")
add_dependencies(router_function_sdk_test hiber-echo-worker hiber_router_test_worker)

hiber_test(router_kserve_tensors_test LABEL unit TIMEOUT 60
  SOURCES router_kserve_tensors_test.cc LIBS hiber_function_sdk nlohmann_json::nlohmann_json)

# The router's registry and node addresses.
hiber_test(router_registry_test LABEL unit TIMEOUT 60
  SOURCES router_registry_test.cc LIBS hiber_router)

# The Open Inference Protocol's tensors: declarations and JSON requests checked against them.
hiber_test(router_inference_request_test LABEL unit TIMEOUT 60
  SOURCES router_inference_request_test.cc LIBS hiber_router)
