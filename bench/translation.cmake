# Block address translation (docs/perf.md, "memory: pools and block translation"): pointer
# lookup, kernel-argument translation, map plans, and applying a plan on the simulated GPU.
add_executable(translation_bench translation_bench.cc)
target_link_libraries(translation_bench PRIVATE hiber_memory hiber_bench_models hiber_device
                      benchmark::benchmark)
