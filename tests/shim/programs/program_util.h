// Helpers shared by the test programs of tests/shim/programs: the kind of small header a CUDA
// user keeps beside their programs (error checks, arguments, a checksum). Host code only.
//
// Every program follows one contract, which the runners in tests/shim rely on:
//   - optional positional arguments (sizes, iterations), checked against a range;
//   - a CPU reference computed by the program itself, compared with every GPU output;
//   - exactly one summary line "<program>: OK ..." on full agreement, made only of values that
//     do not depend on the machine (no timings, no device names), so a native run and a run
//     through hiberd print the same line;
//   - exit status 0 on success, 1 on any CUDA error (after printing cudaGetErrorName and
//     cudaGetErrorString), 2 on bad arguments, 3 on results that differ from the reference;
//   - stdout line-buffered, and a "<program>: start ..." line once the first device memory is
//     allocated (the stress test kills a client after that line).
#pragma once

#include <dlfcn.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace program {

// Whether `function` (a library entry point the program calls) is Hiber's replacement rather than
// the real library: some checks are Hiber's promises (a bad descriptor or an unremoted call gets
// a clear error) where the real library's behaviour is undefined or different.
inline bool from_hiber(const void* function) {
  Dl_info where{};
  return dladdr(function, &where) != 0 && where.dli_fname != nullptr &&
         std::strstr(where.dli_fname, "hiber") != nullptr;
}

constexpr int kExitCudaError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitMismatch = 3;

// argv[index] as an integer in [min, max], or `fallback` if absent. Exits with kExitUsage if it
// is not a number in range.
inline long long int_arg(int argc, char** argv, int index, long long fallback, long long min,
                         long long max) {
  if (index >= argc) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(argv[index], &end, 0);
  if (errno != 0 || end == argv[index] || *end != '\0' || value < min || value > max) {
    std::fprintf(stderr, "%s: argument %d (\"%s\") must be an integer in [%lld, %lld]\n", argv[0],
                 index, argv[index], min, max);
    std::exit(kExitUsage);
  }
  return value;
}

// FNV-1a over bytes: a checksum of results for the summary line.
class Checksum {
 public:
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) hash_ = (hash_ ^ p[i]) * 0x100000001b3ull;
  }
  unsigned long long value() const { return static_cast<unsigned long long>(hash_); }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

// Counts elements that differ from the reference (compared with ==: the programs choose values
// whose float arithmetic is exact, so every correct path gives identical results) and prints the
// first few.
template <typename T>
size_t count_mismatches(const char* what, const T* got, const T* want, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] == want[i]) continue;
    if (bad < 5) {
      std::printf("  mismatch in %s[%zu]: got %.9g, want %.9g\n", what, i,
                  static_cast<double>(got[i]), static_cast<double>(want[i]));
    }
    ++bad;
  }
  if (bad > 5) std::printf("  ... %zu mismatches in %s in all\n", bad, what);
  return bad;
}

// Through Hiber, the message of the calling thread's last failing CUDA call (hiberd's reason,
// client_shim: hiber_shim_last_error_message); "" natively.
inline std::string hiber_error_message() {
  using Message = const char* (*)();
  static const auto message =
      reinterpret_cast<Message>(dlsym(RTLD_DEFAULT, "hiber_shim_last_error_message"));
  const char* text = message != nullptr ? message() : nullptr;
  return text != nullptr ? text : "";
}

// Set by a program that serves requests: a failing CUDA_CHECK then throws (the request's answer
// says why) instead of ending the process.
inline bool& cuda_failures_throw() {
  static bool enabled = false;
  return enabled;
}

// What CUDA_CHECK does on a failure: "<where>: <call> failed: <name>: <description>", with
// Hiber's message after it when there is one.
[[noreturn]] inline void cuda_failed(const char* file, int line, const char* call,
                                     const char* name, const char* description) {
  std::string text = std::string(file) + ":" + std::to_string(line) + ": " + call +
                     " failed: " + name + ": " + description;
  if (const std::string hiber = hiber_error_message(); !hiber.empty()) {
    text += " (hiberd: " + hiber + ")";
  }
  if (cuda_failures_throw()) throw std::runtime_error(text);
  std::fprintf(stderr, "%s\n", text.c_str());
  std::exit(kExitCudaError);
}

}  // namespace program

// A check of the program's own reference: a failure prints WRONG with the condition and exits
// kExitMismatch (the tests look for WRONG).
#define EXPECT(cond)                                                         \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: WRONG: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(program::kExitMismatch);                                     \
    }                                                                        \
  } while (0)

// Checks a CUDA runtime call; on failure prints where, the error's name and description (and,
// through Hiber, hiberd's reason), and exits with status 1 (throws in a serving program).
#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    const cudaError_t cuda_check_err_ = (call);                                            \
    if (cuda_check_err_ != cudaSuccess) {                                                  \
      program::cuda_failed(__FILE__, __LINE__, #call, cudaGetErrorName(cuda_check_err_),   \
                           cudaGetErrorString(cuda_check_err_));                           \
    }                                                                                      \
  } while (0)

// Checks the launch just made (<<<>>> reports configuration errors through cudaGetLastError).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
