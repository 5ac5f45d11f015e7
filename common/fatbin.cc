#include "common/fatbin.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace hiber::fatbin {
namespace {

// Field offsets and values we rely on; docs/fatbin.md says how each was established.
constexpr uint16_t kFatbinVersion = 1;
constexpr size_t kFatbinHeaderBytes = 16;
constexpr size_t kEntryHeaderMinBytes = 64;  // the fields below all lie in the first 64 bytes
constexpr uint16_t kEntryKindPtx = 1;
constexpr uint16_t kEntryKindElf = 2;
constexpr uint64_t kFlagLz4 = 0x2000;
constexpr uint64_t kFlagZstd = 0x8000;

// Decompressed code of one fatbin, all entries together. Real fatbins are a few hundred MiB
// at most; the cap keeps a forged size field from exhausting memory.
constexpr uint64_t kMaxDecompressedBytes = uint64_t{1} << 30;

// ELF constants (elf.h names) and the CUDA-specific ones.
constexpr uint16_t kEmCuda = 190;        // EM_CUDA
constexpr uint32_t kShtSymtab = 2;       // SHT_SYMTAB
constexpr uint32_t kShtNobits = 8;       // SHT_NOBITS: occupies no file space
constexpr uint8_t kSttFunc = 2;          // STT_FUNC
constexpr uint8_t kStoCudaEntry = 0x10;  // st_other bit of a kernel (__global__) symbol
constexpr uint16_t kShnXindex = 0xffff;  // SHN_XINDEX
constexpr size_t kElfHeaderBytes = 64;
constexpr size_t kSectionHeaderBytes = 64;
constexpr size_t kProgramHeaderBytes = 56;
constexpr size_t kSymbolBytes = 24;

// .nv.info attribute encoding: u8 format, u8 attribute id, then a value.
constexpr uint8_t kEifmtNval = 0x01;             // no value (2 bytes of padding)
constexpr uint8_t kEifmtBval = 0x02;             // 1-byte value (+1 byte of padding)
constexpr uint8_t kEifmtHval = 0x03;             // 2-byte value
constexpr uint8_t kEifmtSval = 0x04;             // u16 size, then that many bytes
constexpr uint8_t kEiattrParamCbank = 0x0a;      // u32 symbol, u16 offset, u16 parameter bytes
constexpr uint8_t kEiattrKparamInfo = 0x17;      // one parameter, see parse_nv_info
constexpr uint8_t kEiattrCbankParamSize = 0x19;  // HVAL: parameter bytes

// Largest parameter buffer CUDA accepts is 32764 bytes; anything past 1 MiB is garbage.
constexpr uint64_t kMaxParamBytes = 1 << 20;

Status invalid(const std::string& what) { return Status(ErrorCode::kInvalidImage, what); }

// Little-endian reads at an offset the caller has bounds-checked.
template <typename T>
T load(std::span<const std::byte> bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;  // every host we build for is little-endian, like the formats
}

// True if [offset, offset + size) lies within `total` bytes, without overflow.
bool in_bounds(uint64_t offset, uint64_t size, uint64_t total) {
  return offset <= total && size <= total - offset;
}

// ---- fatbin ----

// Output buffers start this small and double as decompressed bytes actually arrive, so the
// memory a compressed entry costs follows what its data produces, never just what its header
// claims: a forged size with no data behind it fails after a few KiB.
constexpr size_t kFirstOutputBytes = 64 << 10;

// Doubles `out`, to at most `limit` bytes.
void grow(std::vector<std::byte>& out, uint64_t limit) {
  out.resize(static_cast<size_t>(std::min<uint64_t>(uint64_t{out.size()} * 2, limit)));
}

Result<std::vector<std::byte>> decompress_zstd(std::span<const std::byte> data,
                                               uint64_t declared_bytes, const std::string& where) {
  // The frame states its content size; it must be the one the entry declares.
  unsigned long long frame_bytes = ZSTD_getFrameContentSize(data.data(), data.size());
  if (frame_bytes != declared_bytes)
    return invalid(str_cat(
        where, ": Zstandard frame holds ",
        frame_bytes >= ZSTD_CONTENTSIZE_ERROR ? "an unknown size" : std::to_string(frame_bytes),
        " but the entry declares ", declared_bytes, " bytes"));
  // Streaming, into a buffer that grows with the output: the frame header's size is only a
  // claim until the blocks behind it deliver.
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> context(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (context == nullptr) return invalid(str_cat(where, ": out of memory for Zstandard"));
  std::vector<std::byte> out(
      static_cast<size_t>(std::min<uint64_t>(declared_bytes, kFirstOutputBytes)));
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  size_t produced = 0;
  while (true) {
    if (produced == out.size()) grow(out, declared_bytes);
    ZSTD_outBuffer chunk{out.data(), out.size(), produced};
    const size_t consumed_before = in.pos;
    const size_t left = ZSTD_decompressStream(context.get(), &chunk, &in);
    if (ZSTD_isError(left))
      return invalid(str_cat(where, ": Zstandard data is corrupt (", ZSTD_getErrorName(left), ")"));
    const bool progressed = in.pos != consumed_before || chunk.pos != produced;
    produced = chunk.pos;
    if (left == 0) break;  // the frame is complete
    if (!progressed) {
      if (in.pos == in.size)
        return invalid(str_cat(where, ": Zstandard data ends inside its frame, after ", produced,
                               " of ", declared_bytes, " bytes"));
      return invalid(str_cat(where, ": Zstandard data holds more than the ", declared_bytes,
                             " bytes the entry declares"));
    }
  }
  if (in.pos != in.size)
    return invalid(str_cat(where, ": ", in.size - in.pos,
                           " bytes follow the Zstandard frame inside its compressed size"));
  if (produced != declared_bytes)
    return invalid(str_cat(where, ": Zstandard data holds ", produced, " bytes, entry declares ",
                           declared_bytes));
  return out;
}

Result<std::vector<std::byte>> decompress_lz4(std::span<const std::byte> data,
                                              uint64_t declared_bytes, const std::string& where) {
  // An LZ4 block expands at most 255 times; a larger claim is forged.
  if (declared_bytes > uint64_t{data.size()} * 255 + 64)
    return invalid(str_cat(where, ": uncompressed size ", declared_bytes, " is impossible for ",
                           data.size(), " bytes of LZ4"));
  // A raw block has no frame to stream, so decode a growing prefix until the buffer is as large
  // as declared: a prefix shorter than the buffer is all the block holds. Redecoding from the
  // start costs at most twice the output.
  const char* src = reinterpret_cast<const char*>(data.data());
  const int src_bytes = static_cast<int>(data.size());
  std::vector<std::byte> out(
      static_cast<size_t>(std::min<uint64_t>(declared_bytes, kFirstOutputBytes)));
  while (out.size() < declared_bytes) {
    const int capacity = static_cast<int>(out.size());
    const int got = LZ4_decompress_safe_partial(src, reinterpret_cast<char*>(out.data()), src_bytes,
                                                capacity, capacity);
    if (got < 0) return invalid(str_cat(where, ": LZ4 data is corrupt"));
    if (got < capacity)
      return invalid(
          str_cat(where, ": LZ4 data holds ", got, " bytes, entry declares ", declared_bytes));
    grow(out, declared_bytes);
  }
  // The whole block, which must end exactly at the compressed size and fill the buffer.
  const int got = LZ4_decompress_safe(src, reinterpret_cast<char*>(out.data()), src_bytes,
                                      static_cast<int>(out.size()));
  if (got < 0) return invalid(str_cat(where, ": LZ4 data is corrupt"));
  if (static_cast<uint64_t>(got) != declared_bytes)
    return invalid(
        str_cat(where, ": LZ4 data holds ", got, " bytes, entry declares ", declared_bytes));
  return out;
}

Result<std::vector<std::byte>> decompress(std::span<const std::byte> payload, uint64_t flags,
                                          uint32_t compressed_bytes, uint64_t declared_bytes,
                                          uint64_t budget, const std::string& where) {
  if (compressed_bytes == 0 || compressed_bytes > payload.size() ||
      compressed_bytes > static_cast<uint32_t>(std::numeric_limits<int>::max()))
    return invalid(str_cat(where, ": compressed size ", compressed_bytes,
                           " does not fit the payload of ", payload.size(), " bytes"));
  if (declared_bytes == 0 || declared_bytes > budget)
    return invalid(str_cat(where, ": uncompressed size ", declared_bytes, " is zero or beyond the ",
                           kMaxDecompressedBytes, "-byte limit for one fatbin"));
  std::span<const std::byte> data = payload.first(compressed_bytes);
  if (flags & kFlagZstd) return decompress_zstd(data, declared_bytes, where);
  return decompress_lz4(data, declared_bytes, where);
}

// ---- cubin (ELF) ----

struct Section {
  uint32_t name = 0;
  uint32_t type = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
  uint64_t entry_size = 0;
};

class Elf {
 public:
  static Result<Elf> open(std::span<const std::byte> image);

  size_t section_count() const { return sections_.size(); }
  const Section& section(size_t i) const { return sections_[i]; }
  std::span<const std::byte> contents(size_t i) const;
  // A NUL-terminated string at `offset` in string table section `table`.
  Result<std::string_view> string(size_t table, uint64_t offset) const;
  Result<std::string_view> section_name(size_t i) const {
    return string(shstrndx_, sections_[i].name);
  }

 private:
  std::span<const std::byte> image_;
  std::vector<Section> sections_;
  size_t shstrndx_ = 0;
};

Result<Elf> Elf::open(std::span<const std::byte> image) {
  if (image.size() < kElfHeaderBytes) return invalid("cubin: shorter than an ELF64 header");
  if (!is_elf(image)) return invalid("cubin: no ELF magic");
  if (load<uint8_t>(image, 4) != 2 || load<uint8_t>(image, 5) != 1)
    return invalid("cubin: not a 64-bit little-endian ELF file");
  uint16_t machine = load<uint16_t>(image, 18);
  if (machine != kEmCuda)
    return invalid(str_cat("cubin: ELF machine ", machine, " is not EM_CUDA (190)"));
  uint64_t shoff = load<uint64_t>(image, 40);
  uint16_t shentsize = load<uint16_t>(image, 58);
  uint64_t shnum = load<uint16_t>(image, 60);
  uint64_t shstrndx = load<uint16_t>(image, 62);
  if (shoff == 0) return invalid("cubin: no section header table");
  if (shentsize < kSectionHeaderBytes)
    return invalid(str_cat("cubin: section header size ", shentsize, " is below 64"));
  if (!in_bounds(shoff, shentsize, image.size()))
    return invalid("cubin: section header table lies past the end");
  // Extended numbering: with 0xff00 or more sections the counts live in section 0.
  if (shnum == 0) shnum = load<uint64_t>(image, shoff + 32);
  if (shstrndx == kShnXindex) shstrndx = load<uint32_t>(image, shoff + 40);
  if (shnum > (image.size() - shoff) / shentsize)
    return invalid(str_cat("cubin: ", shnum, " section headers do not fit in the file"));
  if (shstrndx >= shnum) return invalid("cubin: section name table index out of range");

  Elf elf;
  elf.image_ = image;
  elf.shstrndx_ = static_cast<size_t>(shstrndx);
  elf.sections_.reserve(static_cast<size_t>(shnum));
  for (uint64_t i = 0; i < shnum; ++i) {
    size_t at = static_cast<size_t>(shoff + i * shentsize);
    Section s;
    s.name = load<uint32_t>(image, at);
    s.type = load<uint32_t>(image, at + 4);
    s.offset = load<uint64_t>(image, at + 24);
    s.size = load<uint64_t>(image, at + 32);
    s.link = load<uint32_t>(image, at + 40);
    s.entry_size = load<uint64_t>(image, at + 56);
    if (s.type != kShtNobits && !in_bounds(s.offset, s.size, image.size()))
      return invalid(str_cat("cubin: section ", i, " (", s.size, " bytes at ", hex(s.offset),
                             ") lies past the end of the file"));
    elf.sections_.push_back(s);
  }
  // Segments are not read, but a file whose program headers are cut off is not a whole cubin.
  uint64_t phoff = load<uint64_t>(image, 32);
  uint16_t phentsize = load<uint16_t>(image, 54);
  uint16_t phnum = load<uint16_t>(image, 56);
  if (phnum != 0) {
    if (phentsize < kProgramHeaderBytes ||
        !in_bounds(phoff, uint64_t{phnum} * phentsize, image.size()))
      return invalid("cubin: program header table lies past the end of the file");
    for (uint16_t i = 0; i < phnum; ++i) {
      size_t at = static_cast<size_t>(phoff + uint64_t{i} * phentsize);
      if (!in_bounds(load<uint64_t>(image, at + 8), load<uint64_t>(image, at + 32), image.size()))
        return invalid(str_cat("cubin: segment ", i, " lies past the end of the file"));
    }
  }
  return elf;
}

std::span<const std::byte> Elf::contents(size_t i) const {
  const Section& s = sections_[i];  // bounds checked by open()
  if (s.type == kShtNobits) return {};
  return image_.subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.size));
}

Result<std::string_view> Elf::string(size_t table, uint64_t offset) const {
  if (table >= sections_.size()) return invalid("cubin: string table index out of range");
  std::span<const std::byte> strings = contents(table);
  if (offset >= strings.size())
    return invalid(str_cat("cubin: string offset ", offset, " past its table"));
  const char* begin = reinterpret_cast<const char*>(strings.data()) + offset;
  const void* nul = std::memchr(begin, 0, strings.size() - static_cast<size_t>(offset));
  if (nul == nullptr) return invalid("cubin: unterminated string");
  return std::string_view(begin, static_cast<const char*>(nul) - begin);
}

struct KParam {
  uint16_t ordinal;
  uint16_t offset;
  uint32_t bytes;
};

// Reads one kernel's .nv.info section: its parameters and, where stated, its total parameter
// bytes.
Status parse_nv_info(std::span<const std::byte> info, const std::string& kernel,
                     std::vector<KParam>& params, std::optional<uint32_t>& declared_bytes) {
  size_t at = 0;
  while (at < info.size()) {
    if (info.size() - at < 4)
      return invalid(str_cat("cubin: .nv.info.", kernel, ": attribute truncated at ", at));
    uint8_t format = load<uint8_t>(info, at);
    uint8_t attribute = load<uint8_t>(info, at + 1);
    if (format == kEifmtNval || format == kEifmtBval) {
      at += 4;
    } else if (format == kEifmtHval) {
      if (attribute == kEiattrCbankParamSize) declared_bytes = load<uint16_t>(info, at + 2);
      at += 4;
    } else if (format == kEifmtSval) {
      size_t value_bytes = load<uint16_t>(info, at + 2);
      size_t value_at = at + 4;
      if (value_bytes > info.size() - value_at)
        return invalid(str_cat("cubin: .nv.info.", kernel, ": attribute ", hex(attribute), " of ",
                               value_bytes, " bytes runs past the section"));
      if (attribute == kEiattrKparamInfo) {
        if (value_bytes < 12)
          return invalid(str_cat("cubin: .nv.info.", kernel, ": KPARAM_INFO of ", value_bytes,
                                 " bytes, expected 12"));
        // u32 index, u16 ordinal, u16 offset, u32 info; the top 14 bits of info are the size.
        KParam p;
        p.ordinal = load<uint16_t>(info, value_at + 4);
        p.offset = load<uint16_t>(info, value_at + 6);
        p.bytes = load<uint32_t>(info, value_at + 8) >> 18;
        params.push_back(p);
      } else if (attribute == kEiattrParamCbank && value_bytes >= 8) {
        declared_bytes = load<uint16_t>(info, value_at + 6);
      }
      at = value_at + value_bytes;
    } else {
      return invalid(str_cat("cubin: .nv.info.", kernel, ": unknown attribute format ", hex(format),
                             " at ", at));
    }
  }
  return Status();
}

Result<KernelInfo> kernel_layout(const std::string& name, std::span<const std::byte> info) {
  std::vector<KParam> params;
  std::optional<uint32_t> declared_bytes;
  HIBER_RETURN_IF_ERROR(parse_nv_info(info, name, params, declared_bytes));
  std::sort(params.begin(), params.end(),
            [](const KParam& a, const KParam& b) { return a.ordinal < b.ordinal; });
  KernelInfo kernel{name, {}};
  uint64_t end = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const KParam& p = params[i];
    if (p.ordinal != i)
      return invalid(str_cat("cubin: kernel ", name, ": parameter ordinals are not 0..",
                             params.size() - 1, " (", i, " is missing or repeated)"));
    if (p.offset < end)
      return invalid(str_cat("cubin: kernel ", name, ": parameter ", i, " at offset ", p.offset,
                             " overlaps the one before (which ends at ", end, ")"));
    end = uint64_t{p.offset} + p.bytes;
    kernel.params.push_back({p.offset, p.bytes});
  }
  if (declared_bytes && params.empty() && *declared_bytes != 0)
    return invalid(str_cat("cubin: kernel ", name, " declares ", *declared_bytes,
                           " bytes of parameters but describes none"));
  if (declared_bytes && !params.empty() && *declared_bytes != end)
    return invalid(str_cat("cubin: kernel ", name, " declares ", *declared_bytes,
                           " bytes of parameters but its last one ends at ", end));
  return kernel;
}

// ---- PTX ----

// Splits PTX into tokens: words (directives, identifiers, numbers) and single punctuation
// characters. Comments and whitespace separate tokens; quoted strings are one token.
class PtxTokens {
 public:
  explicit PtxTokens(std::string_view text) : text_(text) {}

  // The next token, or an empty view at the end.
  std::string_view next() {
    skip_space_and_comments();
    if (at_ >= text_.size()) return {};
    size_t start = at_;
    char c = text_[at_];
    if (c == '"') {
      size_t close = text_.find('"', at_ + 1);
      at_ = close == std::string_view::npos ? text_.size() : close + 1;
    } else if (is_word_char(c)) {
      while (at_ < text_.size() && is_word_char(text_[at_])) ++at_;
    } else {
      ++at_;
    }
    return text_.substr(start, at_ - start);
  }

  std::string_view peek() {
    size_t saved = at_;
    std::string_view token = next();
    at_ = saved;
    return token;
  }

 private:
  static bool is_word_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '$' ||
           c == '%';
  }
  void skip_space_and_comments() {
    while (at_ < text_.size()) {
      if (std::isspace(static_cast<unsigned char>(text_[at_]))) {
        ++at_;
      } else if (text_.substr(at_, 2) == "//") {
        size_t eol = text_.find('\n', at_);
        at_ = eol == std::string_view::npos ? text_.size() : eol + 1;
      } else if (text_.substr(at_, 2) == "/*") {
        size_t close = text_.find("*/", at_ + 2);
        at_ = close == std::string_view::npos ? text_.size() : close + 2;
      } else {
        return;
      }
    }
  }

  std::string_view text_;
  size_t at_ = 0;
};

// Bytes of a PTX fundamental type usable as a kernel parameter; 0 if not one.
uint32_t ptx_type_bytes(std::string_view type) {
  static const std::map<std::string_view, uint32_t> kTypes = {
      {".b8", 1},  {".s8", 1},  {".u8", 1},    {".b16", 2},    {".s16", 2},
      {".u16", 2}, {".f16", 2}, {".bf16", 2},  {".b32", 4},    {".s32", 4},
      {".u32", 4}, {".f32", 4}, {".f16x2", 4}, {".bf16x2", 4}, {".b64", 8},
      {".s64", 8}, {".u64", 8}, {".f64", 8},   {".b128", 16},
  };
  auto it = kTypes.find(type);
  return it == kTypes.end() ? 0 : it->second;
}

Result<uint64_t> ptx_number(std::string_view token, const std::string& where) {
  uint64_t value = 0;
  if (token.empty() || token.size() > 9 ||
      !std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return invalid(str_cat(where, ": expected a decimal number, found '", token, "'"));
  for (char c : token) value = value * 10 + static_cast<uint64_t>(c - '0');
  return value;
}

// Parses `( .param ... , ... )` after `.entry <name>`; the '(' is already consumed.
Result<KernelInfo> ptx_params(PtxTokens& tokens, const std::string& name) {
  KernelInfo kernel{name, {}};
  uint64_t end = 0;
  std::string_view token = tokens.next();
  if (token == ")") return kernel;
  while (true) {
    const std::string where = str_cat("PTX: kernel ", name, " parameter ", kernel.params.size());
    if (token != ".param") return invalid(str_cat(where, ": expected .param, found '", token, "'"));
    uint64_t align = 0;
    uint32_t type_bytes = 0;
    bool pointer_attributes = false;
    token = tokens.next();
    // `.align N` before the type aligns the parameter; after `.ptr` it is the pointee's.
    while (!token.empty() && token[0] == '.') {
      if (token == ".align") {
        HIBER_ASSIGN_OR_RETURN(uint64_t n, ptx_number(tokens.next(), where));
        if (n == 0 || (n & (n - 1)) != 0 || n > 4096)
          return invalid(str_cat(where, ": .align ", n, " is not a power of two up to 4096"));
        if (!pointer_attributes) align = n;
      } else if (token == ".ptr") {
        pointer_attributes = true;
      } else if (uint32_t bytes = ptx_type_bytes(token); bytes != 0 && type_bytes == 0) {
        type_bytes = bytes;
      } else if (!pointer_attributes) {
        return invalid(str_cat(where, ": unsupported parameter type '", token, "'"));
      }  // else a state space of .ptr (.global, .const, ...): no effect on the layout
      token = tokens.next();
    }
    if (type_bytes == 0) return invalid(str_cat(where, ": no type"));
    if (token.empty() || token == "," || token == ")") return invalid(str_cat(where, ": no name"));
    uint64_t count = 1;
    token = tokens.next();
    if (token == "[") {
      HIBER_ASSIGN_OR_RETURN(count, ptx_number(tokens.next(), where));
      if (count == 0) return invalid(str_cat(where, ": empty array"));
      if (tokens.next() != "]") return invalid(str_cat(where, ": expected ']'"));
      token = tokens.next();
    }
    if (align == 0) align = type_bytes;
    uint64_t offset = (end + align - 1) / align * align;
    uint64_t bytes = count * type_bytes;
    if (offset + bytes > kMaxParamBytes)
      return invalid(str_cat(where, ": parameters exceed ", kMaxParamBytes, " bytes"));
    kernel.params.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(bytes)});
    end = offset + bytes;
    if (token == ")") return kernel;
    if (token != ",") return invalid(str_cat(where, ": expected ',' or ')', found '", token, "'"));
    token = tokens.next();
  }
}

std::string_view as_text(std::span<const std::byte> bytes) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return text.substr(0, text.find('\0'));  // PTX in a fatbin is NUL-terminated and padded
}

// True if the first token of the text is a PTX comment or the .version directive.
bool looks_like_ptx(std::string_view text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return false;
  text.remove_prefix(first);
  return text.starts_with("//") || text.starts_with("/*") || text.starts_with(".version");
}

std::string describe_layout(const KernelInfo& kernel) {
  std::string out = "(";
  for (size_t i = 0; i < kernel.params.size(); ++i)
    out += str_cat(i ? ", " : "", kernel.params[i].bytes, "@", kernel.params[i].offset);
  return out + ")";
}

Result<std::vector<KernelInfo>> entry_kernels(const CodeEntry& entry) {
  if (entry.kind == CodeKind::kCubin) return cubin_kernels(entry.code);
  return ptx_kernels(as_text(entry.code));
}

}  // namespace

bool is_fatbin(std::span<const std::byte> image) {
  return image.size() >= 4 && load<uint32_t>(image, 0) == kFatbinMagic;
}

bool is_elf(std::span<const std::byte> image) {
  return image.size() >= 4 && std::memcmp(image.data(),
                                          "\x7f"
                                          "ELF",
                                          4) == 0;
}

Result<std::vector<CodeEntry>> parse_fatbin(std::span<const std::byte> image) {
  if (image.size() < kFatbinHeaderBytes)
    return invalid(str_cat("fatbin: ", image.size(), " bytes is shorter than its 16-byte header"));
  if (!is_fatbin(image))
    return invalid(
        str_cat("fatbin: magic ", hex(load<uint32_t>(image, 0)), " is not ", hex(kFatbinMagic)));
  uint16_t version = load<uint16_t>(image, 4);
  uint16_t header_bytes = load<uint16_t>(image, 6);
  uint64_t body_bytes = load<uint64_t>(image, 8);
  if (version != kFatbinVersion)
    return invalid(str_cat("fatbin: version ", version, " is not supported (only 1)"));
  if (header_bytes < kFatbinHeaderBytes)
    return invalid(str_cat("fatbin: header size ", header_bytes, " is below 16"));
  if (!in_bounds(header_bytes, body_bytes, image.size()))
    return invalid(str_cat("fatbin: header declares ", body_bytes, " bytes of entries but only ",
                           image.size() - std::min<size_t>(header_bytes, image.size()),
                           " follow it"));

  std::vector<CodeEntry> entries;
  uint64_t budget = kMaxDecompressedBytes;
  const uint64_t end = header_bytes + body_bytes;
  uint64_t at = header_bytes;
  for (int index = 0; at < end; ++index) {
    const std::string where = str_cat("fatbin entry ", index, " at ", hex(at));
    if (end - at < kEntryHeaderMinBytes)
      return invalid(str_cat(where, ": header truncated (", end - at, " bytes left)"));
    uint16_t kind = load<uint16_t>(image, at);
    uint32_t entry_header_bytes = load<uint32_t>(image, at + 4);
    uint64_t payload_bytes = load<uint64_t>(image, at + 8);
    uint32_t compressed_bytes = load<uint32_t>(image, at + 16);
    uint32_t arch = load<uint32_t>(image, at + 28);
    uint64_t flags = load<uint64_t>(image, at + 40);
    uint64_t uncompressed_bytes = load<uint64_t>(image, at + 56);
    if (entry_header_bytes < kEntryHeaderMinBytes || entry_header_bytes > end - at)
      return invalid(str_cat(where, ": entry header size ", entry_header_bytes,
                             " is below 64 or past the end"));
    const uint64_t payload_at = at + entry_header_bytes;
    if (payload_bytes > end - payload_at)
      return invalid(str_cat(where, ": payload of ", payload_bytes, " bytes runs past the end (",
                             end - payload_at, " bytes left)"));
    at = payload_at + payload_bytes;
    // Other kinds (8: LTO IR for nvJitLink) are nothing a module can be loaded from.
    if (kind != kEntryKindPtx && kind != kEntryKindElf) continue;

    CodeEntry entry;
    entry.kind = kind == kEntryKindPtx ? CodeKind::kPtx : CodeKind::kCubin;
    entry.arch = arch;
    auto payload =
        image.subspan(static_cast<size_t>(payload_at), static_cast<size_t>(payload_bytes));
    if ((flags & kFlagLz4) && (flags & kFlagZstd))
      return invalid(str_cat(where, ": flags ", hex(flags), " name both LZ4 and Zstandard"));
    if (flags & (kFlagLz4 | kFlagZstd)) {
      HIBER_ASSIGN_OR_RETURN(entry.code, decompress(payload, flags, compressed_bytes,
                                                    uncompressed_bytes, budget, where));
      entry.was_compressed = true;
    } else {
      if (payload_bytes > budget)
        return invalid(str_cat(where, ": code beyond the ", kMaxDecompressedBytes, "-byte limit"));
      entry.code.assign(payload.begin(), payload.end());
    }
    budget -= entry.code.size();
    entries.push_back(std::move(entry));
  }
  return entries;
}

Result<std::vector<KernelInfo>> cubin_kernels(std::span<const std::byte> cubin) {
  HIBER_ASSIGN_OR_RETURN(Elf elf, Elf::open(cubin));

  // Per-kernel attribute sections by the name they describe.
  std::map<std::string_view, size_t> info_sections;
  std::optional<size_t> symtab;
  for (size_t i = 0; i < elf.section_count(); ++i) {
    HIBER_ASSIGN_OR_RETURN(std::string_view name, elf.section_name(i));
    if (name.starts_with(".nv.info.")) info_sections[name.substr(9)] = i;
    if (elf.section(i).type == kShtSymtab) {
      if (symtab) return invalid("cubin: more than one symbol table");
      symtab = i;
    }
  }
  std::vector<KernelInfo> kernels;
  if (!symtab) return kernels;  // no symbols, so no kernels

  const Section& table = elf.section(*symtab);
  if (table.entry_size < kSymbolBytes)
    return invalid(str_cat("cubin: symbol size ", table.entry_size, " is below 24"));
  if (table.link >= elf.section_count()) return invalid("cubin: symbol string table out of range");
  std::span<const std::byte> symbols = elf.contents(*symtab);
  std::set<std::string_view> seen;
  const uint64_t symbol_count = symbols.size() / table.entry_size;
  for (uint64_t i = 0; i < symbol_count; ++i) {
    const size_t at = static_cast<size_t>(i * table.entry_size);
    uint8_t info = load<uint8_t>(symbols, at + 4);
    uint8_t other = load<uint8_t>(symbols, at + 5);
    if ((info & 0xf) != kSttFunc || (other & kStoCudaEntry) == 0) continue;
    HIBER_ASSIGN_OR_RETURN(std::string_view name,
                           elf.string(table.link, load<uint32_t>(symbols, at)));
    if (!seen.insert(name).second) return invalid(str_cat("cubin: kernel ", name, " twice"));
    auto it = info_sections.find(name);
    if (it == info_sections.end())
      return invalid(str_cat("cubin: kernel ", name, " has no .nv.info.", name,
                             " section, so its parameters are unknown"));
    HIBER_ASSIGN_OR_RETURN(KernelInfo kernel,
                           kernel_layout(std::string(name), elf.contents(it->second)));
    kernels.push_back(std::move(kernel));
  }
  std::sort(kernels.begin(), kernels.end(),
            [](const KernelInfo& a, const KernelInfo& b) { return a.name < b.name; });
  return kernels;
}

Result<std::vector<KernelInfo>> ptx_kernels(std::string_view ptx) {
  ptx = ptx.substr(0, ptx.find('\0'));
  PtxTokens tokens(ptx);
  if (tokens.next() != ".version") return invalid("PTX: does not begin with a .version directive");

  std::vector<KernelInfo> kernels;
  std::set<std::string> seen;
  int depth = 0;  // braces: kernels are declared at the top level only
  std::string_view previous;
  for (std::string_view token = tokens.next(); !token.empty();
       previous = token, token = tokens.next()) {
    if (token == "{") ++depth;
    if (token == "}" && --depth < 0) return invalid("PTX: unbalanced '}'");
    if (token != ".entry" || depth != 0) continue;
    const bool declaration_only = previous == ".extern";
    std::string name(tokens.next());
    if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_' ||
                          name[0] == '$' || name[0] == '%'))
      return invalid(str_cat("PTX: .entry without a valid name ('", name, "')"));
    KernelInfo kernel{name, {}};
    if (tokens.peek() == "(") {
      tokens.next();
      HIBER_ASSIGN_OR_RETURN(kernel, ptx_params(tokens, name));
    }
    if (declaration_only) continue;
    if (!seen.insert(name).second) return invalid(str_cat("PTX: kernel ", name, " twice"));
    kernels.push_back(std::move(kernel));
  }
  if (depth != 0) return invalid("PTX: unbalanced '{'");
  std::sort(kernels.begin(), kernels.end(),
            [](const KernelInfo& a, const KernelInfo& b) { return a.name < b.name; });
  return kernels;
}

Result<std::vector<KernelInfo>> image_kernels(std::span<const std::byte> image) {
  if (is_elf(image)) return cubin_kernels(image);
  if (!is_fatbin(image)) {
    std::string_view text = as_text(image);
    if (looks_like_ptx(text)) return ptx_kernels(text);
    return invalid("not a fatbin, cubin or PTX image");
  }
  HIBER_ASSIGN_OR_RETURN(std::vector<CodeEntry> entries, parse_fatbin(image));
  return fatbin_kernels(entries);
}

Result<std::vector<KernelInfo>> fatbin_kernels(std::span<const CodeEntry> entries) {
  std::map<std::string, KernelInfo> merged;
  std::map<std::string, size_t> found_in;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto kernels = entry_kernels(entries[i]);
    if (!kernels.ok())
      return kernels.status().with_context(
          str_cat("fatbin entry ", i, " (", entries[i].kind == CodeKind::kPtx ? "PTX" : "cubin",
                  ", arch ", entries[i].arch, ")"));
    for (KernelInfo& kernel : *kernels) {
      auto [it, inserted] = merged.try_emplace(kernel.name, kernel);
      if (inserted) {
        found_in[kernel.name] = i;
      } else if (it->second != kernel) {
        return invalid(str_cat("fatbin: kernel ", kernel.name, " has parameters ",
                               describe_layout(it->second), " in entry ", found_in[kernel.name],
                               " but ", describe_layout(kernel), " in entry ", i,
                               " (bytes@offset)"));
      }
    }
  }
  std::vector<KernelInfo> out;
  out.reserve(merged.size());
  for (auto& [name, kernel] : merged) out.push_back(std::move(kernel));
  return out;
}

}  // namespace hiber::fatbin
