// The tiny MLP on the device, shared by tiny_mlp.cu and mlp_server.cu: its two kernels, loading
// the model, and the forward pass (tiny_mlp_model.h has the model and its host reference).
// host_kernels.cc has the kernels' host implementations for the simulated device, under the
// same names.
#pragma once

#include <vector>

#include "program_util.h"
#include "tiny_mlp_model.h"

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

namespace tiny_mlp {

// The model on the device: per layer, its weights and its biases, one buffer each.
struct DeviceModel {
  std::vector<float*> w, b;
};

// Allocates and fills the model's buffers, layer by layer (weights, then biases).
inline DeviceModel upload_model(const std::vector<Layer>& layers) {
  DeviceModel model{std::vector<float*>(layers.size()), std::vector<float*>(layers.size())};
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    CUDA_CHECK(cudaMalloc(&model.w[l], layer.w.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&model.b[l], layer.b.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(model.w[l], layer.w.data(), layer.w.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(model.b[l], layer.b.data(), layer.b.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
  }
  return model;
}

inline void free_model(const DeviceModel& model) {
  for (size_t l = 0; l < model.w.size(); ++l) {
    CUDA_CHECK(cudaFree(model.w[l]));
    CUDA_CHECK(cudaFree(model.b[l]));
  }
}

// Runs the layers on the input in act[0]; act[l + 1] receives layer l's output.
inline void forward(const std::vector<Layer>& layers, const DeviceModel& model,
                    const std::vector<float*>& act) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    const int threads = 32;
    const int blocks = (layer.out + threads - 1) / threads;
    matvec<<<blocks, threads>>>(model.w[l], act[l], act[l + 1], layer.out, layer.in);
    CUDA_CHECK_LAUNCH();
    bias_relu<<<blocks, threads>>>(act[l + 1], model.b[l], layer.out, layer.relu ? 1 : 0);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace tiny_mlp
