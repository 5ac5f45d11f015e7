# hiber-sim's speed: an hour of a trace through one node and through clusters (docs/perf.md,
# "hiber-sim: speed").
if(TARGET hiber_sim)
  add_executable(sim_bench sim_bench.cc)
  target_link_libraries(sim_bench PRIVATE hiber_sim benchmark::benchmark)
endif()
