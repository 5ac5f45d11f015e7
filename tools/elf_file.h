// The dynamic-linking view of one ELF file, read with elfutils' libelf: what it needs (NEEDED,
// RPATH, RUNPATH), what it imports and what it exports, each symbol with its version.
// hiber-coverage (tools/coverage.h) works on these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hiber::coverage {

struct ElfSymbol {
  std::string name;
  // The version node ("libcudart.so.13"); empty for an unversioned symbol.
  std::string version;
  // Imports only: the library the version belongs to, from .gnu.version_r ("libcudart.so.13").
  // Empty for an unversioned import.
  std::string version_library;
  bool weak = false;
  // Exports only: a non-default version (sym@VER rather than sym@@VER), reachable only by a
  // reference that names that version.
  bool hidden_version = false;
};

struct ElfFile {
  std::string path;
  uint8_t elf_class = 0;  // ELFCLASS32 or ELFCLASS64
  uint16_t machine = 0;   // EM_X86_64, ...
  std::string soname;
  std::vector<std::string> needed;   // DT_NEEDED, in order
  std::vector<std::string> rpath;    // DT_RPATH, split at ':', unexpanded
  std::vector<std::string> runpath;  // DT_RUNPATH, split at ':', unexpanded
  std::vector<ElfSymbol> imports;    // undefined dynamic symbols
  std::vector<ElfSymbol> exports;    // defined global, weak or unique dynamic symbols

  // The exported symbol a reference to `name` with `version` ("" for none) binds to, as glibc's
  // loader matches them; nullptr when there is none.
  const ElfSymbol* find_export(const std::string& name, const std::string& version) const;
};

// Reads `path`. Errors: kFileNotFound for a file that cannot be opened, kInvalidImage for one
// that is not an ELF executable or shared library.
Result<ElfFile> read_elf_file(const std::string& path);

// The class and machine of `path` only, for the loader's check that a candidate library fits the
// program; an error where it is not an ELF file.
Result<std::pair<uint8_t, uint16_t>> read_elf_class_and_machine(const std::string& path);

}  // namespace hiber::coverage
