#include "sim/models.h"

#include <cmath>

namespace hiber::sim {
namespace {

constexpr uint64_t kSmallTensor = 1 * kMiB;     // PyTorch kSmallSize
constexpr uint64_t kSmallSegment = 2 * kMiB;    // kSmallBuffer
constexpr uint64_t kLargeSegment = 20 * kMiB;   // kLargeBuffer
constexpr uint64_t kMinLargeAlloc = 10 * kMiB;  // kMinLargeAlloc
constexpr uint64_t kRoundLarge = 2 * kMiB;      // kRoundLarge
constexpr uint64_t kMinBlock = 512;             // kMinBlockSize

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

uint64_t mib_bytes(double mib) {
  return static_cast<uint64_t>(std::llround(mib * static_cast<double>(kMiB)));
}

Duration ms(double value) { return static_cast<Duration>(std::llround(value * 1e6)); }

// ResNet layer4 and the classifier (shared by the three ResNets): conv1 of the first block
// (1024->512, 2 MiB), then per block 3x3 512 (9 MiB) and the 1x1 convolutions (4 MiB), the
// downsample (1024->2048, 8 MiB), and fc (2048x1000, 7.8 MiB).
std::vector<TensorGroup> resnet_tail() {
  return {{1, 2}, {1, 9}, {1, 4}, {1, 8}, {1, 4}, {1, 4},
          {1, 9}, {1, 4}, {1, 4}, {1, 9}, {1, 4}, {1, 7.8125}};
}

std::vector<TensorGroup> resnet(int layer3_blocks) {
  // layer3: one 3x3 256-channel convolution (2.25 MiB) per block and the downsample (2 MiB);
  // its 1x1 convolutions are exactly 1 MiB, so small.
  std::vector<TensorGroup> t = {{layer3_blocks, 2.25}, {1, 2}};
  for (const TensorGroup& g : resnet_tail()) t.push_back(g);
  return t;
}

std::vector<TensorGroup> bert_large() {
  // Word embeddings (30522 x 1024), position embeddings (512 x 1024), then 24 layers of four
  // 1024 x 1024 attention projections and two 1024 x 4096 feed-forward matrices.
  std::vector<TensorGroup> t = {{1, 119.21875}, {1, 2}};
  for (int layer = 0; layer < 24; ++layer) {
    t.push_back({4, 4});
    t.push_back({2, 16});
  }
  return t;
}

std::vector<ModelSpec> build_specs() {
  std::vector<ModelSpec> specs;
  // name, class, remoting, native, swap-PCIe, swap-NVLink (Table 4)
  specs.push_back({.name = "densenet169",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 25,
                   .native_ms = 30,
                   .paper_swap_pcie_ms = 27,
                   .paper_swap_nvlink_ms = 26,
                   // Transition 1280->640 and the 1664x1000 classifier; the dense layers are small.
                   .small_mib = 44.5,
                   .tensors = {{1, 3.125}, {1, 6.35}},
                   .scratch = {{3, 20}},  // concatenated feature maps
                   .native_footprint_gib = 0,
                   .cold_start_s = 8,
                   .compute_share = 0.6,  // concatenations copy feature maps: memory-heavy
                   .memory_share = 0.8});
  specs.push_back({.name = "densenet201",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 28,
                   .native_ms = 36,
                   .paper_swap_pcie_ms = 30,
                   .paper_swap_nvlink_ms = 30,
                   .small_mib = 63.0,
                   .tensors = {{1, 6.125}, {1, 7.32}},
                   .scratch = {{3, 20}},
                   .native_footprint_gib = 0,
                   .cold_start_s = 8,
                   .compute_share = 0.6,  // as DenseNet-169
                   .memory_share = 0.8});
  specs.push_back({.name = "inception_v3",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 14,
                   .native_ms = 19,
                   .paper_swap_pcie_ms = 17,
                   .paper_swap_nvlink_ms = 16,
                   // Mixed_6a/7a reductions, Mixed_7b/7c branches, the auxiliary head, fc.
                   .small_mib = 36.1,
                   .tensors = {{1, 3.8},
                               {1, 2.1},
                               {1, 1.56},
                               {1, 1.88},
                               {2, 1.69},
                               {1, 2.19},
                               {1, 5.9},
                               {2, 1.69},
                               {1, 2.5},
                               {1, 3.0},
                               {2, 1.69},
                               {1, 3.5},
                               {1, 5.9},
                               {2, 1.69},
                               {1, 1.5},
                               {1, 9.4},
                               {1, 2.93},
                               {1, 7.8125}},
                   .scratch = {{2, 20}},
                   .native_footprint_gib = 0,
                   .cold_start_s = 8,
                   .compute_share = 0.9,  // wide convolutions: compute-heavy, ratio 1.5
                   .memory_share = 0.6});
  specs.push_back({.name = "efficientnet_b0",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 12,
                   .native_ms = 17,
                   .paper_swap_pcie_ms = 13,
                   .paper_swap_nvlink_ms = 13,
                   .small_mib = 12.3,
                   .tensors = {{1, 1.4}, {1, 1.56}, {1, 4.88}},
                   .scratch = {{2, 20}},
                   .native_footprint_gib = 0,
                   .cold_start_s = 8,
                   .compute_share = 0.5,  // depthwise convolutions: memory-heavy
                   .memory_share = 0.7});
  specs.push_back({.name = "resnet50",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 9,
                   .native_ms = 11,
                   .paper_swap_pcie_ms = 13,
                   .paper_swap_nvlink_ms = 11,
                   .small_mib = 17.2,
                   .tensors = resnet(6),
                   .scratch = {{2, 20}},
                   .native_footprint_gib = 0,
                   .cold_start_s = 8,
                   .compute_share = 0.8,  // compute-heavy, smaller than ResNet-101/152
                   .memory_share = 0.55});
  specs.push_back({.name = "resnet101",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 14,
                   .native_ms = 20,
                   .paper_swap_pcie_ms = 22,
                   .paper_swap_nvlink_ms = 16,
                   .small_mib = 51.4,
                   .tensors = resnet(23),
                   .scratch = {{2, 20}},
                   .native_footprint_gib = 0,
                   .cold_start_s = 8,
                   .compute_share = 0.9,  // compute-heavy, ratio 1.5
                   .memory_share = 0.6});
  specs.push_back({.name = "resnet152",
                   .model_class = ModelClass::kVision,
                   .remote_ms = 17,
                   .native_ms = 25,
                   .paper_swap_pcie_ms = 25,
                   .paper_swap_nvlink_ms = 20,
                   .small_mib = 81.8,
                   .tensors = resnet(36),
                   .scratch = {{2, 20}},
                   .native_footprint_gib = 1.6,
                   .native_footprint_measured = true,
                   .cold_start_s = 8,
                   .cold_start_measured = true,
                   .compute_share = 0.9,  // compute-heavy, ratio 1.5
                   .memory_share = 0.6});
  specs.push_back(
      {.name = "bertqa",
       .model_class = ModelClass::kLanguage,
       .remote_ms = 43,
       .native_ms = 42,
       .paper_swap_pcie_ms = 144,
       .paper_swap_nvlink_ms = 45,
       // Biases, LayerNorms, token-type embeddings and the QA head.
       .small_mib = 4.8,
       .tensors = bert_large(),
       .scratch = {{4, 20}, {1, 48}},  // attention scores of 2 x 16 heads x 512^2
       .native_footprint_gib = 2.4,
       .native_footprint_measured = true,
       .cold_start_s = 11,
       .cold_start_measured = true,
       .compute_share =
           1.0,  // its FLOPs fill the V100; weights 1.3 GB per request are 3% of its bandwidth
       .memory_share = 0.4});
  // The estimated footprints: weights plus ResNet-152's measured runtime overhead.
  const ModelSpec& r152 = specs[6];
  double r152_weights = r152.small_mib;
  for (const TensorGroup& g : r152.tensors) r152_weights += g.count * g.mib;
  const double overhead_gib = r152.native_footprint_gib - r152_weights / 1024.0;
  for (ModelSpec& s : specs) {
    if (s.native_footprint_measured) continue;
    double weights = s.small_mib;
    for (const TensorGroup& g : s.tensors) weights += g.count * g.mib;
    s.native_footprint_gib = weights / 1024.0 + overhead_gib;
  }
  return specs;
}

}  // namespace

const char* model_class_name(ModelClass model_class) {
  return model_class == ModelClass::kLanguage ? "language" : "vision";
}

std::vector<uint64_t> pytorch_segments(double small_mib, const std::vector<TensorGroup>& tensors) {
  std::vector<uint64_t> large;       // segments of tensors above 1 MiB, in load order
  std::vector<uint64_t> free_tails;  // unused remainders of those segments
  uint64_t lone_small = 0;           // small tensors listed explicitly
  for (const TensorGroup& group : tensors) {
    const uint64_t bytes = round_up(mib_bytes(group.mib), kMinBlock);
    for (int i = 0; i < group.count; ++i) {
      if (bytes <= kSmallTensor) {
        lone_small += bytes;
        continue;
      }
      size_t best = free_tails.size();
      for (size_t k = 0; k < free_tails.size(); ++k) {
        if (free_tails[k] >= bytes &&
            (best == free_tails.size() || free_tails[k] < free_tails[best]))
          best = k;
      }
      if (best < free_tails.size()) {
        free_tails[best] -= bytes;
        continue;
      }
      const uint64_t segment =
          bytes < kMinLargeAlloc ? kLargeSegment : round_up(bytes, kRoundLarge);
      large.push_back(segment);
      // PyTorch splits a large-pool block only if more than kSmallSize remains.
      if (segment - bytes > kSmallTensor) free_tails.push_back(segment - bytes);
    }
  }
  const uint64_t small = mib_bytes(small_mib) + lone_small;
  const size_t small_segments = static_cast<size_t>((small + kSmallSegment - 1) / kSmallSegment);
  // Small tensors (biases, norms, small convolutions) come with every layer, so their segments
  // are spread evenly through the large ones, as loading the model layer by layer makes them.
  std::vector<uint64_t> segments;
  segments.reserve(large.size() + small_segments);
  size_t placed_small = 0;
  for (size_t i = 0; i <= large.size(); ++i) {
    const size_t due = large.empty() ? small_segments : small_segments * i / large.size();
    for (; placed_small < due; ++placed_small) segments.push_back(kSmallSegment);
    if (i < large.size()) segments.push_back(large[i]);
  }
  return segments;
}

Model make_model(const ModelSpec& spec) {
  Model m;
  m.name = std::string(spec.name);
  m.model_class = spec.model_class;
  m.exec = ms(spec.remote_ms);
  m.native_exec = ms(spec.native_ms);
  m.cold_start = ms(spec.cold_start_s * 1000);
  double weights = spec.small_mib;
  for (const TensorGroup& g : spec.tensors) weights += g.count * g.mib;
  m.weight_bytes = mib_bytes(weights);
  m.segments = pytorch_segments(spec.small_mib, spec.tensors);
  for (uint64_t s : m.segments) m.model_bytes += s;
  for (const TensorGroup& g : spec.scratch) {
    for (int i = 0; i < g.count; ++i)
      m.scratch_segments.push_back(round_up(mib_bytes(g.mib), kRoundLarge));
  }
  for (uint64_t s : m.scratch_segments) m.scratch_bytes += s;
  m.native_footprint = static_cast<uint64_t>(std::llround(spec.native_footprint_gib * kGiB));
  m.paper_swap_pcie = ms(spec.paper_swap_pcie_ms);
  m.paper_swap_nvlink = ms(spec.paper_swap_nvlink_ms);
  m.intensity = {spec.compute_share, spec.memory_share};
  return m;
}

const std::vector<ModelSpec>& paper_model_specs() {
  static const std::vector<ModelSpec> specs = build_specs();
  return specs;
}

const std::vector<Model>& paper_models() {
  static const std::vector<Model> models = [] {
    std::vector<Model> out;
    for (const ModelSpec& s : paper_model_specs()) out.push_back(make_model(s));
    return out;
  }();
  return models;
}

Result<int> find_model(std::string_view name) {
  const std::vector<Model>& models = paper_models();
  std::string known;
  for (size_t i = 0; i < models.size(); ++i) {
    if (models[i].name == name) return static_cast<int>(i);
    known += (i ? ", " : "") + models[i].name;
  }
  return error(ErrorCode::kInvalidValue, "unknown model '", name, "' (known: ", known, ")");
}

}  // namespace hiber::sim
