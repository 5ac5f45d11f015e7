# Script mode (cmake -P): turns a file into a C++ source holding its bytes, so a program serves
# them without files beside it. A byte array rather than a raw string literal: any content is
# safe (no delimiter to collide with, no NUL or line-ending changes).
#   cmake -DINPUT=<file> -DOUTPUT=<file.cc> -DNAMESPACE=<ns> -DNAME=<symbol> -P HiberEmbedFile.cmake
# The source defines `extern const unsigned char NAME[]` and `extern const std::size_t NAME_size`
# in NAMESPACE; the array ends with one NUL byte not counted in NAME_size.
foreach(var INPUT OUTPUT NAMESPACE NAME)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "HiberEmbedFile.cmake: -D${var}= is required")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
# 16 bytes a line, each written 0xNN.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x..," 16 line)  # CMake's regular expressions have no {n}
string(REGEX REPLACE "(${line})" "\\1\n  " bytes "${bytes}")
file(RELATIVE_PATH shown "${CMAKE_CURRENT_LIST_DIR}/.." "${INPUT}")
set(text "// Generated from ${shown} by cmake/HiberEmbedFile.cmake; do not edit.
#include <cstddef>

namespace ${NAMESPACE} {
extern const unsigned char ${NAME}[];
extern const std::size_t ${NAME}_size;
const unsigned char ${NAME}[] = {
  ${bytes}0x00};
const std::size_t ${NAME}_size = ${size};
}  // namespace ${NAMESPACE}
")
# Rewrite only on change so an unchanged input does not recompile.
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}" "${text}")
