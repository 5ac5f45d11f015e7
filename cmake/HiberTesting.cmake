# hiber_test(<name> LABEL unit|integration|gpu SOURCES ... [LIBS ...] [TIMEOUT s])
# Each test binary runs through ctest under one label. GPU tests must skip (not fail)
# when no GPU is present; they print one line saying why.
include(GoogleTest)
function(hiber_test name)
  cmake_parse_arguments(T "" "LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LABEL MATCHES "^(unit|integration|gpu)$")
    message(FATAL_ERROR "hiber_test(${name}): LABEL must be unit, integration or gpu")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE HIBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             HIBER_BUILD_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
    # A gtest binary whose tests all skipped exits 0; ctest shows it as passed.
    ENVIRONMENT "HIBER_BUILD_DIR=${PROJECT_BINARY_DIR};HIBER_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
