# Unit tests of scheduler/ (topology, placement, heaviness, eviction, queueing, the facade).
set(hiber_scheduler_tests topology placement heaviness function_table eviction queue gshare facade fuzz
  admission prewarm
  interference sharing
  cluster_balancer)
foreach(topic IN LISTS hiber_scheduler_tests)
  hiber_test(scheduler_${topic}_test LABEL unit SOURCES scheduler_${topic}_test.cc LIBS hiber_scheduler)
endforeach()
