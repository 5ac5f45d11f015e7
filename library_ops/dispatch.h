// What HIBER_LIBRARY_OPS (library_ops.h) generates over the argument structs: each struct's
// operation (op_of) and checks, and dispatch(), by which every consumer turns an operation number
// and its bytes into a call of its handler for that operation.
#pragma once

#include <span>
#include <string_view>
#include <type_traits>

#include "common/status.h"
#include "library_ops/blas_ops.h"
#include "library_ops/dnn_ops.h"
#include "library_ops/library_ops.h"

namespace hiber::library_ops {

// The operation a handler is called for.
template <LibraryOp op>
struct OpTag {
  static constexpr LibraryOp kOp = op;
};

// Every argument struct of the table is copied byte for byte.
#define HIBER_OP_CHECK_(name, number, library, kind, args, api)                              \
  static_assert(std::is_same_v<args, Encoded> ||                                             \
                    (std::is_trivially_copyable_v<args> && std::is_standard_layout_v<args>), \
                #args " travels byte for byte: it must be trivially copyable");
HIBER_LIBRARY_OPS(HIBER_OP_CHECK_)
#undef HIBER_OP_CHECK_

namespace internal {
template <typename Args>
consteval LibraryOp op_taking() {
  LibraryOp found{};
  int rows = 0;
#define HIBER_OP_OF_(name, number, library, kind, args, api) \
  if constexpr (std::is_same_v<Args, args>) {                \
    found = LibraryOp::k##name;                              \
    ++rows;                                                  \
  }
  HIBER_LIBRARY_OPS(HIBER_OP_OF_)
#undef HIBER_OP_OF_
  if (rows != 1) throw "no operation, or more than one, takes these arguments";
  return found;
}
}  // namespace internal

// The operation whose arguments are `Args`: blas::Gemm's is kBlasGemm.
template <typename Args>
inline constexpr LibraryOp op_of = internal::op_taking<Args>();

// A handler from one lambda per operation: Handlers{[](OpTag<LibraryOp::kBlasGemm>, const
// blas::Gemm& g) {...}, ...}.
template <typename... F>
struct Handlers : F... {
  using F::operator()...;
};
template <typename... F>
Handlers(F...) -> Handlers<F...>;

// Calls handler(OpTag<op>{}, arguments) for an operation of `library` and `kind`, where the
// arguments are the operation's struct read from `bytes` (its size checked: kInvalidValue) or,
// for an Encoded operation, `bytes` as they are. Any other operation number is kNotSupported,
// "<library> operation <n> is not one <who> runs". R: the handler's result, Status or Result<T>.
template <typename R, Library library, Kind kind, typename Handler>
R dispatch(LibraryOp op, std::span<const std::byte> bytes, std::string_view who,
           Handler&& handler) {
  switch (op) {
#define HIBER_OP_CASE_(name, number, row_library, row_kind, args, api)         \
  case LibraryOp::k##name:                                                     \
    if constexpr (Library::row_library == library && Kind::row_kind == kind) { \
      if constexpr (std::is_same_v<args, Encoded>) {                           \
        return handler(OpTag<LibraryOp::k##name>{}, bytes);                    \
      } else {                                                                 \
        Result<args> decoded = read_op<args>(bytes, api);                      \
        if (!decoded.ok()) return decoded.status();                            \
        return handler(OpTag<LibraryOp::k##name>{}, *decoded);                 \
      }                                                                        \
    }                                                                          \
    break;
    HIBER_LIBRARY_OPS(HIBER_OP_CASE_)
#undef HIBER_OP_CASE_
  }
  return error(ErrorCode::kNotSupported, library_name(library),
               kind == Kind::kCall ? " operation " : " query ", static_cast<unsigned>(op),
               " is not one ", who, kind == Kind::kCall ? " runs" : " answers");
}

}  // namespace hiber::library_ops
