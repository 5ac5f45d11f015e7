# memory/'s GPU pools (docs/perf.md, "memory: pools and block translation"): allocate-and-free
# latency of buddy, Block and Naive, and model churn with the paper's Table 4 models.
add_library(hiber_bench_models STATIC memory_models.cc)
target_include_directories(hiber_bench_models PUBLIC ${PROJECT_SOURCE_DIR})

add_executable(memory_alloc_bench memory_alloc_bench.cc)
target_link_libraries(memory_alloc_bench PRIVATE hiber_memory benchmark::benchmark)

add_executable(memory_churn_bench memory_churn_bench.cc)
target_link_libraries(memory_churn_bench PRIVATE hiber_memory hiber_bench_models hiber_cli
                      benchmark::benchmark)
