// The device half of rdc_affine: a __device__ function that the kernel in rdc_affine.cu calls
// across translation units, so the program only works once nvcc's device link has run.
__device__ float rdc_transform(float x) { return 3.0f * x + 1.0f; }
