#include "library_ops/library_ops.h"

namespace hiber::library_ops {

std::string_view library_name(Library library) {
  switch (library) {
    case Library::kBlas: return "cuBLAS";
    case Library::kDnn: return "cuDNN";
  }
  return "an unknown library";
}

std::string_view op_name(LibraryOp op) {
  OpRow row{};
  return op_row(static_cast<uint16_t>(op), &row) ? row.api : "an unknown library operation";
}

}  // namespace hiber::library_ops
