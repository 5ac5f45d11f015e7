// memory_apis: the stream-ordered allocator (cudaMallocAsync, memory pools) and client virtual
// memory management (cuMemCreate, cuMemMap, ...), as PyTorch's cudaMallocAsync backend and its
// expandable segments use them, each result checked against values computed here.
//
// Usage: memory_apis
//
//   stream order   memory freed on one stream (after a long kernel writes it) and allocated
//                  again on another is not touched there before the kernel ends; pool attributes,
//                  trimming and the release threshold; a pool the program creates; exporting
//                  refused (an exportable pool or allocation is made, its export refused)
//   vmm            two allocations mapped back to back in one reservation are one range to a
//                  kernel and to copies; unmapped and mapped again the other way round, each
//                  keeps its contents; the handle is retained from its address; refusals
// cudaMemGetInfo's free bytes are the same before and after each part. Exits 3 on a mismatch.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "driver_entry.h"
#include "program_util.h"

__global__ void fill_words(unsigned* words, unsigned long long n, unsigned seed) {
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) words[i] = static_cast<unsigned>(i) * 2654435761u + seed;
}

namespace {

int g_failures = 0;

void expect_code(const char* what, int got, int want) {
  if (got == want) {
    std::printf("memory_apis: %s -> %d, as expected\n", what, got);
    return;
  }
  std::printf("memory_apis: WRONG: %s -> %d, expected %d\n", what, got, want);
  ++g_failures;
}

void fill(void* words, size_t n, unsigned seed, cudaStream_t stream) {
  fill_words<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<unsigned*>(words), n, seed);
  CUDA_CHECK(cudaGetLastError());
}

size_t check_filled(const char* what, const void* words, size_t n, unsigned seed) {
  std::vector<unsigned> got(n), want(n);
  CUDA_CHECK(cudaMemcpy(got.data(), words, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) want[i] = static_cast<unsigned>(i) * 2654435761u + seed;
  return program::count_mismatches(what, got.data(), want.data(), n);
}

size_t free_bytes() {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

uint64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t value = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(pool, attr, &value));
  return value;
}

size_t stream_order() {
  size_t mismatches = 0;
  const size_t free_at_start = free_bytes();
  cudaStream_t s1, s2;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaMemPool_t pool = nullptr, current = nullptr;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  CUDA_CHECK(cudaDeviceGetMemPool(&current, 0));
  EXPECT(pool != nullptr && pool == current);
  uint64_t keep = UINT64_MAX;  // as PyTorch sets it: nothing goes back at synchronisations
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  EXPECT(pool_attribute(pool, cudaMemPoolAttrReleaseThreshold) == UINT64_MAX);

  constexpr size_t kWords = size_t{1} << 22;  // 16 MiB: the kernel takes a while
  constexpr size_t kBytes = kWords * sizeof(unsigned);
  void* a = nullptr;
  CUDA_CHECK(cudaMallocAsync(&a, kBytes, s1));
  fill(a, kWords, 7, s1);
  CUDA_CHECK(cudaStreamSynchronize(s1));
  mismatches += check_filled("cudaMallocAsync memory", a, kWords, 7);
  EXPECT(pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent) == kBytes);
  EXPECT(pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent) >= kBytes);

  // Freed on s1 behind a kernel that writes it, allocated again on s2 and set there: s2's
  // memset must come after the kernel, or the kernel's words would show.
  fill(a, kWords, 9, s1);
  CUDA_CHECK(cudaFreeAsync(a, s1));
  void* b = nullptr;
  CUDA_CHECK(cudaMallocAsync(&b, kBytes, s2));
  CUDA_CHECK(cudaMemsetAsync(b, 0x5a, kBytes, s2));
  std::vector<unsigned char> got(kBytes);
  CUDA_CHECK(cudaMemcpyAsync(got.data(), b, kBytes, cudaMemcpyDeviceToHost, s2));
  CUDA_CHECK(cudaStreamSynchronize(s2));
  const std::vector<unsigned char> want(kBytes, 0x5a);
  mismatches += program::count_mismatches("reused on another stream", got.data(), want.data(),
                                          kBytes);
  std::printf("memory_apis: freed on one stream, %s on another\n",
              a == b ? "reused" : "not reused");
  CUDA_CHECK(cudaFreeAsync(b, s2));
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT(pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent) == 0);
  CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  EXPECT(pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent) == 0);
  EXPECT(pool_attribute(pool, cudaMemPoolAttrReservedMemHigh) >= kBytes);

  // With the default threshold (0) the pool gives its memory back at a synchronisation.
  uint64_t none = 0;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &none));
  void* c = nullptr;
  CUDA_CHECK(cudaMallocAsync(&c, 1000, s1));
  CUDA_CHECK(cudaFreeAsync(c, s1));
  CUDA_CHECK(cudaStreamSynchronize(s1));
  EXPECT(pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent) == 0);
  uint64_t high = 1;
  expect_code("cudaMemPoolSetAttribute(ReservedMemHigh, 1)",
              cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high),
              cudaErrorInvalidValue);
  (void)cudaGetLastError();

  // A pool of the program's own, and the driver's forms.
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t own = nullptr;
  CUDA_CHECK(cudaMemPoolCreate(&own, &props));
  void* d = nullptr;
  CUDA_CHECK(cudaMallocFromPoolAsync(&d, kBytes, own, s1));
  fill(d, kWords, 11, s1);
  CUDA_CHECK(cudaStreamSynchronize(s1));
  mismatches += check_filled("an own pool's memory", d, kWords, 11);
  CUDA_CHECK(cudaFreeAsync(d, s1));
  CUDA_CHECK(cudaStreamSynchronize(s1));
  CUDA_CHECK(cudaMemPoolDestroy(own));
  CUdeviceptr e = 0;
  CU_CHECK(DRV(cuMemAllocAsync)(&e, kBytes, reinterpret_cast<CUstream>(s2)));
  fill(reinterpret_cast<void*>(e), kWords, 13, s2);
  CUDA_CHECK(cudaStreamSynchronize(s2));
  mismatches += check_filled("cuMemAllocAsync memory", reinterpret_cast<void*>(e), kWords, 13);
  CU_CHECK(DRV(cuMemFreeAsync)(e, reinterpret_cast<CUstream>(s2)));
  CUDA_CHECK(cudaStreamSynchronize(s2));

  // Refusals, each followed by normal use.
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  CUDA_CHECK(cudaMemPoolCreate(&own, &props));
  int pool_fd = -1;
  expect_code("cudaMemPoolExportToShareableHandle",
              cudaMemPoolExportToShareableHandle(&pool_fd, own,
                                                 cudaMemHandleTypePosixFileDescriptor, 0),
              cudaErrorNotSupported);
  CUDA_CHECK(cudaMemPoolDestroy(own));
  cudaMemPoolPtrExportData data{};
  expect_code("cudaMemPoolExportPointer", cudaMemPoolExportPointer(&data, b), cudaErrorNotSupported);
  int on_stack = 0;
  expect_code("cudaFreeAsync(host pointer)", cudaFreeAsync(&on_stack, s1), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CUDA_CHECK(cudaStreamDestroy(s1));
  CUDA_CHECK(cudaStreamDestroy(s2));
  if (free_bytes() != free_at_start) {
    std::printf("memory_apis: WRONG: %zu bytes free after the pools, %zu before\n", free_bytes(),
                free_at_start);
    ++mismatches;
  }
  std::printf("memory_apis: stream-ordered allocation correct\n");
  return mismatches;
}

size_t vmm() {
  size_t mismatches = 0;
  const size_t free_at_start = free_bytes();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granule = 0;
  CU_CHECK(DRV(cuMemGetAllocationGranularity)(&granule, &prop,
                                              CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT(granule > 0);
  const size_t half = 2 * granule;
  CUdeviceptr base = 0;
  CU_CHECK(DRV(cuMemAddressReserve)(&base, 2 * half, 0, 0, 0));
  CUmemGenericAllocationHandle first = 0, second = 0;
  CU_CHECK(DRV(cuMemCreate)(&first, half, &prop, 0));
  CU_CHECK(DRV(cuMemCreate)(&second, half, &prop, 0));
  EXPECT(free_bytes() == free_at_start - 2 * half);
  CU_CHECK(DRV(cuMemMap)(base, half, 0, first, 0));
  CU_CHECK(DRV(cuMemMap)(base + half, half, 0, second, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_CHECK(DRV(cuMemSetAccess)(base, 2 * half, &access, 1));
  unsigned long long flags = 0;
  CU_CHECK(DRV(cuMemGetAccess)(&flags, &prop.location, base + half));
  EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  // One kernel and one copy over both allocations.
  const size_t words = 2 * half / sizeof(unsigned);
  void* range = reinterpret_cast<void*>(base);
  fill(range, words, 3, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  mismatches += check_filled("two mappings back to back", range, words, 3);

  // Mapped again the other way round: the contents go with the allocations.
  CU_CHECK(DRV(cuMemUnmap)(base, 2 * half));
  CU_CHECK(DRV(cuMemMap)(base, half, 0, second, 0));
  CU_CHECK(DRV(cuMemMap)(base + half, half, 0, first, 0));
  CU_CHECK(DRV(cuMemSetAccess)(base, 2 * half, &access, 1));
  std::vector<unsigned> got(words / 2), want(words / 2);
  CUDA_CHECK(cudaMemcpy(got.data(), reinterpret_cast<void*>(base + half), half,
                        cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < words / 2; ++i) want[i] = static_cast<unsigned>(i) * 2654435761u + 3;
  mismatches += program::count_mismatches("remapped first half", got.data(), want.data(), words / 2);
  CUDA_CHECK(cudaMemcpy(got.data(), range, half, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < words / 2; ++i) {
    want[i] = static_cast<unsigned>(i + words / 2) * 2654435761u + 3;
  }
  mismatches += program::count_mismatches("remapped second half", got.data(), want.data(), words / 2);

  CUmemGenericAllocationHandle retained = 0;
  CU_CHECK(DRV(cuMemRetainAllocationHandle)(&retained, range));
  EXPECT(retained == second);
  CU_CHECK(DRV(cuMemRelease)(retained));  // the retained reference; `second` still holds one

  // Refusals: outside every reservation, part of an allocation, exporting.
  void* plain = nullptr;
  CUDA_CHECK(cudaMalloc(&plain, half));
  CUmemGenericAllocationHandle third = 0;
  CU_CHECK(DRV(cuMemCreate)(&third, half, &prop, 0));
  expect_code("cuMemMap(a cudaMalloc address)",
              DRV(cuMemMap)(reinterpret_cast<CUdeviceptr>(plain), half, 0, third, 0),
              CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr spare = 0;
  CU_CHECK(DRV(cuMemAddressReserve)(&spare, half, 0, 0, 0));
  expect_code("cuMemMap(part of an allocation)", DRV(cuMemMap)(spare, granule, granule, third, 0),
              CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  expect_code("cuMemExportToShareableHandle",
              DRV(cuMemExportToShareableHandle)(&fd, third, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                               0),
              CUDA_ERROR_NOT_SUPPORTED);
  CUmemAllocationProp exportable = prop;
  exportable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle fourth = 0;
  CU_CHECK(DRV(cuMemCreate)(&fourth, half, &exportable, 0));
  expect_code("cuMemExportToShareableHandle(exportable)",
              DRV(cuMemExportToShareableHandle)(&fd, fourth,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_NOT_SUPPORTED);
  CU_CHECK(DRV(cuMemRelease)(fourth));
  (void)cudaGetLastError();
  // The refusals left the rest working: the range still reads right, and all of it goes back.
  mismatches += check_filled("after the refusals", reinterpret_cast<void*>(base + half),
                             words / 2, 3);
  CU_CHECK(DRV(cuMemRelease)(third));
  CU_CHECK(DRV(cuMemAddressFree)(spare, half));
  CUDA_CHECK(cudaFree(plain));
  CU_CHECK(DRV(cuMemUnmap)(base, 2 * half));
  CU_CHECK(DRV(cuMemRelease)(first));
  CU_CHECK(DRV(cuMemRelease)(second));
  CU_CHECK(DRV(cuMemAddressFree)(base, 2 * half));
  if (free_bytes() != free_at_start) {
    std::printf("memory_apis: WRONG: %zu bytes free after virtual memory, %zu before\n",
                free_bytes(), free_at_start);
    ++mismatches;
  }
  std::printf("memory_apis: virtual memory management correct\n");
  return mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  (void)program::int_arg(argc, argv, 1, 0, 0, 0);  // no arguments
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaFree(nullptr));
  int pools = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
  EXPECT(pools == 1);
  CU_CHECK(DRV(cuInit)(0));
  int vmm_supported = 0;
  CU_CHECK(DRV(cuDeviceGetAttribute)(&vmm_supported,
                                     CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT(vmm_supported == 1);
  size_t mismatches = stream_order();
  mismatches += vmm();
  if (mismatches != 0 || g_failures != 0) {
    std::printf("memory_apis: FAILED: %zu mismatches, %d calls differ from CUDA\n", mismatches,
                g_failures);
    return program::kExitMismatch;
  }
  std::printf("memory_apis: OK\n");
  return 0;
}
