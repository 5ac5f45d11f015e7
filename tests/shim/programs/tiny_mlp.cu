// tiny_mlp: a tiny multi-layer perceptron "model" served on the GPU. The weights are generated
// on the host, loaded once with cudaMemcpy, and then the model answers several inputs: for each
// layer a matrix-vector kernel, then a bias + ReLU kernel (no ReLU after the last layer).
//
// Usage: tiny_mlp [inputs = 16] [rounds = 1]
// `rounds` answers the same inputs again (with the weights loaded once), to run longer.
//
// The model and its exactness argument are in tiny_mlp_model.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "program_util.h"
#include "tiny_mlp_kernels.cuh"
#include "tiny_mlp_model.h"

using namespace tiny_mlp;

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int inputs = static_cast<int>(program::int_arg(argc, argv, 1, 16, 1, 1000000));
  const int rounds = static_cast<int>(program::int_arg(argc, argv, 2, 1, 1, 1000000));

  CUDA_CHECK(cudaSetDevice(0));
  const std::vector<Layer> layers = make_model(kDefaultSeed);

  // Load the model: weights and biases of every layer, one buffer each.
  const DeviceModel model = upload_model(layers);
  size_t parameters = 0;
  for (const Layer& layer : layers) parameters += layer.w.size() + layer.b.size();
  // Activations: one buffer per layer boundary.
  std::vector<float*> d_act(kLayers + 1);
  for (int l = 0; l <= kLayers; ++l) CUDA_CHECK(cudaMalloc(&d_act[l], kDims[l] * sizeof(float)));
  std::printf("tiny_mlp: start layers=%d parameters=%zu inputs=%d rounds=%d\n", kLayers, parameters,
              inputs, rounds);

  program::Checksum checksum;
  size_t mismatches = 0;
  bool exact = true;
  std::vector<float> got(kDims[kLayers]), want;
  for (int round = 0; round < rounds; ++round) {
    for (int q = 0; q < inputs; ++q) {
      const std::vector<float> x = make_input(q);
      CUDA_CHECK(cudaMemcpy(d_act[0], x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
      forward(layers, model, d_act);
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

  free_model(model);
  for (float* p : d_act) CUDA_CHECK(cudaFree(p));
  if (!exact) {
    std::printf(
        "tiny_mlp: FAILED: the float reference is not exact (the model's values are "
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
