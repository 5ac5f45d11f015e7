# Unit tests of wire/. Each runs in seconds, and under ThreadSanitizer (HIBER_SANITIZE=thread).
foreach(part doorbell ring message batch_builder call_table control_codec socket_frame handshake
    channel)
  hiber_test(wire_${part}_test LABEL unit SOURCES wire_${part}_test.cc LIBS hiber_wire TIMEOUT 120)
endforeach()
# The connect deadline against a listener whose queue is full (tests/integration/wedged_listener.h).
target_link_libraries(wire_channel_test PRIVATE hiber_wedged_listener)
