#include "tools/elf_file.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <utility>

#include "common/unique_fd.h"

namespace hiber::coverage {
namespace {

struct ElfEnd {
  void operator()(Elf* elf) const { elf_end(elf); }
};
using ElfHandle = std::unique_ptr<Elf, ElfEnd>;

std::vector<std::string> split_path_list(std::string_view list) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(':', start);
    if (end == std::string_view::npos) end = list.size();
    if (end > start) parts.emplace_back(list.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// An open ELF file whose header says executable or shared library.
struct OpenElf {
  UniqueFd fd;
  ElfHandle elf;
  GElf_Ehdr header{};
};

Result<OpenElf> open_elf(const std::string& path) {
  OpenElf open;
  open.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!open.fd.valid()) {
    int err = errno;
    return Status(err == ENOENT ? ErrorCode::kFileNotFound : ErrorCode::kOperatingSystem,
                  str_cat(path, ": ", std::strerror(err)));
  }
  // Once per process; libelf answers EV_NONE only for a version it does not know.
  static const bool version_ok = elf_version(EV_CURRENT) != EV_NONE;
  if (!version_ok) return error(ErrorCode::kUnknown, "libelf: ", elf_errmsg(-1));
  open.elf.reset(elf_begin(open.fd.get(), ELF_C_READ, nullptr));
  if (open.elf == nullptr || elf_kind(open.elf.get()) != ELF_K_ELF ||
      gelf_getehdr(open.elf.get(), &open.header) == nullptr) {
    return error(ErrorCode::kInvalidImage, path, ": not an ELF file");
  }
  if (open.header.e_type != ET_EXEC && open.header.e_type != ET_DYN) {
    return error(ErrorCode::kInvalidImage, path,
                 ": not an ELF executable or shared library (e_type ", open.header.e_type, ")");
  }
  return open;
}

// The string at `offset` of string table section `strtab`; "" where it is out of range.
std::string string_at(Elf* elf, size_t strtab, size_t offset) {
  const char* s = elf_strptr(elf, strtab, offset);
  return s != nullptr ? std::string(s) : std::string();
}

struct VersionName {
  std::string name;
  std::string library;  // verneed only
};

// .gnu.version_r: version index -> (version, library that defines it).
void read_version_needs(Elf* elf, Elf_Scn* section, size_t strtab,
                        std::map<uint16_t, VersionName>* versions) {
  Elf_Data* data = elf_getdata(section, nullptr);
  if (data == nullptr) return;
  size_t offset = 0;
  for (;;) {
    GElf_Verneed need;
    if (gelf_getverneed(data, static_cast<int>(offset), &need) == nullptr) return;
    std::string library = string_at(elf, strtab, need.vn_file);
    size_t aux_offset = offset + need.vn_aux;
    for (unsigned i = 0; i < need.vn_cnt; ++i) {
      GElf_Vernaux aux;
      if (gelf_getvernaux(data, static_cast<int>(aux_offset), &aux) == nullptr) return;
      (*versions)[aux.vna_other] = {string_at(elf, strtab, aux.vna_name), library};
      if (aux.vna_next == 0) break;
      aux_offset += aux.vna_next;
    }
    if (need.vn_next == 0) return;
    offset += need.vn_next;
  }
}

// .gnu.version_d: version index -> version name (the first verdaux of each entry).
void read_version_definitions(Elf* elf, Elf_Scn* section, size_t strtab,
                              std::map<uint16_t, VersionName>* versions) {
  Elf_Data* data = elf_getdata(section, nullptr);
  if (data == nullptr) return;
  size_t offset = 0;
  for (;;) {
    GElf_Verdef def;
    if (gelf_getverdef(data, static_cast<int>(offset), &def) == nullptr) return;
    GElf_Verdaux aux;
    // The base entry (VER_FLG_BASE) names the file itself, not a version symbols carry.
    if ((def.vd_flags & VER_FLG_BASE) == 0 &&
        gelf_getverdaux(data, static_cast<int>(offset + def.vd_aux), &aux) != nullptr) {
      (*versions)[def.vd_ndx] = {string_at(elf, strtab, aux.vda_name), ""};
    }
    if (def.vd_next == 0) return;
    offset += def.vd_next;
  }
}

}  // namespace

const ElfSymbol* ElfFile::find_export(const std::string& name, const std::string& version) const {
  const ElfSymbol* unversioned = nullptr;
  for (const ElfSymbol& symbol : exports) {
    if (symbol.name != name) continue;
    if (version.empty()) {
      // An unversioned reference binds to the default version only.
      if (!symbol.hidden_version) return &symbol;
    } else if (symbol.version == version) {
      return &symbol;
    } else if (symbol.version.empty()) {
      // glibc accepts an unversioned definition for a versioned reference.
      unversioned = &symbol;
    }
  }
  return unversioned;
}

Result<std::pair<uint8_t, uint16_t>> read_elf_class_and_machine(const std::string& path) {
  HIBER_ASSIGN_OR_RETURN(OpenElf open, open_elf(path));
  return std::make_pair(static_cast<uint8_t>(open.header.e_ident[EI_CLASS]),
                        static_cast<uint16_t>(open.header.e_machine));
}

Result<ElfFile> read_elf_file(const std::string& path) {
  HIBER_ASSIGN_OR_RETURN(OpenElf open, open_elf(path));
  Elf* elf = open.elf.get();
  ElfFile file;
  file.path = path;
  file.elf_class = open.header.e_ident[EI_CLASS];
  file.machine = open.header.e_machine;

  Elf_Scn* dynsym = nullptr;
  Elf_Scn* versym = nullptr;
  std::map<uint16_t, VersionName> versions;
  for (Elf_Scn* section = elf_nextscn(elf, nullptr); section != nullptr;
       section = elf_nextscn(elf, section)) {
    GElf_Shdr header;
    if (gelf_getshdr(section, &header) == nullptr) continue;
    switch (header.sh_type) {
      case SHT_DYNSYM: dynsym = section; break;
      case SHT_GNU_versym: versym = section; break;
      case SHT_GNU_verneed: read_version_needs(elf, section, header.sh_link, &versions); break;
      case SHT_GNU_verdef: read_version_definitions(elf, section, header.sh_link, &versions); break;
      case SHT_DYNAMIC: {
        Elf_Data* data = elf_getdata(section, nullptr);
        if (data == nullptr || header.sh_entsize == 0) break;
        for (size_t i = 0; i < header.sh_size / header.sh_entsize; ++i) {
          GElf_Dyn entry;
          if (gelf_getdyn(data, static_cast<int>(i), &entry) == nullptr) break;
          if (entry.d_tag == DT_NULL) break;
          switch (entry.d_tag) {
            case DT_NEEDED:
              file.needed.push_back(string_at(elf, header.sh_link, entry.d_un.d_val));
              break;
            case DT_SONAME: file.soname = string_at(elf, header.sh_link, entry.d_un.d_val); break;
            case DT_RPATH:
              file.rpath = split_path_list(string_at(elf, header.sh_link, entry.d_un.d_val));
              break;
            case DT_RUNPATH:
              file.runpath = split_path_list(string_at(elf, header.sh_link, entry.d_un.d_val));
              break;
            default: break;
          }
        }
        break;
      }
      default: break;
    }
  }
  if (dynsym == nullptr) return file;  // statically linked: imports and exports nothing

  GElf_Shdr dynsym_header;
  Elf_Data* symbols = elf_getdata(dynsym, nullptr);
  if (gelf_getshdr(dynsym, &dynsym_header) == nullptr || symbols == nullptr ||
      dynsym_header.sh_entsize == 0) {
    return error(ErrorCode::kInvalidImage, path, ": unreadable dynamic symbol table");
  }
  Elf_Data* version_indices = versym != nullptr ? elf_getdata(versym, nullptr) : nullptr;
  const size_t count = dynsym_header.sh_size / dynsym_header.sh_entsize;
  for (size_t i = 1; i < count; ++i) {  // entry 0 is the null symbol
    GElf_Sym sym;
    if (gelf_getsym(symbols, static_cast<int>(i), &sym) == nullptr) break;
    const int binding = GELF_ST_BIND(sym.st_info);
    if (binding != STB_GLOBAL && binding != STB_WEAK && binding != STB_GNU_UNIQUE) continue;
    ElfSymbol symbol;
    symbol.name = string_at(elf, dynsym_header.sh_link, sym.st_name);
    if (symbol.name.empty()) continue;
    symbol.weak = binding == STB_WEAK;
    GElf_Versym index = 0;
    if (version_indices != nullptr &&
        gelf_getversym(version_indices, static_cast<int>(i), &index) != nullptr) {
      symbol.hidden_version = (index & 0x8000) != 0;
      if (auto it = versions.find(index & 0x7fff); it != versions.end()) {
        symbol.version = it->second.name;
        symbol.version_library = it->second.library;
      }
    }
    if (sym.st_shndx == SHN_UNDEF) {
      symbol.hidden_version = false;
      file.imports.push_back(std::move(symbol));
    } else if (GELF_ST_VISIBILITY(sym.st_other) == STV_DEFAULT ||
               GELF_ST_VISIBILITY(sym.st_other) == STV_PROTECTED) {
      symbol.version_library.clear();
      file.exports.push_back(std::move(symbol));
    }
  }
  return file;
}

}  // namespace hiber::coverage
