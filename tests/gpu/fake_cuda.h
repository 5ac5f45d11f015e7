// A fake libcuda.so.1 for testing the CUDA backend's own logic on machines without a GPU.
//
// The fake (fake_libcuda.cc, built as <build>/tests/gpu/fake_cuda/libcuda.so.1) answers every
// entry point of HIBER_CUDA_DRIVER_ENTRY_POINTS through cuGetProcAddress_v2 and records what it
// was asked, so a test that loads it (by path, before the backend opens "libcuda.so.1", which
// then resolves to it by SONAME) can check the calls the backend makes: which versions it
// resolves, which context is current for each call (each stream and event remembers its own,
// cuCtxCreate/cuCtxDestroy make and end more, and cuDevicePrimaryCtxReset ends a primary
// context's streams and events and its sticky error), the access descriptors of cuMemSetAccess,
// the parameter buffer of each launch, reference counts of primary contexts. It moves no bytes
// and runs no kernels; what a real driver does is the business of the gpu-labelled tests.
//
// The fake has 2 GPUs ("Fake GPU", sm_90, 16 GiB, 48 KiB of shared memory per block by default
// and 227 KiB opted in, PCI buses 0000:1A:00.0 and 0000:1B:00.0 spelled in upper case as drivers
// do), all pairs peer-capable with NVLink-like attributes. Launches with more than 48 KiB of
// dynamic shared memory fail unless the kernel opted in on that GPU, as on a real one.
// Environment, read on the first call into the fake:
//   FAKE_CUDA_GPUS=<n>             number of GPUs (0 to test "no device")
//   FAKE_CUDA_DRIVER_VERSION=<v>   what cuDriverGetVersion reports (13000)
//   FAKE_CUDA_INIT_RESULT=<r>      what cuInit returns (0)
// Tests reach the state below with dlsym(dlopen("libcuda.so.1", RTLD_NOLOAD), "fake_cuda").
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

struct FakeCudaLaunch {
  std::string kernel;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_memory_bytes;
  int gpu;  // of the stream's context
  bool had_extra;
  std::vector<std::byte> params;
};

struct FakeCudaKernelAttribute {
  std::string kernel;
  CUfunction_attribute attribute;
  int value;
  int gpu;  // the device passed
};

struct FakeCudaCopy {
  std::string kind;  // "HtoD", "DtoH", "DtoD", "Peer", "D8", "D16", "D32"
  CUdeviceptr dst;
  CUdeviceptr src;
  size_t count;    // bytes for copies, elements for memsets
  unsigned value;  // memsets
  int gpu;         // of the stream's context
  int dst_gpu;     // Peer: the contexts given
  int src_gpu;
};

struct FakeCuda {
  std::mutex mutex;  // guards everything below; tests lock it too

  // Configuration; `p2p`, `p2p_atomics` and `granularity` may be changed between device
  // creations.
  int gpu_count = 2;
  int driver_version = 13000;
  int init_result = 0;
  bool p2p = true;
  bool p2p_atomics = true;                  // false: peers over PCIe (no native atomics)
  std::map<int, size_t> granularity;        // per GPU, where not the default 2 MiB
  CUresult callback_status = CUDA_SUCCESS;  // what stream callbacks are told
  bool events_pending = false;  // cuEventQuery answers NOT_READY: work that has not ended
  // A launch of the kernel of this (mangled) name faults its context: the launch succeeds, and
  // every later call in that context answers CUDA_ERROR_ILLEGAL_ADDRESS (sticky), as on a GPU.
  std::string faulting_kernel;

  // Observations.
  std::vector<std::pair<std::string, int>> resolved;  // cuGetProcAddress (name, version)
  std::set<unsigned long long> resolve_flags;
  std::map<int, int> primary_context_refs;    // GPU -> retain count
  std::set<std::pair<int, int>> peer_access;  // (current GPU, peer GPU) enabled
  std::vector<std::vector<CUmemAccessDesc>> set_access_calls;
  std::vector<FakeCudaLaunch> launches;
  std::vector<FakeCudaKernelAttribute> kernel_attributes;  // cuKernelSetAttribute
  int library_loads = 0;                                   // cuLibraryLoadData calls
  std::vector<FakeCudaCopy> copies;
  std::vector<int> stream_priorities;  // as passed to the driver
  std::vector<unsigned> stream_flags;
  std::vector<size_t> reserve_alignments;
  std::vector<size_t> reserve_sizes;
  std::vector<int> context_synchronizations;  // cuCtxSynchronize: the current context's GPU
  int events_destroyed = 0;
  int contexts_created = 0;  // cuCtxCreate
  int contexts_destroyed = 0;
  std::vector<int> primary_context_resets;  // cuDevicePrimaryCtxReset: the GPU
  // Calls naming a stream or event made before its context's latest reset (refused as invalid
  // handles): the backend must forget those, not use or destroy them.
  int stale_handle_calls = 0;
  // Calls that act on a stream or context while another GPU's context (or none) is current.
  std::vector<std::string> wrong_context_calls;
};

extern "C" FakeCuda* fake_cuda();
extern "C" int fake_cuda_current_gpu();
// The context current on the calling thread (an opaque pointer, null for none).
extern "C" const void* fake_cuda_current_context();
