# scheduler/ and node/: decision latency of the Scheduler facade for every queue and eviction policy,
# against the FIFO + LRU baseline, and the same steps through the node core (docs/perf.md,
# "scheduler: decision latency").
add_executable(scheduler_bench scheduler_bench.cc)
target_link_libraries(scheduler_bench PRIVATE hiber_node hiber_scheduler benchmark::benchmark)
target_compile_definitions(scheduler_bench PRIVATE HIBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
