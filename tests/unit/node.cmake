# Unit tests of node/: the node core driven with scripted events, checked by its actuator calls.
hiber_test(node_core_test LABEL unit SOURCES node_core_test.cc LIBS hiber_node)
