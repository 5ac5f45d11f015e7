// tiny_mlp: a tiny multi-layer perceptron "model" served on the GPU. The weights are generated
// on the host, loaded once with cudaMemcpy, and then the model answers several inputs: for each
// layer a matrix-vector kernel, then a bias + ReLU kernel (no ReLU after the last layer).
//
// Usage: tiny_mlp [inputs = 16] [rounds = 1]
// `rounds` answers the same inputs again (with the weights loaded once), to run longer.
//
// Layers 32 -> 32 -> 16 -> 8. The values are chosen so that float arithmetic is exact on every
// path (fused or not, in any order):
//   inputs x: multiples of 1/8 in [-1, 1]
//   layer 1: weights and biases multiples of 1/8 in [-1, 1]  -> h1 multiples of 1/64, |h1| <= 33
//   layer 2: weights multiples of 1/8 in [-1/2, 1/2], biases of 1/8 in [-1, 1]
//                                                             -> h2 multiples of 1/512, |h2| <= 529
//   layer 3: weights multiples of 1/4 in [-1/2, 1/2], biases of 1/4 in [-1, 1]
//                                                             -> out multiples of 1/2048,
//                                                                |out| <= 4233
// Every partial sum is bounded the same way and needs at most 4233 * 2048 < 2^24 steps of its
// granularity, so it fits a float's 24-bit significand exactly. The CPU reference also checks
// itself against double precision.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "program_util.h"

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

namespace {

constexpr int kLayers = 3;
constexpr int kDims[kLayers + 1] = {32, 32, 16, 8};

// A deterministic generator: integers in [lo, hi] from a 64-bit LCG.
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  int next(int lo, int hi) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return lo + static_cast<int>((state_ >> 33) % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

struct Layer {
  int in = 0, out = 0;
  std::vector<float> w;  // out x in, row-major
  std::vector<float> b;
  bool relu = true;
};

// The model: see the bounds above.
std::vector<Layer> make_model() {
  Lcg rng(20240611);
  std::vector<Layer> layers(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    Layer& layer = layers[l];
    layer.in = kDims[l];
    layer.out = kDims[l + 1];
    layer.relu = l + 1 < kLayers;
    // Weight step and largest multiple; bias step and largest multiple.
    const float w_step = l == 2 ? 0.25f : 0.125f;
    const int w_max = l == 0 ? 8 : (l == 1 ? 4 : 2);
    const float b_step = l == 2 ? 0.25f : 0.125f;
    const int b_max = l == 2 ? 4 : 8;
    layer.w.resize(static_cast<size_t>(layer.in) * layer.out);
    for (float& w : layer.w) w = static_cast<float>(rng.next(-w_max, w_max)) * w_step;
    layer.b.resize(layer.out);
    for (float& b : layer.b) b = static_cast<float>(rng.next(-b_max, b_max)) * b_step;
  }
  return layers;
}

std::vector<float> make_input(int index) {
  Lcg rng(1000 + index);
  std::vector<float> x(kDims[0]);
  for (float& v : x) v = static_cast<float>(rng.next(-8, 8)) * 0.125f;
  return x;
}

// The CPU reference in float (as the kernels compute it) and, to check the exactness argument,
// in double. Returns false if the two differ.
bool reference(const std::vector<Layer>& layers, const std::vector<float>& input,
               std::vector<float>& out) {
  std::vector<float> x = input;
  std::vector<double> xd(input.begin(), input.end());
  for (const Layer& layer : layers) {
    std::vector<float> y(layer.out);
    std::vector<double> yd(layer.out);
    for (int r = 0; r < layer.out; ++r) {
      float sum = 0.0f;
      double sum_d = 0.0;
      for (int c = 0; c < layer.in; ++c) {
        sum += layer.w[static_cast<size_t>(r) * layer.in + c] * x[c];
        sum_d += static_cast<double>(layer.w[static_cast<size_t>(r) * layer.in + c]) * xd[c];
      }
      float v = sum + layer.b[r];
      double v_d = sum_d + layer.b[r];
      y[r] = layer.relu && !(v > 0.0f) ? 0.0f : v;
      yd[r] = layer.relu && !(v_d > 0.0) ? 0.0 : v_d;
    }
    x = std::move(y);
    xd = std::move(yd);
  }
  out = x;
  for (size_t i = 0; i < x.size(); ++i)
    if (static_cast<double>(x[i]) != xd[i]) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int inputs = static_cast<int>(program::int_arg(argc, argv, 1, 16, 1, 1000000));
  const int rounds = static_cast<int>(program::int_arg(argc, argv, 2, 1, 1, 1000000));

  CUDA_CHECK(cudaSetDevice(0));
  const std::vector<Layer> layers = make_model();

  // Load the model: weights and biases of every layer, one buffer each.
  std::vector<float*> d_w(kLayers), d_b(kLayers);
  size_t parameters = 0;
  for (int l = 0; l < kLayers; ++l) {
    const Layer& layer = layers[l];
    CUDA_CHECK(cudaMalloc(&d_w[l], layer.w.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_b[l], layer.b.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_w[l], layer.w.data(), layer.w.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b[l], layer.b.data(), layer.b.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    parameters += layer.w.size() + layer.b.size();
  }
  // Activations: one buffer per layer boundary.
  std::vector<float*> d_act(kLayers + 1);
  for (int l = 0; l <= kLayers; ++l) CUDA_CHECK(cudaMalloc(&d_act[l], kDims[l] * sizeof(float)));
  std::printf("tiny_mlp: start layers=%d parameters=%zu inputs=%d rounds=%d\n", kLayers,
              parameters, inputs, rounds);

  program::Checksum checksum;
  size_t mismatches = 0;
  bool exact = true;
  std::vector<float> got(kDims[kLayers]), want;
  for (int round = 0; round < rounds; ++round) {
    for (int q = 0; q < inputs; ++q) {
      const std::vector<float> x = make_input(q);
      CUDA_CHECK(cudaMemcpy(d_act[0], x.data(), x.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
      for (int l = 0; l < kLayers; ++l) {
        const Layer& layer = layers[l];
        const int threads = 32;
        const int blocks = (layer.out + threads - 1) / threads;
        matvec<<<blocks, threads>>>(d_w[l], d_act[l], d_act[l + 1], layer.out, layer.in);
        CUDA_CHECK_LAUNCH();
        bias_relu<<<blocks, threads>>>(d_act[l + 1], d_b[l], layer.out, layer.relu ? 1 : 0);
        CUDA_CHECK_LAUNCH();
      }
      CUDA_CHECK(cudaMemcpy(got.data(), d_act[kLayers], got.size() * sizeof(float),
                            cudaMemcpyDeviceToHost));
      exact = reference(layers, x, want) && exact;
      mismatches += program::count_mismatches("output", got.data(), want.data(), got.size());
      if (round == 0) {
        checksum.add(got.data(), got.size() * sizeof(float));
        int best = 0;
        for (int i = 1; i < kDims[kLayers]; ++i)
          if (got[i] > got[best]) best = i;
        if (q < 4) std::printf("tiny_mlp: input %d -> class %d (score %g)\n", q, best, got[best]);
      }
    }
  }

  for (int l = 0; l < kLayers; ++l) {
    CUDA_CHECK(cudaFree(d_w[l]));
    CUDA_CHECK(cudaFree(d_b[l]));
  }
  for (float* p : d_act) CUDA_CHECK(cudaFree(p));
  if (!exact) {
    std::printf("tiny_mlp: FAILED: the float reference is not exact (the model's values are "
                "wrong)\n");
    return program::kExitMismatch;
  }
  if (mismatches != 0) {
    std::printf("tiny_mlp: FAILED: %zu wrong outputs\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("tiny_mlp: OK inputs=%d rounds=%d checksum=%016llx\n", inputs, rounds,
              checksum.value());
  return 0;
}
