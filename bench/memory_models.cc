#include "bench/memory_models.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

namespace hiber::bench {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kMB = 1000 * 1000;

// PyTorch's caching allocator constants.
constexpr uint64_t kRoundBytes = 512;
constexpr uint64_t kSmallSize = 1 * kMiB;
constexpr uint64_t kSmallBuffer = 2 * kMiB;
constexpr uint64_t kMinLargeAlloc = 10 * kMiB;
constexpr uint64_t kLargeBuffer = 20 * kMiB;
constexpr uint64_t kRoundLarge = 2 * kMiB;

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::vector<ModelSpec> make_models() {
  // Largest convolutions (ResNet's 3x3x512x512 is 9.4 MB, DenseNet's are 1x1 bottlenecks);
  // classifiers: features x 1000 classes x 4 bytes.
  const uint64_t resnet_conv = 3 * 3 * 512 * 512 * 4;
  std::vector<uint64_t> bert;
  bert.push_back(30522ull * 1024 * 4);  // word embeddings
  bert.push_back(512ull * 1024 * 4);    // position embeddings
  for (int layer = 0; layer < 24; ++layer) {
    for (int i = 0; i < 4; ++i) bert.push_back(1024ull * 1024 * 4);  // Q, K, V, output
    bert.push_back(4096ull * 1024 * 4);                              // FFN in
    bert.push_back(1024ull * 4096 * 4);                              // FFN out
  }
  return {
      {"DenseNet-169", 57 * kMB, 1 * 1 * 1664 * 128 * 4, {1664ull * 1000 * 4}},
      {"DenseNet-201", 80 * kMB, 1 * 1 * 1920 * 128 * 4, {1920ull * 1000 * 4}},
      {"Inception-v3", 95 * kMB, 3 * 3 * 448 * 384 * 4, {2048ull * 1000 * 4}},
      {"EfficientNet", 21 * kMB, 1 * 1 * 1152 * 320 * 4, {1280ull * 1000 * 4}},
      {"ResNet-50", 98 * kMB, resnet_conv, {2048ull * 1000 * 4}},
      {"ResNet-101", 170 * kMB, resnet_conv, {2048ull * 1000 * 4}},
      {"ResNet-152", 230 * kMB, resnet_conv, {2048ull * 1000 * 4}},
      // Bert-large: 335 M parameters (Table 4's 1.3 GB); the draw fills in biases and norms.
      {"Bert-qa", 1340 * kMB, 16 * 1024, bert},
  };
}

}  // namespace

const std::vector<ModelSpec>& table4_models() {
  static const std::vector<ModelSpec> models = make_models();
  return models;
}

const ModelSpec& model_named(std::string_view name) {
  for (const ModelSpec& model : table4_models()) {
    if (model.name == name) return model;
  }
  std::abort();  // a benchmark asked for a model that is not in the table
}

std::vector<uint64_t> pytorch_segments(const ModelSpec& model, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> tensors = model.known_tensors;
  uint64_t total = 0;
  for (uint64_t t : tensors) total += t;
  const double lo = std::log(4096.0);
  const double hi = std::log(static_cast<double>(model.largest_drawn_tensor));
  std::uniform_real_distribution<double> log_size(lo, hi);
  while (total < model.weight_bytes) {
    const auto drawn = static_cast<uint64_t>(std::exp(log_size(rng)));
    const uint64_t size = std::min(drawn, model.weight_bytes - total);
    tensors.push_back(size);
    total += size;
  }
  std::shuffle(tensors.begin(), tensors.end(), rng);

  // First fit into the open segments of the tensor's pool, else a new segment.
  std::vector<uint64_t> segments;
  std::vector<uint64_t> small_room, large_room;
  const auto place = [&](std::vector<uint64_t>& room, uint64_t bytes, uint64_t segment) {
    for (uint64_t& left : room) {
      if (left >= bytes) {
        left -= bytes;
        return;
      }
    }
    segments.push_back(segment);
    room.push_back(segment - bytes);
  };
  for (uint64_t tensor : tensors) {
    const uint64_t bytes = round_up(std::max<uint64_t>(tensor, 1), kRoundBytes);
    if (bytes <= kSmallSize) {
      place(small_room, bytes, kSmallBuffer);
    } else if (bytes < kMinLargeAlloc) {
      place(large_room, bytes, kLargeBuffer);
    } else {
      segments.push_back(round_up(bytes, kRoundLarge));
    }
  }
  return segments;
}

}  // namespace hiber::bench
