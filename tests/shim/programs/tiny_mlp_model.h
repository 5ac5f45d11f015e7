// The tiny MLP "model" of tiny_mlp.cu and mlp_server.cu, and its CPU reference: the weights a
// seed generates, the inputs, and the float computation the kernels must reproduce exactly.
// Host code only; included by the programs (nvcc) and by the tests that check their answers.
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
// granularity, so it fits a float's 24-bit significand exactly. The reference also checks
// itself against double precision.
#pragma once

#include <cstdint>
#include <vector>

namespace tiny_mlp {

constexpr int kLayers = 3;
constexpr uint64_t kDefaultSeed = 20240611;
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

// The model of `seed` (tiny_mlp.cu uses kDefaultSeed); see the bounds above.
inline std::vector<Layer> make_model(uint64_t seed) {
  Lcg rng(seed);
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

inline std::vector<float> make_input(int index) {
  Lcg rng(1000 + index);
  std::vector<float> x(kDims[0]);
  for (float& v : x) v = static_cast<float>(rng.next(-8, 8)) * 0.125f;
  return x;
}

// The CPU reference in float (as the kernels compute it) and, to check the exactness argument,
// in double. Returns false if the two differ.
inline bool reference(const std::vector<Layer>& layers, const std::vector<float>& input,
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

// Entry i of the lookup table of mlp_server's model `seed`: an integer below 2^16, exact as a
// float, different for every seed and position.
inline float table_value(uint64_t seed, uint64_t i) {
  return static_cast<float>((seed * 2654435761ull + i * 40503ull) % 65536ull);
}

}  // namespace tiny_mlp
