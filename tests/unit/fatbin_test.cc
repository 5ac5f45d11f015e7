// Tests of common/fatbin: real nvcc-built images (where the toolkit was present at build time),
// hand-built containers and cubins for each rule, and malformed input that must be rejected
// without crashing.
#include "common/fatbin.h"

#include <gtest/gtest.h>
#include <lz4.h>
#include <zstd.h>

#include <new>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/kernels/test_kernels.h"

// The largest block the current thread asked operator new for while tracking: the
// decompression tests check that a forged size costs only what the data delivers. Every other
// form of new and delete ends up here or in the library's own matching pair.
namespace {
thread_local bool t_tracking_allocations = false;
thread_local size_t t_largest_allocation = 0;
}  // namespace

// noipa: GCC knows operator new and free() as a mismatched pair, and warns wherever it sees
// through these replacements (-Wmismatched-new-delete); here the memory does come from malloc.
__attribute__((noipa)) void* operator new(size_t bytes) {
  if (t_tracking_allocations) t_largest_allocation = std::max(t_largest_allocation, bytes);
  if (void* p = std::malloc(bytes != 0 ? bytes : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noipa)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noipa)) void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace hiber::fatbin {
namespace {

// Tracks the largest allocation of this thread while in scope.
class LargestAllocation {
 public:
  LargestAllocation() {
    t_largest_allocation = 0;
    t_tracking_allocations = true;
  }
  ~LargestAllocation() { t_tracking_allocations = false; }
  size_t bytes() const { return t_largest_allocation; }
};

using Bytes = std::vector<std::byte>;

Bytes bytes_of(std::string_view text) {
  Bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

template <typename T>
void put(Bytes& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
void poke(Bytes& out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}

// ---- A fatbin container built by hand ----

enum class Compression { kNone, kZstd, kLz4 };

struct EntrySpec {
  uint16_t kind = 1;  // 1 PTX, 2 cubin
  uint32_t arch = 90;
  Bytes code;
  Compression compression = Compression::kNone;
};

// Lays out entries as nvcc 13 does (see docs/fatbin.md): a 64-byte entry header, the payload
// padded to 8 bytes, and for compressed payloads the compressed and uncompressed sizes.
Bytes build_fatbin(const std::vector<EntrySpec>& entries) {
  Bytes body;
  for (const EntrySpec& e : entries) {
    Bytes payload;
    uint64_t flags = 0x11;
    uint32_t compressed_bytes = 0;
    uint64_t uncompressed_bytes = 0;
    if (e.compression == Compression::kZstd) {
      payload.resize(ZSTD_compressBound(e.code.size()));
      size_t n = ZSTD_compress(payload.data(), payload.size(), e.code.data(), e.code.size(), 3);
      EXPECT_FALSE(ZSTD_isError(n));
      payload.resize(n);
      flags |= 0x8000;
    } else if (e.compression == Compression::kLz4) {
      payload.resize(LZ4_compressBound(static_cast<int>(e.code.size())));
      int n = LZ4_compress_default(
          reinterpret_cast<const char*>(e.code.data()), reinterpret_cast<char*>(payload.data()),
          static_cast<int>(e.code.size()), static_cast<int>(payload.size()));
      EXPECT_GT(n, 0);
      payload.resize(static_cast<size_t>(n));
      flags |= 0x2000;
    } else {
      payload = e.code;
    }
    if (e.compression != Compression::kNone) {
      compressed_bytes = static_cast<uint32_t>(payload.size());
      uncompressed_bytes = e.code.size();
    }
    payload.resize((payload.size() + 7) / 8 * 8);
    Bytes header(64);
    poke<uint16_t>(header, 0, e.kind);
    poke<uint16_t>(header, 2, 0x0101);
    poke<uint32_t>(header, 4, 64);
    poke<uint64_t>(header, 8, payload.size());
    poke<uint32_t>(header, 16, compressed_bytes);
    poke<uint32_t>(header, 28, e.arch);
    poke<uint64_t>(header, 40, flags);
    poke<uint64_t>(header, 56, uncompressed_bytes);
    body.insert(body.end(), header.begin(), header.end());
    body.insert(body.end(), payload.begin(), payload.end());
  }
  Bytes out;
  put<uint32_t>(out, kFatbinMagic);
  put<uint16_t>(out, 1);
  put<uint16_t>(out, 16);
  put<uint64_t>(out, body.size());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// ---- A cubin built by hand: just the parts the reader looks at ----

// .nv.info attributes.
Bytes kparam(uint16_t ordinal, uint16_t offset, uint32_t size) {
  Bytes a = {std::byte{0x04}, std::byte{0x17}};
  put<uint16_t>(a, 12);
  put<uint32_t>(a, 0);
  put<uint16_t>(a, ordinal);
  put<uint16_t>(a, offset);
  put<uint32_t>(a, size << 18 | 0x1f000);  // cbank 0x1f, as nvcc writes it
  return a;
}
Bytes param_cbank(uint16_t total) {
  Bytes a = {std::byte{0x04}, std::byte{0x0a}};
  put<uint16_t>(a, 8);
  put<uint32_t>(a, 3);
  put<uint16_t>(a, 0x160);
  put<uint16_t>(a, total);
  return a;
}
Bytes hval(uint8_t attribute, uint16_t value) {
  Bytes a = {std::byte{0x03}, std::byte{attribute}};
  put<uint16_t>(a, value);
  return a;
}
Bytes nval(uint8_t attribute) { return {std::byte{0x01}, std::byte{attribute}, {}, {}}; }
Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct FunctionSpec {
  std::string name;
  Bytes info;          // .nv.info.<name> contents
  bool kernel = true;  // STO_CUDA_ENTRY
  bool has_info = true;
};

Bytes build_cubin(const std::vector<FunctionSpec>& functions) {
  struct Sec {
    std::string name;
    uint32_t type;
    Bytes data;
    uint32_t link = 0;
    uint64_t entsize = 0;
  };
  std::vector<Sec> sections = {
      {"", 0, {}}, {".shstrtab", 3, {}}, {".strtab", 3, {}}, {".symtab", 2, {}, 2, 24}};
  Bytes strtab(1);
  Bytes symtab(24);  // symbol 0 is null
  for (const FunctionSpec& f : functions) {
    uint16_t text_index = static_cast<uint16_t>(sections.size());
    sections.push_back({".text." + f.name, 1, Bytes(16, std::byte{0xaa})});
    if (f.has_info) sections.push_back({".nv.info." + f.name, 0x70000000, f.info, 3});
    put<uint32_t>(symtab, static_cast<uint32_t>(strtab.size()));
    put<uint8_t>(symtab, 0x12);  // STB_GLOBAL, STT_FUNC
    put<uint8_t>(symtab, f.kernel ? 0x10 : 0);
    put<uint16_t>(symtab, text_index);
    put<uint64_t>(symtab, 0);
    put<uint64_t>(symtab, 16);
    Bytes name = bytes_of(f.name);
    strtab.insert(strtab.end(), name.begin(), name.end());
    strtab.push_back(std::byte{0});
  }
  sections[2].data = strtab;
  sections[3].data = symtab;
  Bytes shstrtab(1);
  std::vector<uint32_t> name_offsets;
  for (const Sec& s : sections) {
    name_offsets.push_back(s.name.empty() ? 0 : static_cast<uint32_t>(shstrtab.size()));
    if (s.name.empty()) continue;
    Bytes name = bytes_of(s.name);
    shstrtab.insert(shstrtab.end(), name.begin(), name.end());
    shstrtab.push_back(std::byte{0});
  }
  sections[1].data = shstrtab;

  Bytes out(64);
  std::vector<uint64_t> offsets;
  for (const Sec& s : sections) {
    offsets.push_back(out.size());
    out.insert(out.end(), s.data.begin(), s.data.end());
    out.resize((out.size() + 7) / 8 * 8);
  }
  const uint64_t shoff = out.size();
  for (size_t i = 0; i < sections.size(); ++i) {
    put<uint32_t>(out, name_offsets[i]);
    put<uint32_t>(out, sections[i].type);
    put<uint64_t>(out, 0);  // flags
    put<uint64_t>(out, 0);  // addr
    put<uint64_t>(out, i == 0 ? 0 : offsets[i]);
    put<uint64_t>(out, sections[i].data.size());
    put<uint32_t>(out, sections[i].link);
    put<uint32_t>(out, 0);  // info
    put<uint64_t>(out, 1);  // addralign
    put<uint64_t>(out, sections[i].entsize);
  }
  std::memcpy(out.data(),
              "\x7f"
              "ELF\x02\x01\x01\x41",
              8);
  poke<uint16_t>(out, 16, 2);    // ET_EXEC
  poke<uint16_t>(out, 18, 190);  // EM_CUDA
  poke<uint32_t>(out, 20, 1);
  poke<uint64_t>(out, 40, shoff);
  poke<uint16_t>(out, 52, 64);
  poke<uint16_t>(out, 58, 64);
  poke<uint16_t>(out, 60, static_cast<uint16_t>(sections.size()));
  poke<uint16_t>(out, 62, 1);
  return out;
}

// ---- Checks shared by the malformed-input tests ----

// The reader either accepts the image or rejects it as kInvalidImage: nothing else, no crash.
void expect_ok_or_invalid(std::span<const std::byte> image, const std::string& what) {
  auto kernels = image_kernels(image);
  if (!kernels.ok()) {
    EXPECT_EQ(kernels.status().code(), ErrorCode::kInvalidImage)
        << what << ": " << kernels.status();
    EXPECT_FALSE(kernels.status().message().empty()) << what;
  }
}

void expect_invalid(const Result<std::vector<KernelInfo>>& result, const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << "expected an error mentioning '" << fragment << "'";
  EXPECT_EQ(result.status().code(), ErrorCode::kInvalidImage) << result.status();
  EXPECT_NE(result.status().message().find(fragment), std::string::npos) << result.status();
}

std::string layout_string(const std::vector<KernelInfo>& kernels) {
  std::string out;
  for (const KernelInfo& k : kernels) {
    out += k.name + "(";
    for (const ParamInfo& p : k.params) out += str_cat(p.bytes, "@", p.offset, " ");
    out += ")\n";
  }
  return out;
}

// ---- PTX ----

constexpr std::string_view kPtx = R"(//
// Generated by hand; the comment mentions .entry fake( .param .u8 x ) to be ignored.
//
.version 8.0
.target sm_80
.address_size 64
/* .entry commented_out() {} */
.file 1 "/tmp//odd // path.cu"
.extern .entry declared_elsewhere(.param .u32 a);
.func (.param .b32 r) helper(.param .b32 x) { ret; }
.visible .entry _Z5mixedcdsPv(
  .param .u8 _Z5mixedcdsPv_param_0,
  .param .f64 _Z5mixedcdsPv_param_1,
  .param .s16 _Z5mixedcdsPv_param_2,
  .param .u64 .ptr .global .align 16 _Z5mixedcdsPv_param_3
)
.maxntid 256, 1, 1
{
  .param .b32 inner;  // a call parameter inside a body, not a kernel parameter
  ret;
}
.entry static_kernel(.param .align 16 .b8 s_param_0[20], .param .b8 s_param_1, .param .b16 s_param_2[3])
{
  ret;
}
.weak .entry no_parens
{
  ret;
}
.visible .entry empty_parens()
{
  ret;
}
)";

TEST(PtxKernels, LayoutsFollowTypesAlignmentsAndArrays) {
  auto kernels = ptx_kernels(kPtx);
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  std::vector<KernelInfo> expected = {
      {"_Z5mixedcdsPv", {{0, 1}, {8, 8}, {16, 2}, {24, 8}}},  // .ptr's .align is the pointee's
      {"empty_parens", {}},
      {"no_parens", {}},
      {"static_kernel", {{0, 20}, {20, 1}, {22, 6}}},
  };
  EXPECT_EQ(*kernels, expected) << layout_string(*kernels);
}

TEST(PtxKernels, ImageKernelsRecognisesPtxText) {
  auto kernels = image_kernels(bytes_of(kPtx));
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  EXPECT_EQ(kernels->size(), 4u);
  // Leading blank lines, as in PTX that nvcc embeds in a fatbin, and a terminating NUL.
  std::string padded =
      "\n\n\n.version 9.0\n.target sm_90\n.visible .entry k(.param .u32 a)\n{ ret; }\n";
  padded.push_back('\0');
  padded += "garbage after the terminator";
  auto padded_kernels = image_kernels(bytes_of(padded));
  ASSERT_TRUE(padded_kernels.ok()) << padded_kernels.status();
  EXPECT_EQ(*padded_kernels, (std::vector<KernelInfo>{{"k", {{0, 4}}}}));
}

TEST(PtxKernels, RejectsMalformedText) {
  expect_invalid(ptx_kernels(".target sm_90\n.entry k() {}"), ".version");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .pred p) {}"), ".pred");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .u32) {}"), "no name");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .u32 a .param .u32 b) {}"),
                 "expected ',' or ')'");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .align 3 .b8 a[4]) {}"),
                 "power of two");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .b8 a[0]) {}"), "empty array");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .b8 a[999999999]) {}"), "exceed");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k() {} .entry k() {}"), "twice");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k() { { }"), "unbalanced");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k() } {"), "unbalanced");
  expect_invalid(ptx_kernels(".version 9.0\n.entry (.param .u32 a) {}"), "valid name");
  expect_invalid(ptx_kernels(".version 9.0\n.entry k(.param .u32 a"), "expected ',' or ')'");
  expect_invalid(image_kernels(bytes_of("hello, world")), "not a fatbin, cubin or PTX");
  expect_invalid(image_kernels(Bytes{}), "not a fatbin, cubin or PTX");
}

// ---- cubin ----

TEST(CubinKernels, ParametersAreSortedByOrdinalAndDeviceFunctionsSkipped) {
  Bytes cubin = build_cubin({
      // Attributes in the order nvcc writes them: last parameter first, other attributes mixed in.
      {"_Z1kcPi", cat({hval(0x37, 0x82), param_cbank(16), kparam(1, 8, 8), nval(0x50),
                       kparam(0, 0, 1), hval(0x19, 16)})},
      {"_Z6helperv", {}, /*kernel=*/false},
      {"_Z4noopv", cat({hval(0x37, 0x82)})},
  });
  auto kernels = cubin_kernels(cubin);
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  std::vector<KernelInfo> expected = {{"_Z1kcPi", {{0, 1}, {8, 8}}}, {"_Z4noopv", {}}};
  EXPECT_EQ(*kernels, expected) << layout_string(*kernels);
  auto via_image = image_kernels(cubin);
  ASSERT_TRUE(via_image.ok()) << via_image.status();
  EXPECT_EQ(*via_image, expected);
}

TEST(CubinKernels, RejectsInconsistentAttributes) {
  expect_invalid(cubin_kernels(build_cubin({{"k", cat({kparam(0, 0, 8), kparam(2, 8, 8)})}})),
                 "ordinals");
  expect_invalid(cubin_kernels(build_cubin({{"k", cat({kparam(0, 0, 8), kparam(0, 8, 8)})}})),
                 "ordinals");
  expect_invalid(cubin_kernels(build_cubin({{"k", cat({kparam(0, 0, 8), kparam(1, 4, 8)})}})),
                 "overlaps");
  expect_invalid(cubin_kernels(build_cubin({{"k", cat({kparam(0, 0, 8), param_cbank(24)})}})),
                 "declares 24 bytes");
  expect_invalid(cubin_kernels(build_cubin({{"k", cat({param_cbank(8)})}})), "describes none");
  expect_invalid(cubin_kernels(build_cubin({{"k", {}, true, /*has_info=*/false}})),
                 "no .nv.info.k");
  Bytes bad_format = cat({kparam(0, 0, 8)});
  bad_format.push_back(std::byte{0x07});
  bad_format.push_back(std::byte{0x17});
  bad_format.resize(bad_format.size() + 2);
  expect_invalid(cubin_kernels(build_cubin({{"k", bad_format}})), "unknown attribute format");
  Bytes long_value = kparam(0, 0, 8);
  poke<uint16_t>(long_value, 2, 200);
  expect_invalid(cubin_kernels(build_cubin({{"k", long_value}})), "runs past the section");
  Bytes short_kparam = {std::byte{0x04}, std::byte{0x17}, std::byte{4}, {}, {}, {}, {}, {}};
  expect_invalid(cubin_kernels(build_cubin({{"k", short_kparam}})), "expected 12");
  expect_invalid(cubin_kernels(build_cubin({{"k", {}}, {"k", {}}})), "twice");
}

TEST(CubinKernels, RejectsBrokenElf) {
  Bytes good = build_cubin({{"_Z1kcPi", cat({kparam(0, 0, 1), kparam(1, 8, 8)})}});
  ASSERT_TRUE(cubin_kernels(good).ok());
  Bytes b = good;
  b[4] = std::byte{1};  // ELFCLASS32
  expect_invalid(cubin_kernels(b), "64-bit");
  b = good;
  poke<uint16_t>(b, 18, 62);  // EM_X86_64
  expect_invalid(cubin_kernels(b), "EM_CUDA");
  b = good;
  poke<uint64_t>(b, 40, b.size() - 10);
  expect_invalid(cubin_kernels(b), "section header table");
  b = good;
  poke<uint16_t>(b, 60, 0x7fff);
  expect_invalid(cubin_kernels(b), "do not fit");
  b = good;
  poke<uint16_t>(b, 62, 200);
  expect_invalid(cubin_kernels(b), "name table index");
  b = good;
  poke<uint16_t>(b, 58, 40);
  expect_invalid(cubin_kernels(b), "header size");
  expect_invalid(cubin_kernels(Bytes(good.begin(), good.begin() + 63)), "shorter");
  expect_invalid(cubin_kernels(bytes_of(std::string(64, 'x'))), "no ELF magic");
  // The offset or size of each section the reader uses pointing past the end.
  uint64_t table;
  std::memcpy(&table, good.data() + 40, 8);
  for (size_t i : {1, 2, 3, 5}) {  // .shstrtab, .strtab, .symtab, .nv.info._Z1kcPi
    b = good;
    poke<uint64_t>(b, table + i * 64 + 24, b.size());
    expect_invalid(cubin_kernels(b), "past the end");
    b = good;
    poke<uint64_t>(b, table + i * 64 + 32, ~uint64_t{0} - 4);
    expect_invalid(cubin_kernels(b), "past the end");
  }
}

// ---- hand-built fatbin containers ----

constexpr std::string_view kSmallPtx =
    ".version 9.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry _Z7vec_addPKfS0_Pfi(.param .u64 a, .param .u64 b, .param .u64 c,"
    " .param .u32 n)\n{ ret; }\n";

TEST(ParseFatbin, ReadsPlainZstdAndLz4Entries) {
  Bytes cubin = build_cubin({{"_Z1kcPi", cat({kparam(0, 0, 1), kparam(1, 8, 8)})}});
  Bytes ptx = bytes_of(kSmallPtx);
  ptx.push_back(std::byte{0});
  Bytes image = build_fatbin({{2, 80, cubin, Compression::kNone},
                              {2, 90, cubin, Compression::kLz4},
                              {1, 90, ptx, Compression::kZstd},
                              {1, 75, ptx, Compression::kLz4},
                              {8, 90, bytes_of("LTO IR is skipped"), Compression::kNone}});
  ASSERT_TRUE(is_fatbin(image));
  auto entries = parse_fatbin(image);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 4u);
  EXPECT_EQ((*entries)[0].kind, CodeKind::kCubin);
  EXPECT_EQ((*entries)[0].arch, 80u);
  EXPECT_FALSE((*entries)[0].was_compressed);
  EXPECT_EQ(Bytes((*entries)[0].code.begin(), (*entries)[0].code.begin() + cubin.size()), cubin);
  EXPECT_EQ((*entries)[1].code, cubin);
  EXPECT_TRUE((*entries)[1].was_compressed);
  EXPECT_EQ((*entries)[2].kind, CodeKind::kPtx);
  EXPECT_EQ((*entries)[2].code, ptx);
  EXPECT_TRUE((*entries)[2].was_compressed);
  EXPECT_EQ((*entries)[3].arch, 75u);
  EXPECT_EQ((*entries)[3].code, ptx);

  auto kernels = image_kernels(image);
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  std::vector<KernelInfo> expected = {{"_Z1kcPi", {{0, 1}, {8, 8}}},
                                      {"_Z7vec_addPKfS0_Pfi", {{0, 8}, {8, 8}, {16, 8}, {24, 4}}}};
  EXPECT_EQ(*kernels, expected) << layout_string(*kernels);
}

TEST(ParseFatbin, EmptyContainerHasNoEntries) {
  auto entries = parse_fatbin(build_fatbin({}));
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_TRUE(entries->empty());
}

TEST(ParseFatbin, ConflictingLayoutsAcrossEntriesAreRejected) {
  Bytes a = build_cubin({{"k", cat({kparam(0, 0, 8)})}});
  Bytes b = build_cubin({{"k", cat({kparam(0, 0, 4)})}});
  expect_invalid(image_kernels(build_fatbin({{2, 80, a}, {2, 90, b}})), "kernel k has parameters");
  Bytes ptx = bytes_of(".version 9.0\n.entry k(.param .u32 a) { ret; }");
  expect_invalid(image_kernels(build_fatbin({{2, 80, a}, {1, 90, ptx}})),
                 "kernel k has parameters");
  // An entry that does not parse names itself.
  expect_invalid(image_kernels(build_fatbin({{2, 80, a}, {1, 90, bytes_of("nonsense")}})),
                 "fatbin entry 1 (PTX, arch 90)");
}

TEST(ParseFatbin, RejectsMalformedContainers) {
  Bytes ptx = bytes_of(kSmallPtx);
  const Bytes good =
      build_fatbin({{1, 90, ptx, Compression::kZstd}, {1, 80, ptx, Compression::kLz4}});
  ASSERT_TRUE(image_kernels(good).ok());
  const size_t e0 = 16;  // first entry header

  auto check = [&](auto mutate, const std::string& fragment) {
    Bytes b = good;
    mutate(b);
    auto result = parse_fatbin(b);
    ASSERT_FALSE(result.ok()) << fragment;
    EXPECT_EQ(result.status().code(), ErrorCode::kInvalidImage);
    EXPECT_NE(result.status().message().find(fragment), std::string::npos) << result.status();
  };
  check([](Bytes& b) { poke<uint32_t>(b, 0, 0xBA55ED51); }, "magic");
  check([](Bytes& b) { poke<uint16_t>(b, 4, 2); }, "version 2");
  check([](Bytes& b) { poke<uint16_t>(b, 6, 8); }, "header size 8");
  check([](Bytes& b) { poke<uint16_t>(b, 6, 0xffff); }, "bytes of entries");
  check([](Bytes& b) { poke<uint64_t>(b, 8, b.size()); }, "bytes of entries");
  check([](Bytes& b) { poke<uint64_t>(b, 8, ~uint64_t{0}); }, "bytes of entries");
  check([](Bytes& b) { poke<uint64_t>(b, 8, 40); }, "header truncated");
  check([&](Bytes& b) { poke<uint32_t>(b, e0 + 4, 32); }, "entry header size 32");
  check([&](Bytes& b) { poke<uint32_t>(b, e0 + 4, 0xffffffff); }, "entry header size");
  check([&](Bytes& b) { poke<uint64_t>(b, e0 + 8, b.size()); }, "runs past the end");
  check([&](Bytes& b) { poke<uint64_t>(b, e0 + 8, ~uint64_t{0} - 8); }, "runs past the end");
  check([&](Bytes& b) { poke<uint32_t>(b, e0 + 16, 0); }, "compressed size 0");
  check([&](Bytes& b) { poke<uint32_t>(b, e0 + 16, 0x7fffffff); }, "compressed size");
  check([&](Bytes& b) { poke<uint64_t>(b, e0 + 56, 0); }, "uncompressed size 0");
  check([&](Bytes& b) { poke<uint64_t>(b, e0 + 56, uint64_t{1} << 40); }, "limit");
  check([&](Bytes& b) { poke<uint64_t>(b, e0 + 56, ptx.size() + 1); }, "declares");
  check([&](Bytes& b) { poke<uint64_t>(b, e0 + 40, 0xa011); }, "both LZ4 and Zstandard");
  check([&](Bytes& b) { b[e0 + 64 + 8] ^= std::byte{0xff}; }, "Zstandard");
  // The second entry: LZ4.
  const size_t e1 = e0 + 64 + static_cast<size_t>([&] {
                      uint64_t n;
                      std::memcpy(&n, good.data() + e0 + 8, 8);
                      return n;
                    }());
  check([&](Bytes& b) { poke<uint64_t>(b, e1 + 56, ptx.size() + 7); }, "LZ4");
  check([&](Bytes& b) { poke<uint64_t>(b, e1 + 56, uint64_t{1} << 29); }, "impossible");
  check([&](Bytes& b) { std::memset(b.data() + e1 + 64, 0xff, 8); }, "LZ4");
  check([&](Bytes& b) { poke<uint32_t>(b, e1 + 16, 3); }, "LZ4");
}

TEST(ParseFatbin, EveryTruncationIsRejected) {
  Bytes ptx = bytes_of(kSmallPtx);
  Bytes cubin = build_cubin({{"_Z1kcPi", cat({kparam(0, 0, 1), kparam(1, 8, 8)})}});
  const Bytes good = build_fatbin(
      {{2, 80, cubin}, {1, 90, ptx, Compression::kZstd}, {2, 90, cubin, Compression::kLz4}});
  for (size_t n = 0; n < good.size(); ++n) {
    std::span<const std::byte> cut(good.data(), n);
    auto result = image_kernels(cut);
    ASSERT_FALSE(result.ok()) << "truncated to " << n;
    EXPECT_EQ(result.status().code(), ErrorCode::kInvalidImage) << n;
    // With the header patched to the shorter length the reader walks into the cut entry.
    if (n >= 16) {
      Bytes patched(cut.begin(), cut.end());
      poke<uint64_t>(patched, 8, n - 16);
      expect_ok_or_invalid(patched, str_cat("truncated to ", n, " with patched header"));
    }
  }
}

// One compressed entry around `data` as it is, with the sizes a forger chooses.
Bytes forged_entry(const Bytes& data, uint64_t flags, uint64_t declared_bytes) {
  Bytes payload = data;
  payload.resize((payload.size() + 7) / 8 * 8);
  Bytes header(64);
  poke<uint16_t>(header, 0, 1);
  poke<uint32_t>(header, 4, 64);
  poke<uint64_t>(header, 8, payload.size());
  poke<uint32_t>(header, 16, static_cast<uint32_t>(data.size()));
  poke<uint32_t>(header, 28, 90);
  poke<uint64_t>(header, 40, flags);
  poke<uint64_t>(header, 56, declared_bytes);
  Bytes out;
  put<uint32_t>(out, kFatbinMagic);
  put<uint16_t>(out, 1);
  put<uint16_t>(out, 16);
  put<uint64_t>(out, header.size() + payload.size());
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

TEST(ParseFatbin, ForgedDecompressedSizesCostOnlyWhatTheDataDelivers) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  // A Zstandard frame whose header claims 1 GiB (the reader's limit), then one raw block of 8
  // bytes and nothing more: 112 bytes of fatbin.
  Bytes frame = {std::byte{0x28}, std::byte{0xb5}, std::byte{0x2f}, std::byte{0xfd},
                 std::byte{0xc0}, std::byte{0x58}};  // 8-byte content size, 2 MiB window
  put<uint64_t>(frame, kGiB);
  frame.insert(frame.end(), {std::byte{8 << 3}, std::byte{0}, std::byte{0}});  // raw, 8 bytes
  frame.resize(frame.size() + 8, std::byte{'x'});
  ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), kGiB);
  const Bytes zstd_bomb = forged_entry(frame, 0x8011, kGiB);
  EXPECT_EQ(zstd_bomb.size(), 112u);
  // LZ4 garbage claiming its maximum ratio: 1 MiB of 0xff (one literal run that never ends)
  // declaring 255 MiB.
  const Bytes lz4_bomb = forged_entry(Bytes(1 << 20, std::byte{0xff}), 0x2011, 255ull << 20);

  for (const auto& [name, image, fragment] :
       {std::tuple{"Zstandard", zstd_bomb, "Zstandard data ends inside its frame"},
        std::tuple{"LZ4", lz4_bomb, "LZ4 data is corrupt"}}) {
    SCOPED_TRACE(name);
    LargestAllocation largest;
    const auto start = std::chrono::steady_clock::now();
    auto result = image_kernels(image);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    expect_invalid(result, fragment);
    EXPECT_LE(largest.bytes(), size_t{1} << 20) << "allocated for a size the data never backed";
    // Refusing at the first inconsistency takes microseconds; producing the claimed 255 MiB would
    // take far longer. 1 s leaves room for a loaded machine.
    EXPECT_LT(elapsed, std::chrono::milliseconds(1000));
  }
}

TEST(ParseFatbin, LargeEntriesDecompressAcrossBufferGrowth) {
  // Several MiB of PTX (mostly a comment): the output buffers grow many times over.
  std::string big = std::string(kSmallPtx) + "// ";
  for (uint64_t i = 0; big.size() < (5u << 20); ++i) big += str_cat(i * 7919 % 1000003, " ");
  big += "\n";
  const Bytes ptx = bytes_of(big);
  const Bytes image =
      build_fatbin({{1, 90, ptx, Compression::kZstd}, {1, 80, ptx, Compression::kLz4}});
  auto entries = parse_fatbin(image);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_TRUE((*entries)[0].code == ptx);
  EXPECT_TRUE((*entries)[1].code == ptx);
  auto kernels = fatbin_kernels(*entries);
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  EXPECT_EQ(kernels->size(), 1u);

  // Declaring one byte more or less than the data holds is caught at either end.
  const size_t e1 = 16 + 64 + static_cast<size_t>([&] {
                      uint64_t n;
                      std::memcpy(&n, image.data() + 16 + 8, 8);
                      return n;
                    }());
  Bytes b = image;
  poke<uint64_t>(b, e1 + 56, ptx.size() + 1);
  expect_invalid(image_kernels(b), "LZ4 data holds");
  b = image;
  poke<uint64_t>(b, e1 + 56, ptx.size() - 1);
  expect_invalid(image_kernels(b), "LZ4");
}

TEST(ParseFatbin, RandomByteFlipsNeverCrash) {
  Bytes ptx = bytes_of(kSmallPtx);
  Bytes cubin = build_cubin({{"_Z1kcPi", cat({kparam(0, 0, 1), kparam(1, 8, 8), param_cbank(16)})},
                             {"_Z4noopv", cat({hval(0x37, 0x82)})}});
  const Bytes good = build_fatbin(
      {{2, 80, cubin}, {1, 90, ptx, Compression::kZstd}, {2, 90, cubin, Compression::kLz4}});
  std::mt19937 rng(20240601);
  for (int i = 0; i < 3000; ++i) {
    Bytes b = good;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] ^= std::byte(1 + rng() % 255);
    expect_ok_or_invalid(b, str_cat("iteration ", i));
  }
}

// ---- nvcc-built images (tests/kernels) ----

#ifdef HIBER_TEST_KERNELS_FATBIN

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

struct ExpectedEntry {
  CodeKind kind;
  uint32_t arch;
  bool compressed;
  friend bool operator==(const ExpectedEntry&, const ExpectedEntry&) = default;
};

std::ostream& operator<<(std::ostream& out, const ExpectedEntry& e) {
  return out << (e.kind == CodeKind::kPtx ? "ptx" : "cubin") << "/" << e.arch
             << (e.compressed ? "/compressed" : "");
}

struct RealImage {
  const char* name;
  const char* path;
  std::vector<ExpectedEntry> entries;  // empty: not a fatbin
};

std::vector<RealImage> real_images() {
  constexpr auto kPtx = CodeKind::kPtx;
  constexpr auto kCubin = CodeKind::kCubin;
  return {
      {"default",
       HIBER_TEST_KERNELS_FATBIN,
       {{kCubin, 80, false}, {kCubin, 90, false}, {kPtx, 90, true}}},
      {"zstd",
       HIBER_TEST_KERNELS_FATBIN_ZSTD,
       {{kCubin, 80, true},
        {kCubin, 90, true},
        {kCubin, 100, true},
        {kCubin, 120, true},
        {kPtx, 120, true}}},
      {"lz4", HIBER_TEST_KERNELS_FATBIN_LZ4, {{kCubin, 75, true}, {kPtx, 75, true}}},
      {"ptx_only", HIBER_TEST_KERNELS_FATBIN_PTX, {{kPtx, 90, false}}},
      {"cubin", HIBER_TEST_KERNELS_CUBIN, {}},
      {"ptx_text", HIBER_TEST_KERNELS_PTX, {}},
  };
}

TEST(RealImages, EntriesAreWhatNvccWasAskedFor) {
  for (const RealImage& image : real_images()) {
    if (image.entries.empty()) continue;
    SCOPED_TRACE(image.name);
    Bytes bytes = read_file(image.path);
    ASSERT_TRUE(is_fatbin(bytes));
    auto entries = parse_fatbin(bytes);
    ASSERT_TRUE(entries.ok()) << entries.status();
    std::vector<ExpectedEntry> got;
    for (const CodeEntry& e : *entries) got.push_back({e.kind, e.arch, e.was_compressed});
    EXPECT_EQ(got, image.entries);
    for (const CodeEntry& e : *entries) EXPECT_EQ(is_elf(e.code), e.kind == CodeKind::kCubin);
  }
}

TEST(RealImages, EveryImageHasEveryTestKernelWithTheAbiLayout) {
  const std::vector<KernelInfo> expected = test_kernels::expected_kernels();
  for (const RealImage& image : real_images()) {
    SCOPED_TRACE(image.name);
    Bytes bytes = read_file(image.path);
    auto kernels = image_kernels(bytes);
    ASSERT_TRUE(kernels.ok()) << kernels.status();
    EXPECT_EQ(*kernels, expected) << "got:\n"
                                  << layout_string(*kernels) << "expected:\n"
                                  << layout_string(expected);
  }
}

TEST(RealImages, EachEntryAloneHasTheAbiLayout) {
  // Cubin and PTX are read by different code: each must agree with the ABI by itself.
  const std::vector<KernelInfo> expected = test_kernels::expected_kernels();
  for (const RealImage& image : real_images()) {
    if (image.entries.empty()) continue;
    auto entries = parse_fatbin(read_file(image.path));
    ASSERT_TRUE(entries.ok()) << entries.status();
    for (const CodeEntry& e : *entries) {
      SCOPED_TRACE(
          str_cat(image.name, " ", e.kind == CodeKind::kPtx ? "ptx" : "cubin", " ", e.arch));
      auto kernels = e.kind == CodeKind::kCubin
                         ? cubin_kernels(e.code)
                         : ptx_kernels(std::string_view(
                               reinterpret_cast<const char*>(e.code.data()), e.code.size()));
      ASSERT_TRUE(kernels.ok()) << kernels.status();
      EXPECT_EQ(*kernels, expected) << layout_string(*kernels);
    }
  }
}

TEST(RealImages, EveryTruncationIsRejected) {
  for (const char* path : {HIBER_TEST_KERNELS_FATBIN_LZ4, HIBER_TEST_KERNELS_CUBIN}) {
    const Bytes good = read_file(path);
    for (size_t n = 0; n < good.size(); ++n) {
      auto result = image_kernels(std::span<const std::byte>(good.data(), n));
      ASSERT_FALSE(result.ok()) << path << " truncated to " << n;
      ASSERT_EQ(result.status().code(), ErrorCode::kInvalidImage) << n;
    }
  }
}

TEST(RealImages, TruncatedEntriesBehindAPatchedHeaderAreRejected) {
  // The header's size is patched to each shorter length, so the reader meets the cut inside an
  // entry header or payload; a cut at an entry boundary is a valid, smaller fatbin.
  const Bytes good = read_file(HIBER_TEST_KERNELS_FATBIN_LZ4);
  auto full = parse_fatbin(good);
  ASSERT_TRUE(full.ok());
  for (size_t n = 16; n < good.size(); n += 3) {
    Bytes cut(good.begin(), good.begin() + n);
    poke<uint64_t>(cut, 8, n - 16);
    expect_ok_or_invalid(cut, str_cat("cut at ", n));
  }
}

TEST(RealImages, RandomByteFlipsNeverCrash) {
  std::mt19937 rng(7);
  for (const RealImage& image : real_images()) {
    const Bytes good = read_file(image.path);
    for (int i = 0; i < 400; ++i) {
      Bytes b = good;
      int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] ^= std::byte(1 + rng() % 255);
      expect_ok_or_invalid(b, str_cat(image.name, " iteration ", i));
    }
  }
}

TEST(RealImages, FlipsInsideHeadersAndAttributesNeverCrash) {
  // Random flips mostly land in code; these land where the reader looks.
  const Bytes good = read_file(HIBER_TEST_KERNELS_CUBIN);
  uint64_t shoff;
  std::memcpy(&shoff, good.data() + 40, 8);
  std::mt19937 rng(11);
  for (int i = 0; i < 3000; ++i) {
    Bytes b = good;
    size_t at =
        i % 2 == 0 ? rng() % 64 : static_cast<size_t>(shoff) + rng() % (good.size() - shoff);
    b[at] ^= std::byte(1 + rng() % 255);
    expect_ok_or_invalid(b, str_cat("flip at ", at));
  }
}

#else

TEST(RealImages, SkippedWithoutToolkit) {
  GTEST_SKIP() << "the CUDA toolkit was absent at build time: no nvcc-built images to read";
}

#endif  // HIBER_TEST_KERNELS_FATBIN

}  // namespace
}  // namespace hiber::fatbin
