// How a function's pointers reach its blocks on the GPU that runs it. Two mechanisms behind one
// interface (AddressTranslator), both driven by the function's BlockTable (memory/block_table.h):
//
// (a) Mapping, the default. The executing GPU maps the function's blocks at the function's own
//     virtual addresses (CUDA VMM: cuMemMap of the pool chunk at the block's address, then
//     cuMemSetAccess for that GPU only; the simulated device does the same with memfd aliasing).
//     Nothing is rewritten, so every pointer stays valid wherever the function keeps it: kernel
//     arguments, pointer arrays in device memory, cuDNN variant packs. plan_mapping() lists the
//     map calls of a swap; blocks adjacent in the address range and in one pool chunk (the buddy
//     allocator's consolidation places a function's blocks that way) merge into one call, so a
//     swap makes few calls. MapPlan::va_runs() gives the set_access and unmap calls.
//
// (b) Rewriting, the paper's method and the fallback where mapping is impossible: above all two
//     replicas of one function executing at the same time on two GPUs, which one address range
//     cannot back (an address has one physical backing for all GPUs), and a device without VMM.
//     Each pointer argument of a copy, memset or library call is translated to where its block
//     lies in the GPU's pool (the chunk's base address in hiberd plus the block's offset), and
//     the words of kernel arguments that point into the function's blocks are rewritten.
//     Pointers the function stored in device memory are NOT translated: they stay wrong. That,
//     and the guesswork below, is why mapping is preferred. docs/memory.md gives the measured
//     costs of both.
//
// The kernel-argument scan and its guard against false positives. A kernel's packed parameters
// carry no types, only offsets and sizes (common/kernel_info.h), so a word that looks like a
// pointer is taken for one. The guard:
//   1. Only parameters that can hold a pointer are read: size >= 8 and an offset that is a
//      multiple of 8 (the parameter ABI aligns a pointer, and a struct containing one, to 8).
//      Inside such a parameter only the 8-byte-aligned words are read. So two adjacent 4-byte
//      parameters are never read as one word, and neither is a struct of 4-byte members.
//   2. A word is a pointer only if it lies in the function's own address range AND resolves to
//      one of its live blocks (one past the end included). Words into gaps, freed blocks or other
//      functions' ranges are left alone.
//   3. The range is one hiberd reserved for this function, and the rewriting translator refuses
//      a range that starts below 4 GiB (kMinRewritableAddress): reserve_address_range gives
//      high addresses on both backends (the simulated device's are mmap addresses, 0x7f..; the
//      client shim reserves the same range PROT_NONE in the function's process, so no host
//      pointer can fall in it). Then no 32-bit value read as a word can match (its upper half
//      is 0, or all ones when sign-extended: -1 and every negative number lie above every user
//      address). Nor can a floating-point value unless it is denormal: a normal double is 2^52
//      or more as a word, a pair of floats whose upper one is normal 2^55 or more, both outside
//      the 47-bit user address space of Linux; zeros fall below 4 GiB, negatives above 2^63.
// What remains, honestly: a 64-bit integer argument that happens to equal an address inside a
// live block (for a random 64-bit value, such as an RNG seed, the odds are live bytes / 2^64,
// about 1 in 10^9 for 16 GiB), and a struct of two 32-bit integers whose upper member equals the
// upper half of the range (about 0x7fxx, i.e. 32,512..32,767, for the simulated device's
// ranges) while the lower one lands in a block. Such a word is rewritten and the kernel sees a
// wrong integer. And a pointer one past the end of a block that another block directly follows
// is read as the next block's start (the table's rule): rewriting sends it to where that block
// lies, which is the first block's end only when the two are placed back to back, so a kernel
// given (begin, end) of such a block may see the wrong length. Mapping has none of these
// failures.
//
// Thread safety: none; a translator belongs to the session that owns its table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/kernel_info.h"
#include "common/status.h"
#include "memory/block_table.h"

namespace hiber::memory {

// ---- Mapping: the plan of a swap ----

// One map call: [va, va + bytes) of the function backed by [chunk_offset, + bytes) of a chunk of
// the GPU's pool.
struct MapCall {
  uint64_t va = 0;
  uint64_t bytes = 0;
  uint32_t chunk = 0;
  uint64_t chunk_offset = 0;
  friend bool operator==(const MapCall&, const MapCall&) = default;
};

struct VaRange {
  uint64_t va = 0;
  uint64_t bytes = 0;
  friend bool operator==(const VaRange&, const VaRange&) = default;
};

struct MapPlan {
  int gpu = -1;
  std::vector<MapCall> calls;  // in address order
  uint64_t blocks = 0;         // blocks the calls map
  uint64_t bytes = 0;
  // Blocks chosen for the plan but not placed on the GPU: left out of it.
  uint64_t unplaced_blocks = 0;
  // The calls' contiguous address runs, whatever backs them: one set_access call each, and
  // one unmap call each when the function leaves the GPU.
  std::vector<VaRange> va_runs() const;
};

// The map calls that show `block`'s placement on `gpu` at [at, at + block.bytes): one per piece.
// REQUIRES: the block is placed there.
std::vector<MapCall> block_map_calls(const VirtualBlock& block, int gpu, uint64_t at);

// Chooses blocks for a plan (say, the model blocks only); empty means every block.
using BlockFilter = std::function<bool(const VirtualBlock&)>;

// The map calls that make the chosen blocks placed on `gpu` (loading or resident) appear at
// their own addresses. kInvalidValue for a bad GPU or a placement whose offset is not a multiple
// of the table's granularity (the device could not map it).
Result<MapPlan> plan_mapping(const BlockTable& table, int gpu, const BlockFilter& include = {});

// ---- Kernel arguments ----

// A word of a kernel's parameter buffer that points into one of the function's blocks.
struct ArgumentPointer {
  uint32_t offset = 0;  // of the word in the parameter buffer
  PointerTarget target;
};

// Finds the pointer words of a packed parameter buffer laid out as `kernel` says, under the guard
// in the file comment, and puts them in `found` (cleared first; reuse it to avoid allocating per
// launch). Returns the number of words compared with the table. kInvalidValue if the buffer is
// not kernel.param_bytes() long or a parameter lies outside it.
Result<uint64_t> scan_kernel_params(const BlockTable& table, std::span<const std::byte> params,
                                    const KernelInfo& kernel, std::vector<ArgumentPointer>& found);

// Whether `data`, about to be copied to device address `dst`, holds a pointer into one of the
// table's live blocks: an 8-byte word aligned in device memory (dst + offset a multiple of 8)
// that passes guard 2 above. A block holding such data is a pointer table (pointer arrays for
// batched GEMM, say): a kernel may reach through it blocks that its arguments do not name.
// A false positive only makes its users wait longer, never read wrong data.
bool holds_block_pointers(const BlockTable& table, uint64_t dst, std::span<const std::byte> data);

// ---- One interface, two mechanisms ----

struct TranslationCounters {
  uint64_t ranges = 0;           // pointer arguments of copies, memsets and library calls
  uint64_t launches = 0;         // kernel parameter buffers
  uint64_t words_scanned = 0;    // kernel-argument words compared with the table
  uint64_t words_rewritten = 0;  // ... found to point into a block and rewritten
  uint64_t refused = 0;          // requests answered with an error
};

class AddressTranslator {
 public:
  virtual ~AddressTranslator() = default;
  AddressTranslator(const AddressTranslator&) = delete;
  AddressTranslator& operator=(const AddressTranslator&) = delete;

  // "mapping" or "rewriting".
  virtual std::string_view name() const = 0;

  // The address through which `gpu` reaches [ptr, ptr + bytes) of the function: what a copy,
  // memset or library call is given. kInvalidValue unless the range lies inside one block;
  // kNotMapped if that block is not placed on `gpu`.
  virtual Result<uint64_t> translate(uint64_t ptr, uint64_t bytes, int gpu) = 0;

  // Makes a packed kernel parameter buffer right for a launch on `gpu`, in place. On an error
  // nothing is changed: kInvalidValue for a buffer that does not match the layout, kNotMapped
  // if an argument points into a block not placed on `gpu`.
  virtual Status translate_kernel_params(std::span<std::byte> params, const KernelInfo& kernel,
                                         int gpu) = 0;

  const TranslationCounters& counters() const { return counters_; }

 protected:
  // `table` must outlive the translator.
  explicit AddressTranslator(const BlockTable& table) : table_(table) {}
  // The range's block, placed on `gpu`: the checks both mechanisms share.
  Result<PointerTarget> placed_range(uint64_t ptr, uint64_t bytes, int gpu);

  const BlockTable& table_;
  TranslationCounters counters_;
};

// (a) The function's blocks are mapped at its own addresses (plan_mapping): pointers pass
// through unchanged once their range is checked.
class MappingTranslator final : public AddressTranslator {
 public:
  explicit MappingTranslator(const BlockTable& table) : AddressTranslator(table) {}
  std::string_view name() const override { return "mapping"; }
  Result<uint64_t> translate(uint64_t ptr, uint64_t bytes, int gpu) override;
  Status translate_kernel_params(std::span<std::byte> params, const KernelInfo& kernel,
                                 int gpu) override;
};

// Addresses below this are never rewritten: see the guard in the file comment.
inline constexpr uint64_t kMinRewritableAddress = uint64_t{1} << 32;

// (b) Pointers are rewritten to where their blocks lie in the GPU's pool.
class RewritingTranslator final : public AddressTranslator {
 public:
  // chunk_base[g][c]: the address at which chunk c of GPU g's pool is mapped for GPU g's use.
  // kInvalidValue unless there is a list per GPU of the table and the table's range starts at
  // kMinRewritableAddress or above.
  static Result<std::unique_ptr<RewritingTranslator>> create(
      const BlockTable& table, std::vector<std::vector<uint64_t>> chunk_base);

  std::string_view name() const override { return "rewriting"; }
  Result<uint64_t> translate(uint64_t ptr, uint64_t bytes, int gpu) override;
  Status translate_kernel_params(std::span<std::byte> params, const KernelInfo& kernel,
                                 int gpu) override;

 private:
  RewritingTranslator(const BlockTable& table, std::vector<std::vector<uint64_t>> chunk_base)
      : AddressTranslator(table), chunk_base_(std::move(chunk_base)) {}
  // Where `target` is on `gpu`: kNotMapped if its block is not placed there, kIllegalState if
  // its chunk has no base.
  Result<uint64_t> device_address(const PointerTarget& target, int gpu) const;

  std::vector<std::vector<uint64_t>> chunk_base_;
  std::vector<ArgumentPointer> found_;  // reused by every launch
  std::vector<uint64_t> rewritten_;     // likewise
};

}  // namespace hiber::memory
