// The shim's declaration tables (client_shim/entry_points/*.entries) against the toolkit and the
// built replacement libraries:
//   - every name the toolkit's library exports has a row, and every row names one of its exports
//     (the toolkit's libcudart, libcuda stub, libcublas, libcublasLt, libcudnn; NVML has no
//     toolkit library and is held against the built libhibernvml.so only);
//   - each built replacement exports exactly its rows (the runtime's with its version node), so
//     no entry point is missing and none is exported that no row declares;
//   - a row's syntax is what cmake/HiberEntryPoints.cmake reads, and every refusal says why.
// "Every remoted, local or refused row has a body" is the link's: a missing hiber_entry::<name>
// is an undefined reference under -z defs, and a body of another signature does not compile
// (the generated declarations hold the header's).
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tools/elf_file.h"

namespace hiber::coverage {
namespace {

struct Row {
  std::string kind;  // remoted, local, refused, stub
  int line = 0;
};

// The rows of `table`, read as the generator reads them (independently written here).
std::map<std::string, Row> read_table(const std::string& table) {
  std::ifstream in(std::string(HIBER_ENTRY_TABLE_DIR) + "/" + table + ".entries");
  EXPECT_TRUE(in.good()) << table;
  static const std::regex with_body(
      R"(^([A-Za-z_][A-Za-z0-9_]*)[ \t]+(remoted|local)[ \t]+[0-9]+([ \t]+overloaded)?[ \t]*$)");
  static const std::regex refused(
      R"(^([A-Za-z_][A-Za-z0-9_]*)[ \t]+refused[ \t]+[0-9]+[ \t]+[^"\\]+$)");
  static const std::regex stub(R"(^([A-Za-z_][A-Za-z0-9_]*)[ \t]+stub[ \t]*$)");
  static const std::regex blank(R"(^[ \t]*(#.*)?$)");
  std::map<std::string, Row> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::smatch match;
    std::string kind;
    if (std::regex_match(line, blank)) continue;
    if (std::regex_match(line, match, with_body)) {
      kind = match[2];
    } else if (std::regex_match(line, match, refused)) {
      kind = "refused";
    } else if (std::regex_match(line, match, stub)) {
      kind = "stub";
    } else {
      ADD_FAILURE() << table << ".entries:" << number << ": not a row: " << line;
      continue;
    }
    EXPECT_TRUE(rows.emplace(match[1], Row{kind, number}).second)
        << table << ".entries:" << number << ": " << match[1] << " is declared twice";
  }
  return rows;
}

// The function names `path` exports (the version node's own absolute symbol left out), each
// with its version.
std::map<std::string, std::string> exported_names(const std::string& path) {
  auto file = read_elf_file(path);
  EXPECT_TRUE(file.ok()) << path << ": " << file.status();
  std::map<std::string, std::string> names;
  if (!file.ok()) return names;
  for (const ElfSymbol& symbol : file->exports) {
    if (symbol.name == symbol.version) continue;
    names.emplace(symbol.name, symbol.version);
  }
  return names;
}

std::string toolkit_library(const std::string& name) {
  for (const char* dir : {"/lib64", "/lib", "/targets/x86_64-linux/lib", "/lib64/stubs",
                          "/lib/stubs", "/targets/x86_64-linux/lib/stubs"}) {
    const std::string path = std::string(HIBER_CUDA_ROOT) + dir + "/" + name;
    if (std::filesystem::exists(path)) return path;
  }
  return "";
}

struct Library {
  std::string table;
  std::string toolkit_file;  // "" for NVML
  std::string replacement;   // the built file
  std::string version;       // the version node of its rows ("" unversioned)
};

std::vector<Library> libraries() {
  const std::string shim_dir = HIBER_SHIM_DIR;
  return {
      {"cudart", HIBER_CUDART_SONAME, shim_dir + "/libhibercuda.so", HIBER_CUDART_SONAME},
      {"cuda", "libcuda.so", shim_dir + "/libhibercuda.so", ""},
      {"cublas", HIBER_CUBLAS_SONAME, shim_dir + "/libhibercublas.so", HIBER_CUBLAS_SONAME},
      {"cublasLt", HIBER_CUBLASLT_SONAME, shim_dir + "/libhibercublasLt.so", HIBER_CUBLASLT_SONAME},
      {"cudnn", HIBER_CUDNN_SONAME, shim_dir + "/libhibercudnn.so", HIBER_CUDNN_SONAME},
      {"nvml", "", shim_dir + "/libhibernvml.so", ""},
  };
}

class EntryTable : public ::testing::TestWithParam<Library> {};

TEST_P(EntryTable, DeclaresEveryExportOfTheToolkitsLibraryAndNothingElse) {
  const Library& library = GetParam();
  if (library.toolkit_file.empty()) GTEST_SKIP() << "the toolkit ships no " << library.table;
  const std::string path = toolkit_library(library.toolkit_file);
  ASSERT_FALSE(path.empty()) << library.toolkit_file << " is not under " << HIBER_CUDA_ROOT;
  const auto rows = read_table(library.table);
  const auto exports = exported_names(path);
  for (const auto& [name, version] : exports) {
    EXPECT_TRUE(rows.contains(name)) << path << " exports " << name << ", which " << library.table
                                     << ".entries does not declare";
  }
  for (const auto& [name, row] : rows) {
    EXPECT_TRUE(exports.contains(name)) << library.table << ".entries:" << row.line << ": " << name
                                        << " is not exported by " << path;
  }
}

TEST_P(EntryTable, TheReplacementExportsEveryRowWithItsVersionNode) {
  const Library& library = GetParam();
  const auto rows = read_table(library.table);
  const auto exports = exported_names(library.replacement);
  for (const auto& [name, row] : rows) {
    auto it = exports.find(name);
    ASSERT_NE(it, exports.end()) << library.replacement << " does not export " << name << " ("
                                 << library.table << ".entries:" << row.line << ")";
    EXPECT_EQ(it->second, library.version) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Libraries, EntryTable, ::testing::ValuesIn(libraries()),
                         [](const auto& info) { return info.param.table; });

// A replacement exports nothing beyond its tables but Hiber's own documented names.
TEST(EntryTables, NoReplacementExportsAnUndeclaredName) {
  std::map<std::string, std::set<std::string>> declared;
  for (const Library& library : libraries()) {
    for (const auto& [name, row] : read_table(library.table)) {
      declared[library.replacement].insert(name);
    }
  }
  // libhibercuda.so's own: dlopen interposition, the last error's message, the core's services
  // for the replacement libraries (HIBER_SHIM_PRIVATE); and the C++ standard library's inline
  // template instances (std::, vague linkage: default visibility by libstdc++'s own pragma).
  const std::regex own(
      R"(^(dlopen|dlsym|dlclose|dlerror|hiber_shim_.*|_ZN5hiber4shim.*|_Z[A-Z]*N?K?St.*|_ZSt.*)$)");
  for (const auto& [file, names] : declared) {
    for (const auto& [name, version] : exported_names(file)) {
      if (names.contains(name) || std::regex_match(name, own)) continue;
      ADD_FAILURE() << file << " exports " << name << "@" << version
                    << ", which no declaration table names";
    }
  }
}

// What the documentation and hiber-coverage rely on: the three documented refusals are refused
// rows, with a reason.
TEST(EntryTables, TheDocumentedRefusalsAreRefusedRows) {
  EXPECT_EQ(read_table("cudart")["cudaHostGetDevicePointer"].kind, "refused");
  EXPECT_EQ(read_table("cuda")["cuMemHostGetDevicePointer_v2"].kind, "refused");
  EXPECT_EQ(read_table("cuda")["cuModuleGetGlobal_v2"].kind, "refused");
}

}  // namespace
}  // namespace hiber::coverage
