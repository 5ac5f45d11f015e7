// Found only through the RUNPATH of librpath_caller.so (tests/shim/rpath/CMakeLists.txt).
extern "C" __attribute__((visibility("default"))) int hiber_rpath_target_value() { return 4242; }
