// The paper's Table 4 models as hiberd sees them: the device segments PyTorch's caching
// allocator asks for while it loads each model's fp32 weights. Shared by the memory and
// translation benchmarks (docs/perf.md, "memory: pools and block translation").
//
// PyTorch (c10/cuda/CUDACachingAllocator.cpp) rounds a tensor to 512 bytes and takes it from
//   - a 2 MiB segment if it is at most 1 MiB (small tensors share segments),
//   - a 20 MiB segment if it is under 10 MiB (medium tensors share segments),
//   - a segment of its own, rounded up to 2 MiB, otherwise.
// A model's tensors are its known large ones (a classifier, Bert's embeddings and FFN weights)
// plus sizes drawn log-uniformly up to its largest convolution until the weights add up to the
// model's size; the draw and the load order are seeded, so every run sees the same segments.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace hiber::bench {

struct ModelSpec {
  std::string_view name;
  uint64_t weight_bytes;                // fp32 weights, Table 4's sizes
  uint64_t largest_drawn_tensor;        // the draw's upper bound
  std::vector<uint64_t> known_tensors;  // tensors the architecture fixes
};

// DenseNet-169, DenseNet-201, Inception-v3, EfficientNet, ResNet-50, ResNet-101, ResNet-152,
// Bert-qa (large).
const std::vector<ModelSpec>& table4_models();
const ModelSpec& model_named(std::string_view name);

// The segments PyTorch allocates, in the order it allocates them, to load `model`.
std::vector<uint64_t> pytorch_segments(const ModelSpec& model, uint64_t seed);

}  // namespace hiber::bench
