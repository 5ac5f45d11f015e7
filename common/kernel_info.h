// A kernel's name and parameter layout, as found in a fatbin or reported by the driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hiber {

// One kernel parameter: where it sits in the packed parameter buffer.
struct ParamInfo {
  uint32_t offset = 0;
  uint32_t bytes = 0;
  friend bool operator==(const ParamInfo&, const ParamInfo&) = default;
};

// Whether a parameter can hold a pointer: the parameter ABI aligns a pointer, and a struct
// holding one, to 8 bytes. Only such a parameter's 8-byte-aligned words are read as pointers
// (memory/translation.h, guard 1; the simulated GPU's argument check).
inline bool may_hold_pointer(const ParamInfo& param) {
  return param.bytes >= 8 && param.offset % 8 == 0;
}

struct KernelInfo {
  std::string name;               // mangled
  std::vector<ParamInfo> params;  // in declaration order
  // Bytes of the packed parameter buffer: the end of the last parameter.
  uint32_t param_bytes() const {
    return params.empty() ? 0 : params.back().offset + params.back().bytes;
  }
  friend bool operator==(const KernelInfo&, const KernelInfo&) = default;
};

}  // namespace hiber
