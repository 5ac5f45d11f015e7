#include "memory/translation.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace hiber::memory {

// ---- Mapping: the plan of a swap ----

std::vector<VaRange> MapPlan::va_runs() const {
  std::vector<VaRange> runs;
  for (const MapCall& call : calls) {
    if (!runs.empty() && runs.back().va + runs.back().bytes == call.va) {
      runs.back().bytes += call.bytes;
    } else {
      runs.push_back({call.va, call.bytes});
    }
  }
  return runs;
}

std::vector<MapCall> block_map_calls(const VirtualBlock& block, int gpu, uint64_t at) {
  std::vector<MapCall> calls;
  uint64_t covered = 0;
  for (const Allocation& piece : block.on(gpu).pieces) {
    if (covered == block.bytes) break;
    const uint64_t bytes = std::min(piece.bytes, block.bytes - covered);
    calls.push_back(MapCall{at + covered, bytes, piece.where.chunk, piece.where.offset});
    covered += bytes;
  }
  return calls;
}

Result<MapPlan> plan_mapping(const BlockTable& table, int gpu, const BlockFilter& include) {
  if (gpu < 0 || gpu >= table.gpu_count()) {
    return error(ErrorCode::kInvalidValue, "map plan: GPU ", gpu, " of ", table.gpu_count());
  }
  const uint64_t granule_mask = table.granularity() - 1;
  MapPlan plan;
  plan.gpu = gpu;
  for (const VirtualBlock& block : table.blocks()) {
    if (include && !include(block)) continue;
    if (!block.on(gpu).placed()) {
      ++plan.unplaced_blocks;
      continue;
    }
    ++plan.blocks;
    plan.bytes += block.bytes;
    for (const MapCall& call : block_map_calls(block, gpu, block.va)) {
      if ((call.chunk_offset & granule_mask) != 0) {
        return error(ErrorCode::kInvalidValue, "map plan: block ", hex(block.va),
                     " is placed at offset ", call.chunk_offset, " of chunk ", call.chunk,
                     ", not a multiple of the granularity ", table.granularity());
      }
      if (!plan.calls.empty()) {
        MapCall& last = plan.calls.back();
        if (last.va + last.bytes == call.va && last.chunk == call.chunk &&
            last.chunk_offset + last.bytes == call.chunk_offset) {
          last.bytes += call.bytes;
          continue;
        }
      }
      plan.calls.push_back(call);
    }
  }
  return plan;
}

// ---- Kernel arguments ----

namespace {

uint64_t word_at(std::span<const std::byte> bytes, size_t at) {
  uint64_t word;
  std::memcpy(&word, bytes.data() + at, sizeof(word));
  return word;
}

// Guard 2 (translation.h): inside the function's range...
bool in_range(const BlockTable& table, uint64_t word) {
  return word - table.range_base() <= table.range_bytes();
}

// ...and inside (or at the end of) a live block.
PointerTarget guarded_target(const BlockTable& table, uint64_t word) {
  return in_range(table, word) ? table.resolve(word) : PointerTarget{};
}

}  // namespace

Result<uint64_t> scan_kernel_params(const BlockTable& table, std::span<const std::byte> params,
                                    const KernelInfo& kernel, std::vector<ArgumentPointer>& found) {
  found.clear();
  if (params.size() != kernel.param_bytes()) {
    return error(ErrorCode::kInvalidValue, "kernel ", kernel.name, ": ", params.size(),
                 " bytes of parameters, its layout has ", kernel.param_bytes());
  }
  uint64_t scanned = 0;
  for (const ParamInfo& param : kernel.params) {
    const uint64_t end = uint64_t{param.offset} + param.bytes;
    if (end > params.size()) {
      found.clear();
      return error(ErrorCode::kInvalidValue, "kernel ", kernel.name, ": parameter at offset ",
                   param.offset, " of ", param.bytes, " bytes lies outside the ", params.size(),
                   "-byte buffer");
    }
    // Guard 1: only a parameter that can hold a pointer, and only its aligned words.
    if (!may_hold_pointer(param)) continue;
    for (uint64_t at = param.offset; at + 8 <= end; at += 8) {
      ++scanned;
      const PointerTarget target = guarded_target(table, word_at(params, at));
      if (target.found()) found.push_back({static_cast<uint32_t>(at), target});
    }
  }
  return scanned;
}

bool holds_block_pointers(const BlockTable& table, uint64_t dst, std::span<const std::byte> data) {
  const auto pointer_at = [&](size_t at) {
    return guarded_target(table, word_at(data, at)).found();
  };
  size_t at = (8 - dst % 8) % 8;
  // Eight words at a time, without a branch per word: almost all data has no word in the range,
  // and only a run that has one is looked at word by word.
  constexpr size_t kRun = 8 * sizeof(uint64_t);
  for (; at + kRun <= data.size(); at += kRun) {
    uint64_t words[8];
    std::memcpy(words, data.data() + at, sizeof(words));
    bool any_in_range = false;
    for (uint64_t word : words) any_in_range |= in_range(table, word);
    if (!any_in_range) continue;
    for (size_t i = 0; i < kRun; i += 8) {
      if (pointer_at(at + i)) return true;
    }
  }
  for (; at + 8 <= data.size(); at += 8) {
    if (pointer_at(at)) return true;
  }
  return false;
}

// ---- The translators ----

Result<PointerTarget> AddressTranslator::placed_range(uint64_t ptr, uint64_t bytes, int gpu) {
  if (gpu < 0 || gpu >= table_.gpu_count()) {
    ++counters_.refused;
    return error(ErrorCode::kInvalidValue, name(), ": GPU ", gpu, " of ", table_.gpu_count());
  }
  Result<PointerTarget> target = table_.resolve_range(ptr, bytes);
  if (!target.ok()) {
    ++counters_.refused;
    return target.status().with_context(name());
  }
  if (!target->block->on(gpu).placed()) {
    ++counters_.refused;
    return error(ErrorCode::kNotMapped, name(), ": block ", hex(target->block->va),
                 " is not placed on GPU ", gpu);
  }
  return target;
}

Result<uint64_t> MappingTranslator::translate(uint64_t ptr, uint64_t bytes, int gpu) {
  HIBER_RETURN_IF_ERROR(placed_range(ptr, bytes, gpu).status());
  ++counters_.ranges;
  return ptr;
}

Status MappingTranslator::translate_kernel_params(std::span<std::byte> params,
                                                  const KernelInfo& kernel, int gpu) {
  if (gpu < 0 || gpu >= table_.gpu_count() || params.size() != kernel.param_bytes()) {
    ++counters_.refused;
    return error(ErrorCode::kInvalidValue, "mapping: kernel ", kernel.name, " on GPU ", gpu,
                 " with ", params.size(), " bytes of parameters, its layout has ",
                 kernel.param_bytes());
  }
  ++counters_.launches;
  return Status();
}

Result<std::unique_ptr<RewritingTranslator>> RewritingTranslator::create(
    const BlockTable& table, std::vector<std::vector<uint64_t>> chunk_base) {
  if (chunk_base.size() != static_cast<size_t>(table.gpu_count())) {
    return error(ErrorCode::kInvalidValue, "rewriting: chunk bases for ", chunk_base.size(),
                 " GPUs, the table has ", table.gpu_count());
  }
  if (table.range_base() < kMinRewritableAddress) {
    return error(ErrorCode::kInvalidValue, "rewriting: the range at ", hex(table.range_base()),
                 " starts below 4 GiB, where small integers would pass for pointers");
  }
  return std::unique_ptr<RewritingTranslator>(
      new RewritingTranslator(table, std::move(chunk_base)));
}

Result<uint64_t> RewritingTranslator::device_address(const PointerTarget& target, int gpu) const {
  const Placement& placement = target.block->on(gpu);
  if (!placement.placed()) {
    return error(ErrorCode::kNotMapped, "rewriting: block ", hex(target.block->va),
                 " is not placed on GPU ", gpu);
  }
  // Rewritten pointers address pool memory directly, so a block must be one piece there: a
  // kernel given a pointer into it may reach any of its bytes.
  if (placement.pieces.size() != 1) {
    return error(ErrorCode::kNotMapped, "rewriting: block ", hex(target.block->va), " of ",
                 target.block->bytes, " bytes is placed in ", placement.pieces.size(),
                 " pieces on GPU ", gpu, "; rewriting needs it in one (use the mapping mechanism)");
  }
  const Allocation& where = placement.pieces.front();
  const std::vector<uint64_t>& bases = chunk_base_[gpu];
  if (where.where.chunk >= bases.size()) {
    return error(ErrorCode::kIllegalState, "rewriting: block ", hex(target.block->va),
                 " is in chunk ", where.where.chunk, " of GPU ", gpu, ", which has ", bases.size(),
                 " chunks");
  }
  return bases[where.where.chunk] + where.where.offset + target.offset;
}

Result<uint64_t> RewritingTranslator::translate(uint64_t ptr, uint64_t bytes, int gpu) {
  HIBER_ASSIGN_OR_RETURN(const PointerTarget target, placed_range(ptr, bytes, gpu));
  Result<uint64_t> address = device_address(target, gpu);
  if (!address.ok()) {
    ++counters_.refused;
    return address;
  }
  ++counters_.ranges;
  return address;
}

Status RewritingTranslator::translate_kernel_params(std::span<std::byte> params,
                                                    const KernelInfo& kernel, int gpu) {
  if (gpu < 0 || gpu >= table_.gpu_count()) {
    ++counters_.refused;
    return error(ErrorCode::kInvalidValue, "rewriting: GPU ", gpu, " of ", table_.gpu_count());
  }
  Result<uint64_t> scanned = scan_kernel_params(table_, params, kernel, found_);
  if (!scanned.ok()) {
    ++counters_.refused;
    return scanned.status();
  }
  counters_.words_scanned += *scanned;
  // Every address first, so that an error leaves the buffer as it was.
  rewritten_.clear();
  for (const ArgumentPointer& pointer : found_) {
    Result<uint64_t> address = device_address(pointer.target, gpu);
    if (!address.ok()) {
      ++counters_.refused;
      return address.status().with_context(
          str_cat("kernel ", kernel.name, ", argument word at offset ", pointer.offset));
    }
    rewritten_.push_back(*address);
  }
  for (size_t i = 0; i < found_.size(); ++i) {
    std::memcpy(params.data() + found_[i].offset, &rewritten_[i], sizeof(uint64_t));
  }
  counters_.words_rewritten += found_.size();
  ++counters_.launches;
  return Status();
}

}  // namespace hiber::memory
