#include "wire/library.h"

namespace hiber::wire {

std::string_view library_name(Library library) {
  switch (library) {
    case Library::kBlas: return "cuBLAS";
    case Library::kDnn: return "cuDNN";
  }
  return "an unknown library";
}

}  // namespace hiber::wire
