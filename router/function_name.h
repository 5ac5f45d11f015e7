// The rule for a function's name, shared by the router's registry and the admission webhook
// (containers/webhook), which reads it from a pod label.
#pragma once

#include <string_view>

#include "common/status.h"

namespace hiber::router {

// A function name is a path segment of the API and a file name here: 1 to 128 of [A-Za-z0-9._-],
// not starting with '.'.
Status check_function_name(std::string_view name);

}  // namespace hiber::router
