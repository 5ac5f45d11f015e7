#include "router/function_name.h"

namespace hiber::router {

Status check_function_name(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return error(ErrorCode::kInvalidValue, "a function name has 1 to 128 characters");
  }
  if (name.front() == '.') {
    return error(ErrorCode::kInvalidValue, "a function name does not start with '.'");
  }
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!allowed) {
      return error(ErrorCode::kInvalidValue,
                   "a function name is made of letters, digits, '.', '_' and '-'");
    }
  }
  return Status();
}

}  // namespace hiber::router
