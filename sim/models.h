// The models simulated functions run: the Torpor paper's eight (Table 4), with everything the
// simulator needs of each: execution times, the blocks a swap moves, the scratch a request
// allocates, and what the early-binding baselines need (native footprint, cold start).
//
// Sources, per field (docs/sim.md has the derivations):
//   - remote_ms, native_ms: Table 4 ("GPU remoting", "Native"), V100, measured by the paper.
//   - paper_swap_pcie_ms, paper_swap_nvlink_ms: Table 4, used only to show the calibration.
//   - Tensor inventories: ESTIMATED from the public architectures in fp32 (torchvision's
//     DenseNet-169/201, Inception-v3 with its auxiliary head, EfficientNet-B0, ResNet-50/101/152;
//     Hugging Face's bert-large-uncased-whole-word-masking-finetuned-squad, which the Torpor
//     artifact runs as "bertqa"). Tensors up to 1 MiB are summed (small_mib); larger ones are
//     listed in load order, as PyTorch allocates them.
//   - Scratch: ESTIMATED activation and workspace segments of one request (batch 1 for the CNNs,
//     2 x 512 tokens for Bert-qa as in the artifact).
//   - Native footprint: Table 1 for ResNet-152 (1.6 GB) and Bert-qa (2.4 GB), read as GiB (the
//     unit nvidia-smi reports); the other six are ESTIMATED as their weights plus ResNet-152's
//     runtime overhead (1.6 GiB minus its weights: CUDA context, cuDNN/cuBLAS, caching-allocator
//     reserve).
//   - Intensity (what a request asks of the GPU alone, for the interference model,
//     scheduler/interference.h): ESTIMATED. Bert-qa's compute share from its FLOPs (2 x 335 M
//     parameters x 1,024 tokens = 0.69 TFLOP in 43 ms is the V100's fp32 peak); the CNNs' from
//     USHER's distribution of small models (Fig. 6a: most compute-heavy with Creq/Mreq in
//     (1.35, 1.65], the rest memory-heavy with a ratio <= 0.75) and its Fig. 2 (two models
//     multiplexed naively keep <= 0.55 of their goodput, so a typical pair sums to ~1.8).
//   - Cold start: Table 1 for ResNet-152 (8 s) and Bert-qa (11 s); the other CNNs ESTIMATED at
//     ResNet-152's 8 s (same image and framework start-up; their weights load in milliseconds).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "scheduler/interference.h"
#include "scheduler/types.h"

namespace hiber::sim {

using scheduler::Duration;
using scheduler::kGiB;
using scheduler::kMiB;
using scheduler::kMicrosecond;
using scheduler::kMillisecond;
using scheduler::kSecond;
using scheduler::Time;

// The paper's two deadline classes (§7: CV 80 ms and Bert-qa 200 ms on a node).
enum class ModelClass : uint8_t { kVision, kLanguage };

const char* model_class_name(ModelClass model_class);

// `count` tensors of `mib` MiB each.
struct TensorGroup {
  int count = 0;
  double mib = 0;
};

// One row of the table as written down (paper figures and estimates).
struct ModelSpec {
  std::string_view name;
  ModelClass model_class = ModelClass::kVision;
  double remote_ms = 0;
  double native_ms = 0;
  double paper_swap_pcie_ms = 0;
  double paper_swap_nvlink_ms = 0;
  double small_mib = 0;
  std::vector<TensorGroup> tensors;  // > 1 MiB, load order
  std::vector<TensorGroup> scratch;  // per request, as PyTorch segments
  double native_footprint_gib = 0;
  bool native_footprint_measured = false;  // from Table 1, else estimated
  double cold_start_s = 0;
  bool cold_start_measured = false;  // from Table 1, else estimated
  double compute_share = 1;          // ESTIMATED, see above
  double memory_share = 1;           // ESTIMATED
};

// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) asks the device for
// segments of three kinds, and those segments are what hiberd's pools see and a swap moves:
// tensors of at most 1 MiB share 2 MiB segments, tensors below 10 MiB are cut from 20 MiB
// segments, larger ones get a segment of their own rounded up to 2 MiB. A tensor is cut from
// the free remainder of an earlier segment where one fits (best fit), as the allocator does.
// The small tensors' segments are spread evenly among the others (every layer has some), which
// is the order loading a model layer by layer creates them in.
std::vector<uint64_t> pytorch_segments(double small_mib, const std::vector<TensorGroup>& tensors);

// A row turned into what the simulator uses: bytes and nanoseconds.
struct Model {
  std::string name;
  ModelClass model_class = ModelClass::kVision;
  Duration exec = 0;         // resident execution under Hiber (GPU remoting)
  Duration native_exec = 0;  // native execution (early-binding baselines)
  Duration cold_start = 0;
  uint64_t weight_bytes = 0;       // the tensors themselves
  std::vector<uint64_t> segments;  // the model's blocks: what a swap allocates and copies
  uint64_t model_bytes = 0;        // sum of segments
  std::vector<uint64_t> scratch_segments;
  uint64_t scratch_bytes = 0;
  uint64_t native_footprint = 0;
  Duration paper_swap_pcie = 0;
  Duration paper_swap_nvlink = 0;
  scheduler::Intensity intensity;  // what a request asks of the GPU while it runs alone
};

Model make_model(const ModelSpec& spec);

// The eight rows, in Table 4's order.
const std::vector<ModelSpec>& paper_model_specs();
const std::vector<Model>& paper_models();

// Index into paper_models() by name ("resnet152", "bertqa", ...); kInvalidValue lists the names.
Result<int> find_model(std::string_view name);

}  // namespace hiber::sim
