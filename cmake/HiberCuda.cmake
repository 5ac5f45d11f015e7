# The CUDA toolkit is optional at build time.
#
# Where nvcc, cuda.h and the libcuda stub are found (as under /usr/local/cuda on our machines),
# the CUDA Driver API device backend and the nvcc-compiled test programs are built. The backend
# opens libcuda.so.1 with dlopen at run time, so every binary still starts on a machine with no
# driver and reports "no GPU" instead of failing to load.
option(HIBER_ENABLE_CUDA "Build CUDA parts where the toolkit is found" ON)
set(HIBER_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root")

set(HIBER_HAVE_CUDA OFF)
if(HIBER_ENABLE_CUDA)
  find_program(HIBER_NVCC nvcc HINTS ${HIBER_CUDA_ROOT}/bin NO_CACHE)
  find_path(HIBER_CUDA_INCLUDE_DIR cuda.h HINTS ${HIBER_CUDA_ROOT}/include NO_CACHE)
  find_library(HIBER_CUDA_STUB cuda HINTS ${HIBER_CUDA_ROOT}/lib64/stubs ${HIBER_CUDA_ROOT}/lib/stubs
               ${HIBER_CUDA_ROOT}/targets/x86_64-linux/lib/stubs NO_DEFAULT_PATH NO_CACHE)
  if(HIBER_NVCC AND HIBER_CUDA_INCLUDE_DIR AND HIBER_CUDA_STUB)
    set(HIBER_HAVE_CUDA ON)
  endif()
endif()

# The ABI Hiber serves: CUDA's major version names libcudart.so.N, libcublas.so.N and
# libcublasLt.so.N and their version nodes, cuDNN's names libcudnn.so.N. Every soname the shim
# exports, accepts in a dlopen and hiberd opens comes from these two (common/cuda_abi.h.in, the
# shim's link options and version scripts). They default to the toolkit's, and must match it
# where one is found: a shim built against one ABI's headers cannot serve another's.
set(_hiber_toolkit_cuda_major 13)
set(_hiber_toolkit_cudnn_major 9)
if(HIBER_HAVE_CUDA)
  file(STRINGS ${HIBER_CUDA_INCLUDE_DIR}/cuda.h _hiber_line REGEX "^#define CUDA_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CUDA_VERSION ([0-9]+).*" "\\1" _hiber_version "${_hiber_line}")
  math(EXPR _hiber_toolkit_cuda_major "${_hiber_version} / 1000")
  if(EXISTS ${HIBER_CUDA_INCLUDE_DIR}/cudnn_version.h)
    file(STRINGS ${HIBER_CUDA_INCLUDE_DIR}/cudnn_version.h _hiber_line
         REGEX "^#define CUDNN_MAJOR [0-9]+")
    string(REGEX REPLACE "^#define CUDNN_MAJOR ([0-9]+).*" "\\1" _hiber_toolkit_cudnn_major
           "${_hiber_line}")
  endif()
endif()
set(HIBER_CUDA_MAJOR ${_hiber_toolkit_cuda_major} CACHE STRING
    "CUDA major version whose ABI the shim serves (libcudart.so.N); the toolkit's by default")
set(HIBER_CUDNN_MAJOR ${_hiber_toolkit_cudnn_major} CACHE STRING
    "cuDNN major version whose ABI the shim serves (libcudnn.so.N); the toolkit's by default")
if(HIBER_HAVE_CUDA AND NOT HIBER_CUDA_MAJOR EQUAL _hiber_toolkit_cuda_major)
  message(FATAL_ERROR "HIBER_CUDA_MAJOR is ${HIBER_CUDA_MAJOR}, but the toolkit under "
          "${HIBER_CUDA_ROOT} is CUDA ${_hiber_toolkit_cuda_major}: point HIBER_CUDA_ROOT at a "
          "CUDA ${HIBER_CUDA_MAJOR} toolkit, or drop the setting")
endif()
if(HIBER_HAVE_CUDA AND NOT HIBER_CUDNN_MAJOR EQUAL _hiber_toolkit_cudnn_major)
  message(FATAL_ERROR "HIBER_CUDNN_MAJOR is ${HIBER_CUDNN_MAJOR}, but the toolkit's headers are "
          "cuDNN ${_hiber_toolkit_cudnn_major}'s")
endif()
set(HIBER_CUDART_SONAME libcudart.so.${HIBER_CUDA_MAJOR})
set(HIBER_CUBLAS_SONAME libcublas.so.${HIBER_CUDA_MAJOR})
set(HIBER_CUBLASLT_SONAME libcublasLt.so.${HIBER_CUDA_MAJOR})
set(HIBER_CUDNN_SONAME libcudnn.so.${HIBER_CUDNN_MAJOR})

if(HIBER_HAVE_CUDA)
  message(STATUS "CUDA toolkit found (${HIBER_NVCC}): building the CUDA device backend and the nvcc-compiled test programs")
else()
  message(STATUS "CUDA toolkit not found under HIBER_CUDA_ROOT=${HIBER_CUDA_ROOT} (need nvcc, cuda.h and the libcuda stub): skipping the CUDA device backend and the nvcc-compiled test programs")
endif()

# For CUDA programs built by nvcc as a user would build them (tests/shim, bench/shim_bench):
#   HIBER_PROGRAM_GENCODE      real architectures only, so no JIT on the GPUs we run on: sm_80
#                              and sm_90 cubins, and compute_80 PTX for anything newer;
#   HIBER_CUDART_RPATH_FLAGS   a RUNPATH to the toolkit's libcudart.so.13 (the preloaded shim
#                              answers in its place; natively, the real runtime loads).
if(HIBER_HAVE_CUDA)
  set(HIBER_PROGRAM_GENCODE
    -gencode arch=compute_80,code=[sm_80,compute_80] -gencode arch=compute_90,code=sm_90)
  find_library(HIBER_CUDART cudart
    HINTS ${HIBER_CUDA_ROOT}/lib64 ${HIBER_CUDA_ROOT}/targets/x86_64-linux/lib
    NO_DEFAULT_PATH NO_CACHE)
  set(HIBER_CUDART_RPATH_FLAGS "")
  if(HIBER_CUDART)
    get_filename_component(_hiber_cudart_dir ${HIBER_CUDART} DIRECTORY)
    set(HIBER_CUDART_RPATH_FLAGS -Xlinker=-rpath,${_hiber_cudart_dir})
  endif()
endif()

# hiber_nvcc_fatbin(<out_var> <source.cu> [NAME stem] [OPTIONS ...] [DEPENDS headers...])
# Compiles one .cu file to a fatbin with nvcc and sets <out_var> to the output path. DEPENDS
# names the headers the source includes, so editing them rebuilds the fatbin.
# The default targets cover the machines we run on (Ampere, Hopper) plus PTX for newer GPUs.
function(hiber_nvcc_fatbin out_var source)
  cmake_parse_arguments(F "" "NAME" "OPTIONS;DEPENDS" ${ARGN})
  get_filename_component(stem ${source} NAME_WE)
  if(F_NAME)
    set(stem ${F_NAME})
  endif()
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${stem}.fatbin)
  if(NOT F_OPTIONS)
    set(F_OPTIONS -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90])
  endif()
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${HIBER_NVCC} -fatbin ${F_OPTIONS} -o ${out} ${CMAKE_CURRENT_SOURCE_DIR}/${source}
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${source} ${F_DEPENDS}
    COMMENT "nvcc -fatbin ${source}"
    VERBATIM)
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
