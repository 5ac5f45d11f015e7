# Unit tests of hiber-load (tools/load/): its schedule and report against hand-worked values,
# and its HTTP client against an HTTP server in the test.
hiber_test(load_schedule_test LABEL unit SOURCES load_schedule_test.cc LIBS hiber_load)
hiber_test(load_summary_test LABEL unit SOURCES load_summary_test.cc LIBS hiber_load)
hiber_test(load_runner_test LABEL unit TIMEOUT 120 SOURCES load_runner_test.cc LIBS hiber_load)
