// hiber-coverage's work (docs/coverage.md): which CUDA runtime/driver, cuBLAS, cuBLASLt, cuDNN,
// NVRTC and NVML symbols a program or library imports, following its NEEDED libraries as the
// loader would, and for each what Hiber's replacement library does with it: remotes it, answers
// it locally, refuses it, only stubs it (the shim's declaration tables say which), or lacks it. The pure parts (classifying libraries, the loader's search path, attributing imports,
// formatting) are separate from the file reading so that unit tests can drive them.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tools/elf_file.h"

namespace hiber::coverage {

// The CUDA libraries Hiber replaces (or, NVRTC, leaves running in the client).
enum class CudaLibrary { kNone, kRuntime, kDriver, kCublas, kCublasLt, kCudnn, kNvml, kNvrtc };

// Which CUDA library a NEEDED name is: libcudart.so.* is kRuntime, libcuda.so.* kDriver,
// libcublas.so.* kCublas, libcublasLt.so.* kCublasLt, libcudnn*.so.* kCudnn, libnvidia-ml.so.*
// kNvml, libnvrtc*.so.* kNvrtc; anything else kNone. Only the file name part is looked at.
CudaLibrary classify_library(std::string_view needed_name);

// The file name of Hiber's replacement for `library` ("libhibercuda.so" for the runtime and the
// driver); empty for kNvrtc (runs in the client) and kNone.
std::string_view replacement_for(CudaLibrary library);

// The CUDA library an unversioned symbol's name belongs to (cuda* and __cuda*: runtime; cu
// followed by a capital: driver; cublasLt*, cublas*, cudnn*, nvml*, nvrtc*); kNone otherwise.
// Used only where the NEEDED library itself is not on this machine to look into.
CudaLibrary library_by_symbol_name(std::string_view symbol);

// What the shim's declaration tables (client_shim/entry_points/*.entries) say of an exported
// name: kRemoted (sent to hiberd), kLocal (answered in the client), kRefused (a documented
// refusal: the program gets an error where it calls it), kStub (fails loudly); kMissing: the
// replacement does not export it.
enum class Coverage { kRemoted, kStub, kMissing, kLocal, kRefused };
// "remoted", "stub", "missing", "local", "refused"
std::string_view coverage_name(Coverage coverage);

// ---- The loader's search (see docs/coverage.md for the order) ----

// `dirs` with $ORIGIN and ${ORIGIN} replaced by `origin_dir`; entries naming $LIB or $PLATFORM,
// which this tool does not expand, are dropped.
std::vector<std::string> expand_origin(const std::vector<std::string>& dirs,
                                       std::string_view origin_dir);

// `ldconfig -p` output as library name -> paths, in the cache's order.
std::map<std::string, std::vector<std::string>> parse_ldconfig_output(std::string_view text);

struct SearchConfig {
  std::vector<std::string> ld_library_path;
  std::map<std::string, std::vector<std::string>> ld_cache;  // parse_ldconfig_output
  std::vector<std::string> default_dirs;
};

// This process's LD_LIBRARY_PATH, `ldconfig -p` (empty where ldconfig cannot be run), and the
// loader's built-in directories.
SearchConfig system_search_config();

// ---- Attribution and coverage ----

struct ImportedSymbol {
  std::string library;  // the NEEDED name it binds to: "libcudart.so.13"
  std::string symbol;
  Coverage coverage = Coverage::kMissing;
  std::vector<std::string> importers;  // paths of the scanned files that import it
};

struct CoverageReport {
  std::string file;
  std::string shim_dir;
  std::vector<ImportedSymbol> symbols;  // sorted by library, then symbol
  std::vector<std::string> notes;       // sorted; why something is missing, what was not scanned
};

// A CUDA library some scanned file needs, in load order.
struct CudaDependency {
  std::string name;               // as NEEDED names it
  const ElfFile* file = nullptr;  // where it is on this machine; nullptr when not found
};

// Attributes the CUDA imports of `scanned` (the named file and the non-CUDA libraries it pulls
// in): a versioned import to the library its version need names, an unversioned one to the first
// of `cuda_libraries` that exports it (by name where that library is not on this machine). Each
// is then looked up in `replacements` (file name -> the built replacement library; absent: not
// built). `notes` are added to the report's.
CoverageReport assess(const std::vector<const ElfFile*>& scanned,
                      const std::vector<CudaDependency>& cuda_libraries,
                      const std::map<std::string, ElfFile>& replacements,
                      std::vector<std::string> notes);

struct ScanOptions {
  std::string shim_dir;  // where libhibercuda.so and the other replacements are
  SearchConfig search;
};

// Reads `path` and every library it needs (stopping at the CUDA libraries), and assesses them.
// Errors: `path` is missing or not an ELF executable or shared library.
Result<CoverageReport> scan(const std::string& path, const ScanOptions& options);

// ---- Output ----

// 0 when every symbol is remoted or local, 1 when one is a stub, refused or missing.
int exit_code(const CoverageReport& report);

// One line per symbol ("library  symbol  status", aligned; skipped for `summary_only`), one
// "note: " line per note, and the summary line:
// "summary: libcudart.so.13: 17 remoted, 1 stub; libcublas.so.13: 2 missing".
std::string format_text(const CoverageReport& report, bool summary_only);

// The same as one JSON object: file, shim_dir, symbols [{library, symbol, status, importers}],
// summary {library: {remoted, stub, missing, local, refused}}, notes, complete (exit_code == 0).
std::string format_json(const CoverageReport& report);

}  // namespace hiber::coverage
