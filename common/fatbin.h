// Reads NVIDIA code images without the driver: fatbin containers, cubin ELF files and PTX text.
//
// Used by the simulated GPU to find the kernels of a module and their parameter layouts, and by
// the client shim to learn layouts without a round trip. Input is untrusted: every offset and
// size is checked, and anything that does not parse is kInvalidImage with the reason.
//
// Formats (docs/fatbin.md has the details we rely on):
//  - fatbin: header {u32 magic 0xBA55ED50, u16 version, u16 header size, u64 body size}, then
//    entries {u16 kind (1 PTX, 2 cubin), ..., u32 header size, u64 payload size, ...,
//    u32 arch (e.g. 90), ..., u64 flags, ..., u64 uncompressed size}. Payloads may be
//    compressed: flag 0x2000 is LZ4, flag 0x8000 is Zstandard. Decompressed sizes are claims
//    until the data delivers them: output buffers grow with what is actually decompressed.
//  - cubin: an ELF64 file; each kernel has a .text.<name> section and a .nv.info.<name>
//    section whose EIATTR_KPARAM_INFO attributes give each parameter's ordinal, offset and size.
//  - PTX: `.entry name ( .param .<type> name, ... )` declarations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/kernel_info.h"
#include "common/status.h"

namespace hiber::fatbin {

enum class CodeKind { kPtx, kCubin };

struct CodeEntry {
  CodeKind kind = CodeKind::kCubin;
  uint32_t arch = 0;  // SM version: 80 for sm_80 / compute_80
  bool was_compressed = false;
  std::vector<std::byte> code;  // decompressed payload
};

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50;

// True if the bytes start like a fatbin / an ELF file.
bool is_fatbin(std::span<const std::byte> image);
bool is_elf(std::span<const std::byte> image);

// The entries of a fatbin, decompressed. kInvalidImage if malformed.
Result<std::vector<CodeEntry>> parse_fatbin(std::span<const std::byte> image);

// Kernels of a cubin, with parameter layouts. kInvalidImage if malformed.
Result<std::vector<KernelInfo>> cubin_kernels(std::span<const std::byte> cubin);

// Kernels declared in PTX text, with parameter layouts computed from the declared types and
// alignments (the same layout the CUDA ABI gives). kInvalidImage if malformed.
Result<std::vector<KernelInfo>> ptx_kernels(std::string_view ptx);

// Kernels of any image a module may be loaded from: a fatbin (every entry; layouts of a kernel
// found in several entries must agree), a cubin or PTX text. Sorted by name, each once.
// kInvalidImage if the image is none of these or is malformed.
Result<std::vector<KernelInfo>> image_kernels(std::span<const std::byte> image);

// The kernels of entries parse_fatbin returned, merged as image_kernels merges a fatbin's, for
// callers that also look at the entries themselves and so parse the fatbin only once.
Result<std::vector<KernelInfo>> fatbin_kernels(std::span<const CodeEntry> entries);

}  // namespace hiber::fatbin
