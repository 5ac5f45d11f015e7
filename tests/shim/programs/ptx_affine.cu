// A kernel compiled to PTX only (nvcc -ptx), as NVRTC produces for PyTorch's jiterator:
// runtime_gaps loads it with cuLink* and cuModuleLoadData and launches it. extern "C", so its
// name in the PTX (and in the sim plugin, host_kernels.cc) is plain.
extern "C" __global__ void hiber_ptx_affine(float* y, const float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}
