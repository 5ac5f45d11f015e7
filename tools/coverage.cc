#include "tools/coverage.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <utility>

namespace hiber::coverage {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The declaration table of `library` (client_shim/entry_points/<table>.entries); "" for none.
std::string_view table_of(CudaLibrary library) {
  switch (library) {
    case CudaLibrary::kRuntime: return "cudart";
    case CudaLibrary::kDriver: return "cuda";
    case CudaLibrary::kCublas: return "cublas";
    case CudaLibrary::kCublasLt: return "cublasLt";
    case CudaLibrary::kCudnn: return "cudnn";
    case CudaLibrary::kNvml: return "nvml";
    case CudaLibrary::kNvrtc:
    case CudaLibrary::kNone: break;
  }
  return "";
}

// What the shim's declaration tables (client_shim/entry_points/*.entries) say of `symbol` of
// `library`: remoted, local, refused or stub; nullopt for a name no table declares.
std::optional<Coverage> declared(CudaLibrary library, std::string_view symbol) {
  struct Row {
    std::string_view table;
    std::string_view name;
    Coverage coverage;
  };
  constexpr Coverage remoted = Coverage::kRemoted, local = Coverage::kLocal,
                     refused = Coverage::kRefused, stub = Coverage::kStub;
#define HIBER_ENTRY(table, name, disposition, why) {#table, #name, disposition},
  static constexpr Row kRows[] = {
#include "client_shim/entry_dispositions.inc"
  };
#undef HIBER_ENTRY
  const std::string_view table = table_of(library);
  if (table.empty()) return std::nullopt;
  for (const Row& row : kRows) {
    if (row.table == table && row.name == symbol) return row.coverage;
  }
  return std::nullopt;
}

// "libfoo.so", "libfoo.so.13", "libfoo.so.9.1": `stem` then ".so", then nothing or a version.
bool is_library_named(std::string_view name, std::string_view stem) {
  if (!starts_with(name, stem)) return false;
  std::string_view rest = name.substr(stem.size());
  return rest == ".so" || starts_with(rest, ".so.");
}

std::string_view file_name_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string directory_of(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

CudaLibrary classify_library(std::string_view needed_name) {
  std::string_view name = file_name_of(needed_name);
  if (is_library_named(name, "libcudart")) return CudaLibrary::kRuntime;
  if (is_library_named(name, "libcuda")) return CudaLibrary::kDriver;
  if (is_library_named(name, "libcublasLt")) return CudaLibrary::kCublasLt;
  if (is_library_named(name, "libcublas")) return CudaLibrary::kCublas;
  if (is_library_named(name, "libnvidia-ml")) return CudaLibrary::kNvml;
  // cuDNN 9 is split into libcudnn.so.9 and libcudnn_<part>.so.9; NVRTC into libnvrtc.so.13 and
  // libnvrtc-builtins.so.13.0.
  if (starts_with(name, "libcudnn") && name.find(".so") != std::string_view::npos) {
    std::string_view part = name.substr(0, name.find(".so"));
    if (part == "libcudnn" || starts_with(part, "libcudnn_")) return CudaLibrary::kCudnn;
  }
  if (starts_with(name, "libnvrtc") && name.find(".so") != std::string_view::npos) {
    std::string_view part = name.substr(0, name.find(".so"));
    if (part == "libnvrtc" || starts_with(part, "libnvrtc-") || starts_with(part, "libnvrtc_")) {
      return CudaLibrary::kNvrtc;
    }
  }
  return CudaLibrary::kNone;
}

std::string_view replacement_for(CudaLibrary library) {
  const std::string_view table = table_of(library);
#define HIBER_REPLACED_LIBRARY(name, stem, abi, major, soname, replacement) \
  if (!table.empty() && table == #name) return replacement;
#include "client_shim/replaced_libraries.inc"
#undef HIBER_REPLACED_LIBRARY
  return "";
}

CudaLibrary library_by_symbol_name(std::string_view symbol) {
  if (starts_with(symbol, "cublasLt")) return CudaLibrary::kCublasLt;
  if (starts_with(symbol, "cublas")) return CudaLibrary::kCublas;
  if (starts_with(symbol, "cudnn")) return CudaLibrary::kCudnn;
  if (starts_with(symbol, "cuda") || starts_with(symbol, "__cuda")) return CudaLibrary::kRuntime;
  if (symbol.size() > 2 && starts_with(symbol, "cu") &&
      std::isupper(static_cast<unsigned char>(symbol[2]))) {
    return CudaLibrary::kDriver;
  }
  if (starts_with(symbol, "nvml")) return CudaLibrary::kNvml;
  if (starts_with(symbol, "nvrtc")) return CudaLibrary::kNvrtc;
  return CudaLibrary::kNone;
}

std::string_view coverage_name(Coverage coverage) {
  switch (coverage) {
    case Coverage::kRemoted: return "remoted";
    case Coverage::kStub: return "stub";
    case Coverage::kMissing: return "missing";
    case Coverage::kLocal: return "local";
    case Coverage::kRefused: return "refused";
  }
  return "?";
}

// ---- The loader's search ----

std::vector<std::string> expand_origin(const std::vector<std::string>& dirs,
                                       std::string_view origin_dir) {
  std::vector<std::string> expanded;
  for (const std::string& dir : dirs) {
    std::string out;
    bool unsupported = false;
    for (size_t i = 0; i < dir.size();) {
      if (dir[i] != '$') {
        out += dir[i++];
        continue;
      }
      std::string_view rest = std::string_view(dir).substr(i + 1);
      if (starts_with(rest, "{ORIGIN}")) {
        out += origin_dir;
        i += 1 + 8;
      } else if (starts_with(rest, "ORIGIN") &&
                 (rest.size() == 6 ||
                  !(std::isalnum(static_cast<unsigned char>(rest[6])) || rest[6] == '_'))) {
        out += origin_dir;
        i += 1 + 6;
      } else {
        unsupported = true;  // $LIB, $PLATFORM
        break;
      }
    }
    if (!unsupported && !out.empty()) expanded.push_back(std::move(out));
  }
  return expanded;
}

std::map<std::string, std::vector<std::string>> parse_ldconfig_output(std::string_view text) {
  // "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"; the first line is a count.
  std::map<std::string, std::vector<std::string>> cache;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    size_t arrow = line.find(" => ");
    size_t paren = line.find(" (");
    if (arrow == std::string_view::npos || paren == std::string_view::npos || paren > arrow) {
      continue;
    }
    std::string_view name = line.substr(0, paren);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.front()))) {
      name.remove_prefix(1);
    }
    std::string_view path = line.substr(arrow + 4);
    while (!path.empty() && std::isspace(static_cast<unsigned char>(path.back()))) {
      path.remove_suffix(1);
    }
    if (!name.empty() && !path.empty()) cache[std::string(name)].emplace_back(path);
  }
  return cache;
}

SearchConfig system_search_config() {
  SearchConfig config;
  if (const char* env = std::getenv("LD_LIBRARY_PATH"); env != nullptr) {
    // Split at ':' and ';' as the loader does; empty entries (the current directory) are left
    // out.
    std::string_view list(env);
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find_first_of(":;", start);
      if (end == std::string_view::npos) end = list.size();
      if (end > start) config.ld_library_path.emplace_back(list.substr(start, end - start));
      start = end + 1;
    }
  }
  // ldconfig is in /sbin, which an ordinary user's PATH may lack.
  for (const char* command : {"/sbin/ldconfig -p 2>/dev/null", "/usr/sbin/ldconfig -p 2>/dev/null",
                              "ldconfig -p 2>/dev/null"}) {
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command, "r"), ::pclose);
    if (pipe == nullptr) continue;
    std::string output;
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe.get())) > 0) {
      output.append(buffer.data(), n);
    }
    config.ld_cache = parse_ldconfig_output(output);
    if (!config.ld_cache.empty()) break;
  }
  // The loader's built-in directories: Debian's multiarch ones, then the generic ones.
  config.default_dirs = {"/lib/x86_64-linux-gnu",
                         "/usr/lib/x86_64-linux-gnu",
                         "/lib/aarch64-linux-gnu",
                         "/usr/lib/aarch64-linux-gnu",
                         "/lib64",
                         "/usr/lib64",
                         "/lib",
                         "/usr/lib"};
  return config;
}

// ---- Attribution and coverage ----

CoverageReport assess(const std::vector<const ElfFile*>& scanned,
                      const std::vector<CudaDependency>& cuda_libraries,
                      const std::map<std::string, ElfFile>& replacements,
                      std::vector<std::string> notes) {
  std::set<std::string> note_set(notes.begin(), notes.end());
  // (library, symbol) -> the symbol, and the version it was first imported with.
  std::map<std::pair<std::string, std::string>, std::pair<ImportedSymbol, std::string>> found;
  for (const ElfFile* file : scanned) {
    for (const ElfSymbol& import : file->imports) {
      std::string library;
      if (!import.version_library.empty()) {
        if (classify_library(import.version_library) != CudaLibrary::kNone) {
          library = import.version_library;
        }
      } else {
        for (const CudaDependency& dependency : cuda_libraries) {
          bool exports_it =
              dependency.file != nullptr
                  ? dependency.file->find_export(import.name, "") != nullptr
                  : library_by_symbol_name(import.name) == classify_library(dependency.name);
          if (exports_it) {
            library = dependency.name;
            break;
          }
        }
      }
      if (library.empty()) continue;  // not a CUDA import
      auto [it, inserted] = found.try_emplace({library, import.name});
      if (inserted) {
        it->second.first.library = library;
        it->second.first.symbol = import.name;
        it->second.second = import.version;
      }
      auto& importers = it->second.first.importers;
      if (std::find(importers.begin(), importers.end(), file->path) == importers.end()) {
        importers.push_back(file->path);
      }
    }
  }

  CoverageReport report;
  for (auto& [key, entry] : found) {
    ImportedSymbol& symbol = entry.first;
    const std::string& version = entry.second;
    const CudaLibrary kind = classify_library(symbol.library);
    if (kind == CudaLibrary::kNvrtc) {
      symbol.coverage = Coverage::kLocal;
    } else {
      const std::string replacement(replacement_for(kind));
      auto it = replacements.find(replacement);
      if (it == replacements.end()) {
        symbol.coverage = Coverage::kMissing;
        note_set.insert(str_cat(replacement, " (the replacement for ", symbol.library,
                                ") is not built: its symbols are reported missing"));
      } else if (it->second.find_export(symbol.symbol, version) != nullptr) {
        // libhibercuda.so serves the runtime's and the driver's tables: an unversioned import
        // may name either.
        std::optional<Coverage> disposition = declared(kind, symbol.symbol);
        if (!disposition && kind == CudaLibrary::kRuntime) {
          disposition = declared(CudaLibrary::kDriver, symbol.symbol);
        }
        if (!disposition && kind == CudaLibrary::kDriver) {
          disposition = declared(CudaLibrary::kRuntime, symbol.symbol);
        }
        if (disposition) {
          symbol.coverage = *disposition;
        } else {
          symbol.coverage = Coverage::kMissing;
          note_set.insert(str_cat(replacement, " exports ", symbol.symbol,
                                  ", which no declaration table names: built from other sources?"));
        }
      } else {
        symbol.coverage = Coverage::kMissing;
        const auto& exports = it->second.exports;
        bool defines_version = std::any_of(exports.begin(), exports.end(), [&](const ElfSymbol& e) {
          return e.version == version;
        });
        if (!version.empty() && !defines_version) {
          note_set.insert(str_cat(replacement, " defines no version ", version,
                                  ": the imports of that version are missing"));
        }
      }
    }
    report.symbols.push_back(std::move(symbol));
  }
  report.notes.assign(note_set.begin(), note_set.end());
  return report;
}

namespace {

// What the walk keeps of each file it reads.
struct ScannedNode {
  ElfFile file;
  int loader = -1;     // index of the node whose NEEDED pulled it in; -1 for the named file
  std::string origin;  // the directory $ORIGIN stands for
};

class DependencyWalker {
 public:
  DependencyWalker(const SearchConfig& search, uint8_t elf_class, uint16_t machine)
      : search_(search), elf_class_(elf_class), machine_(machine) {}

  // Where the loader finds `name`, needed by nodes[requester]; "" when nowhere.
  std::string resolve(const std::string& name, const std::deque<ScannedNode>& nodes,
                      int requester) const {
    if (name.find('/') != std::string::npos) return fits(name) ? name : "";
    const ScannedNode& node = nodes[static_cast<size_t>(requester)];
    // DT_RPATH of the requester and then of each loader up the chain, unless the requester has
    // DT_RUNPATH (glibc's _dl_map_object).
    if (node.file.runpath.empty()) {
      for (int i = requester; i >= 0; i = nodes[static_cast<size_t>(i)].loader) {
        const ScannedNode& loader = nodes[static_cast<size_t>(i)];
        if (auto found = in_dirs(name, expand_origin(loader.file.rpath, loader.origin));
            !found.empty()) {
          return found;
        }
      }
    }
    if (auto found = in_dirs(name, search_.ld_library_path); !found.empty()) return found;
    if (auto found = in_dirs(name, expand_origin(node.file.runpath, node.origin)); !found.empty()) {
      return found;
    }
    if (auto it = search_.ld_cache.find(name); it != search_.ld_cache.end()) {
      for (const std::string& path : it->second) {
        if (fits(path)) return path;
      }
    }
    return in_dirs(name, search_.default_dirs);
  }

 private:
  std::string in_dirs(const std::string& name, const std::vector<std::string>& dirs) const {
    for (const std::string& dir : dirs) {
      std::string path = dir;
      path += '/';
      path += name;
      if (fits(path)) return path;
    }
    return "";
  }

  // The loader skips a file of another class or machine and keeps looking.
  bool fits(const std::string& path) const {
    if (!is_regular_file(path)) return false;
    auto kind = read_elf_class_and_machine(path);
    return kind.ok() && kind->first == elf_class_ && kind->second == machine_;
  }

  const SearchConfig& search_;
  uint8_t elf_class_;
  uint16_t machine_;
};

}  // namespace

Result<CoverageReport> scan(const std::string& path, const ScanOptions& options) {
  HIBER_ASSIGN_OR_RETURN(ElfFile root, read_elf_file(path));
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(path, ec);
  std::deque<ScannedNode> nodes;  // a deque: resolve() reads earlier nodes while we append
  nodes.push_back({std::move(root), -1, directory_of(ec ? path : real.string())});
  DependencyWalker walker(options.search, nodes[0].file.elf_class, nodes[0].file.machine);

  std::vector<std::string> notes;
  std::set<std::string> seen_names;  // the loader loads each name once
  std::set<std::string> seen_paths;
  seen_paths.insert(ec ? path : real.string());
  if (!nodes[0].file.soname.empty()) seen_names.insert(nodes[0].file.soname);
  std::vector<std::string> cuda_names;
  std::map<std::string, std::string> cuda_paths;
  // Breadth first, as the loader orders the global scope.
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::vector<std::string> needed = nodes[i].file.needed;
    for (const std::string& name : needed) {
      if (!seen_names.insert(name).second) continue;
      std::string found = walker.resolve(name, nodes, static_cast<int>(i));
      if (classify_library(name) != CudaLibrary::kNone) {
        // Not followed: Hiber replaces it, so its own imports never run.
        cuda_names.push_back(name);
        if (!found.empty()) cuda_paths[name] = found;
        continue;
      }
      if (found.empty()) {
        notes.push_back(
            str_cat(name, " (needed by ", nodes[i].file.path, ") not found: not scanned"));
        continue;
      }
      std::filesystem::path canonical = std::filesystem::canonical(found, ec);
      if (!seen_paths.insert(ec ? found : canonical.string()).second) continue;
      auto file = read_elf_file(found);
      if (!file.ok()) {
        notes.push_back(
            str_cat(file.status().message(), " (needed by ", nodes[i].file.path, "): not scanned"));
        continue;
      }
      nodes.push_back({std::move(*file), static_cast<int>(i), directory_of(found)});
    }
  }
  if (cuda_names.empty()) {
    notes.push_back(str_cat(path,
                            " needs no CUDA library: symbols it finds with dlopen and dlsym at "
                            "run time are not seen"));
  }

  // The CUDA libraries themselves are read only for their export lists, to attribute
  // unversioned imports.
  std::vector<ElfFile> cuda_files;
  cuda_files.reserve(cuda_names.size());
  std::vector<CudaDependency> cuda_libraries;
  for (const std::string& name : cuda_names) {
    CudaDependency dependency{name, nullptr};
    if (auto it = cuda_paths.find(name); it != cuda_paths.end()) {
      if (auto file = read_elf_file(it->second); file.ok()) {
        cuda_files.push_back(std::move(*file));
        dependency.file = &cuda_files.back();
      }
    }
    if (dependency.file == nullptr) {
      notes.push_back(str_cat(name,
                              " is not on this machine: unversioned imports are attributed to it "
                              "by their names"));
    }
    // The loader wants the file even though the shim defines every driver call.
    if (classify_library(name) == CudaLibrary::kDriver) {
      const std::string standin = options.shim_dir + "/driver/libcuda.so.1";
      notes.push_back(
          is_regular_file(standin)
              ? str_cat(name, " (the NVIDIA driver) is needed: on a node without it, ", standin,
                        " stands in for it (put ", options.shim_dir, "/driver on LD_LIBRARY_PATH)")
              : str_cat(name, " (the NVIDIA driver) is needed, and Hiber's stand-in ", standin,
                        " is not built: on a node without the driver the program will not start"));
    }
    cuda_libraries.push_back(std::move(dependency));
  }

  std::map<std::string, ElfFile> replacements;
  for (CudaLibrary kind : {CudaLibrary::kRuntime, CudaLibrary::kCublas, CudaLibrary::kCublasLt,
                           CudaLibrary::kCudnn, CudaLibrary::kNvml}) {
    std::string name(replacement_for(kind));
    std::string replacement_path = options.shim_dir + "/" + name;
    if (!is_regular_file(replacement_path)) continue;
    auto file = read_elf_file(replacement_path);
    if (!file.ok()) return file.status().with_context("replacement library");
    replacements.emplace(name, std::move(*file));
  }

  std::vector<const ElfFile*> scanned;
  for (const ScannedNode& node : nodes) scanned.push_back(&node.file);
  CoverageReport report = assess(scanned, cuda_libraries, replacements, std::move(notes));
  report.file = path;
  report.shim_dir = options.shim_dir;
  return report;
}

// ---- Output ----

int exit_code(const CoverageReport& report) {
  for (const ImportedSymbol& symbol : report.symbols) {
    if (symbol.coverage == Coverage::kStub || symbol.coverage == Coverage::kMissing ||
        symbol.coverage == Coverage::kRefused) {
      return 1;
    }
  }
  return 0;
}

namespace {

constexpr std::array<Coverage, 5> kAllCoverages = {
    Coverage::kRemoted, Coverage::kStub, Coverage::kMissing, Coverage::kLocal, Coverage::kRefused};

// library -> count per Coverage, in library order.
std::map<std::string, std::array<int, kAllCoverages.size()>> count_by_library(
    const CoverageReport& report) {
  std::map<std::string, std::array<int, kAllCoverages.size()>> counts;
  for (const ImportedSymbol& symbol : report.symbols) {
    auto [it, inserted] = counts.try_emplace(symbol.library);
    if (inserted) it->second.fill(0);
    ++it->second[static_cast<size_t>(symbol.coverage)];
  }
  return counts;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string format_text(const CoverageReport& report, bool summary_only) {
  std::string out;
  if (!summary_only) {
    size_t library_width = 0;
    size_t symbol_width = 0;
    for (const ImportedSymbol& symbol : report.symbols) {
      library_width = std::max(library_width, symbol.library.size());
      symbol_width = std::max(symbol_width, symbol.symbol.size());
    }
    for (const ImportedSymbol& symbol : report.symbols) {
      out += symbol.library;
      out.append(library_width - symbol.library.size() + 2, ' ');
      out += symbol.symbol;
      out.append(symbol_width - symbol.symbol.size() + 2, ' ');
      out += coverage_name(symbol.coverage);
      out += '\n';
    }
  }
  for (const std::string& note : report.notes) out += str_cat("note: ", note, "\n");
  out += "summary:";
  auto counts = count_by_library(report);
  if (counts.empty()) out += " no CUDA symbols imported";
  bool first_library = true;
  for (const auto& [library, count] : counts) {
    out += str_cat(first_library ? " " : "; ", library, ":");
    first_library = false;
    bool first_count = true;
    for (Coverage coverage : kAllCoverages) {
      int n = count[static_cast<size_t>(coverage)];
      if (n == 0) continue;
      out += str_cat(first_count ? " " : ", ", n, " ", coverage_name(coverage));
      first_count = false;
    }
  }
  out += '\n';
  return out;
}

std::string format_json(const CoverageReport& report) {
  std::string out = "{\n";
  out += str_cat("  \"file\": ", json_string(report.file), ",\n");
  out += str_cat("  \"shim_dir\": ", json_string(report.shim_dir), ",\n");
  out += "  \"symbols\": [";
  for (size_t i = 0; i < report.symbols.size(); ++i) {
    const ImportedSymbol& symbol = report.symbols[i];
    out += str_cat(i == 0 ? "\n" : ",\n", "    {\"library\": ", json_string(symbol.library),
                   ", \"symbol\": ", json_string(symbol.symbol),
                   ", \"status\": ", json_string(coverage_name(symbol.coverage)),
                   ", \"importers\": [");
    for (size_t j = 0; j < symbol.importers.size(); ++j) {
      out += str_cat(j == 0 ? "" : ", ", json_string(symbol.importers[j]));
    }
    out += "]}";
  }
  out += report.symbols.empty() ? "],\n" : "\n  ],\n";
  out += "  \"summary\": {";
  bool first = true;
  for (const auto& [library, count] : count_by_library(report)) {
    out += str_cat(first ? "\n" : ",\n", "    ", json_string(library), ": {");
    first = false;
    for (size_t i = 0; i < kAllCoverages.size(); ++i) {
      out +=
          str_cat(i == 0 ? "" : ", ", json_string(coverage_name(kAllCoverages[i])), ": ", count[i]);
    }
    out += "}";
  }
  out += first ? "},\n" : "\n  },\n";
  out += "  \"notes\": [";
  for (size_t i = 0; i < report.notes.size(); ++i) {
    out += str_cat(i == 0 ? "" : ", ", json_string(report.notes[i]));
  }
  out += str_cat("],\n  \"complete\": ", exit_code(report) == 0 ? "true" : "false", "\n}\n");
  return out;
}

}  // namespace hiber::coverage
