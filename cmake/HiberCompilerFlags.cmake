# Warnings everywhere, and the sanitizer configurations CI runs.
#
# HIBER_WERROR turns warnings into errors. The asan and tsan presets (what scripts/test.sh and CI
# build) set it, so a warning fails CI; it stays off by default so a newer compiler's new
# warnings do not stop a user's build. It covers the host code of the nvcc-built test programs
# (tests/shim) too, but not nvcc's device compilation.
#
# HIBER_SANITIZE selects instrumentation for the whole tree:
#   ""                 none (Release)
#   "address;undefined" AddressSanitizer + UndefinedBehaviorSanitizer (the CI suite)
#   "thread"           ThreadSanitizer (the threaded parts: wire, device, server)
#
# HIBER_FUZZ (the fuzz preset, clang only) adds libFuzzer's coverage instrumentation to every
# library (-fsanitize=fuzzer-no-link) and builds the harnesses of tests/fuzz, which alone link
# libFuzzer's main (-fsanitize=fuzzer).
set(HIBER_SANITIZE "" CACHE STRING "Sanitizers: empty, 'address;undefined' or 'thread'")
option(HIBER_FUZZ "Build the libFuzzer harnesses (tests/fuzz); needs clang" OFF)

option(HIBER_WERROR "Treat compiler warnings as errors" OFF)

add_compile_options(-Wall -Wextra -Wno-missing-field-initializers)
if(HIBER_WERROR)
  add_compile_options(-Werror)
endif()

if(HIBER_SANITIZE)
  if("thread" IN_LIST HIBER_SANITIZE AND "address" IN_LIST HIBER_SANITIZE)
    message(FATAL_ERROR "HIBER_SANITIZE: thread and address cannot be combined")
  endif()
  list(JOIN HIBER_SANITIZE "," _hiber_san)
  add_compile_options(-fsanitize=${_hiber_san} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${_hiber_san})
  # Sanitized builds must not carry -O3 surprises; keep frames for reports.
  add_compile_options(-g)
  if("thread" IN_LIST HIBER_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # Boost.Asio's completion handlers end with std::atomic_thread_fence, which GCC warns TSan
    # does not model (-Wtsan). hiber-router and hiber-load hand Asio's handlers to no other
    # thread: each io_context runs on one thread.
    add_compile_options(-Wno-tsan)
  endif()
endif()

if(HIBER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "HIBER_FUZZ needs clang with libFuzzer (the fuzz preset uses clang++-14; "
                        "scripts/install-deps.sh installs clang-14 and libfuzzer-14-dev)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
