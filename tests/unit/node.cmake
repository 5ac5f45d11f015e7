# Unit tests of node/: the node core driven with scripted events, checked by its actuator calls.
hiber_test(node_core_test LABEL unit SOURCES node_core_test.cc LIBS hiber_node)
# One workload through the core with hiberd's actuator and with the simulator's.
hiber_test(node_core_actuators_test LABEL unit SOURCES node_core_actuators_test.cc
           LIBS hiber_server hiber_sim)
