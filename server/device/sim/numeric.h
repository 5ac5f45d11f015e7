// Number formats of the simulated GPU's host implementations: IEEE half and bfloat16 to and
// from float, rounding to nearest even as the GPU's conversions do, and reading and writing an
// element of a cudaDataType_t as float or double.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace hiber::device::sim {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf or NaN (kept quiet)
    return sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds beyond 65504: inf
  if (magnitude < 0x38800000u) {                        // below 2^-14: subnormal or zero
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;  // units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));  // ties to even (default mode)
  }
  // Normal: drop 13 mantissa bits, rounding to nearest even.
  const uint32_t rebased = magnitude - (112u << 23);
  const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// cudaDataType_t values the host implementations compute with.
enum HostType : int32_t {
  kHostF32 = 0,    // CUDA_R_32F
  kHostF64 = 1,    // CUDA_R_64F
  kHostF16 = 2,    // CUDA_R_16F
  kHostBF16 = 14,  // CUDA_R_16BF
};
inline bool is_host_type(int32_t type) {
  return type == kHostF32 || type == kHostF64 || type == kHostF16 || type == kHostBF16;
}

// Element i of an array of `type` at p, as double (exact for every type here).
inline double load_element(const void* p, int32_t type, int64_t i) {
  switch (type) {
    case kHostF32: return static_cast<const float*>(p)[i];
    case kHostF64: return static_cast<const double*>(p)[i];
    case kHostF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case kHostBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

// Stores v as `type` (rounded to nearest even; through float for the 16-bit types).
inline void store_element(void* p, int32_t type, int64_t i, double v) {
  switch (type) {
    case kHostF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case kHostF64: static_cast<double*>(p)[i] = v; break;
    case kHostF16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case kHostBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
  }
}

}  // namespace hiber::device::sim
