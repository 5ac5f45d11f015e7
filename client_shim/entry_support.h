// What every exported entry point does around its hand-written body. The exported functions
// themselves are generated from the declaration tables (client_shim/entry_points/*.entries, by
// generate_entry_points.cmake): each has the toolkit header's signature and calls enter(), which
// runs the body (hiber::shim::entry::<name>) and, with HIBER_TRACE, traces the call.
//
// HIBER_TRACE: unset or 0, nothing; 1, one line per call on stderr with the arguments (handles
// and pointers in hex, sizes and enums as numbers), the duration and the result; "summary", at
// exit, the number of calls of each entry point (and the wire's calls, batches and round trips).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>

#ifndef HIBER_SHIM_EXPORT
#define HIBER_SHIM_EXPORT __attribute__((visibility("default")))
#endif

namespace hiber::shim {

// ---- Signatures from the toolkit's declarations ----

template <typename F>
struct Signature;
template <typename R, typename... A>
struct Signature<R(A...)> {
  using Result = R;
  using Params = std::tuple<A...>;
  static constexpr size_t kArity = sizeof...(A);
};
// decltype(::cudaMalloc) is cudaError_t(void**, size_t): result_of and param_of take it apart.
template <typename F>
using result_of = typename Signature<F>::Result;
template <typename F, size_t I>
using param_of = std::tuple_element_t<I, typename Signature<F>::Params>;
template <typename F>
inline constexpr size_t arity_of = Signature<F>::kArity;

// ---- Tracing ----

enum class TraceMode : uint8_t { kOff, kCalls, kSummary };

// HIBER_TRACE as this process set it (read once per library).
inline TraceMode trace_mode() {
  static const TraceMode mode = [] {
    const char* value = std::getenv("HIBER_TRACE");
    if (value == nullptr || *value == '\0' || std::strcmp(value, "0") == 0) return TraceMode::kOff;
    if (std::strcmp(value, "summary") == 0) return TraceMode::kSummary;
    return TraceMode::kCalls;
  }();
  return mode;
}

// One library's entry points, for the exit summary: `counts[i]` calls of `names[i]`.
struct EntryTable {
  const char* library;  // "libcudart.so.13"
  const char* const* names;
  std::atomic<uint64_t>* counts;
  size_t size;
};

// In the core (libhibercuda.so, HIBER_SHIM_PRIVATE): the summary prints every registered table
// and the calls of generated stubs at exit; a trace line goes to stderr whole.
HIBER_SHIM_EXPORT void library_register_entry_table(EntryTable* table);
HIBER_SHIM_EXPORT void library_trace_line(const std::string& line);
// A generated stub was called: traced and counted like an entry point.
HIBER_SHIM_EXPORT void library_trace_stub_call(const char* library, const char* name, int status);

// An argument as a trace shows it.
template <typename T>
void append_trace_arg(std::string& out, const T& value) {
  if constexpr (std::is_same_v<T, const char*>) {
    // Names (symbols, kernels, UUIDs, bus ids): quoted, at most 64 characters. Anything else
    // typed so (nvcc's registration passes a host function's address as a const char*) is shown
    // as a pointer, as a char* (an output buffer) is.
    size_t length = 0;
    bool printable = value != nullptr;
    while (printable && length < 64 && value[length] != '\0') {
      const unsigned char c = static_cast<unsigned char>(value[length++]);
      printable = c >= 0x20 && c < 0x7f;
    }
    if (printable) {
      out += '"';
      out.append(value, length);
      out += '"';
    } else {
      append_trace_arg(out, static_cast<const void*>(value));
    }
    return;
  }
  char buffer[64];
  if constexpr (std::is_pointer_v<T> || std::is_null_pointer_v<T>) {
    if (value == nullptr) {
      out += "null";
      return;
    }
    std::snprintf(buffer, sizeof buffer, "%p", reinterpret_cast<const void*>(value));
  } else if constexpr (std::is_floating_point_v<T>) {
    std::snprintf(buffer, sizeof buffer, "%g", static_cast<double>(value));
  } else if constexpr (std::is_enum_v<T> || std::is_signed_v<T>) {
    std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(value));
  } else if constexpr (std::is_integral_v<T>) {
    std::snprintf(buffer, sizeof buffer, "%llu", static_cast<unsigned long long>(value));
  } else if constexpr (requires { value.x, value.y, value.z; }) {  // dim3
    std::snprintf(
        buffer, sizeof buffer, "{%llu,%llu,%llu}", static_cast<unsigned long long>(value.x),
        static_cast<unsigned long long>(value.y), static_cast<unsigned long long>(value.z));
  } else {
    std::snprintf(buffer, sizeof buffer, "{%zu bytes}", sizeof(T));  // a struct by value
  }
  out += buffer;
}

template <typename... A>
std::string trace_call_text(const char* name, const A&... args) {
  std::string text = "hiber trace: ";
  text.append(name);
  text.push_back('(');
  bool first = true;
  const auto append = [&](const auto& arg) {
    if (!first) text.append(", ");
    first = false;
    append_trace_arg(text, arg);
  };
  (append(args), ...);
  (void)append;  // entry points without parameters
  text.push_back(')');
  return text;
}

// Runs entry point `index` of `table`, `body(args...)`, counted or traced as HIBER_TRACE says.
template <typename R, typename... P, typename... A>
R enter(EntryTable& table, size_t index, R (*body)(P...), A... args) {
  const TraceMode mode = trace_mode();
  if (mode == TraceMode::kOff) [[likely]] {
    return body(args...);
  }
  table.counts[index].fetch_add(1, std::memory_order_relaxed);
  if (mode == TraceMode::kSummary) return body(args...);
  // The line is made before the call: a body may change what its arguments point to, not them.
  std::string line = trace_call_text(table.names[index], args...);
  const auto start = std::chrono::steady_clock::now();
  const auto finish = [&] {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    char took[32];
    std::snprintf(took, sizeof took, " %.1f us", ns / 1000.0);
    line += took;
  };
  if constexpr (std::is_void_v<R>) {
    body(args...);
    finish();
    library_trace_line(line);
  } else {
    R result = body(args...);
    finish();
    line += " -> ";
    append_trace_arg(line, result);
    library_trace_line(line);
    return result;
  }
}

}  // namespace hiber::shim
