// The tiny MLP's two kernels (tiny_mlp_model.h has the model and its host reference), shared by
// tiny_mlp.cu and mlp_server.cu. host_kernels.cc has their host implementations for the
// simulated device, under the same names.
#pragma once

__global__ void matvec(const float* w, const float* x, float* y, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += w[r * cols + c] * x[c];
  y[r] = sum;
}

__global__ void bias_relu(float* y, const float* bias, int n, int relu) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = y[i] + bias[i];
  y[i] = relu && !(v > 0.0f) ? 0.0f : v;
}
