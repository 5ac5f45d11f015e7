# Cap'n Proto from Debian (capnproto, libcapnp-dev). The package's CMake config provides
# CapnProto::capnp, CapnProto::capnp-json and the capnp_generate_cpp() helper.
find_package(CapnProto REQUIRED)

# hiber_capnp_library(<target> <schema>...)
# Compiles the schemas into a static library whose users include "<dir>/<name>.capnp.h".
function(hiber_capnp_library target)
  set(CAPNPC_SRC_PREFIX ${PROJECT_SOURCE_DIR})
  set(CAPNPC_OUTPUT_DIR ${PROJECT_BINARY_DIR}/generated)
  # Schemas import each other by absolute path from the repository root ("/common/...").
  set(CAPNPC_IMPORT_DIRS ${PROJECT_SOURCE_DIR})
  file(MAKE_DIRECTORY ${CAPNPC_OUTPUT_DIR})
  capnp_generate_cpp(srcs hdrs ${ARGN})
  add_library(${target} STATIC ${srcs} ${hdrs})
  target_include_directories(${target} PUBLIC ${PROJECT_BINARY_DIR}/generated)
  target_link_libraries(${target} PUBLIC CapnProto::capnp)
  # Generated code is not ours to warn about.
  target_compile_options(${target} PRIVATE -w)
endfunction()
