// Error code names, generated from the toolkit's headers (generate_sources.cmake).
#pragma once

namespace hiber::shim {

struct ErrorName {
  int code;
  const char* name;
};

// Each ends with {-1, nullptr}.
extern const ErrorName kRuntimeErrorNames[];
extern const ErrorName kDriverErrorNames[];

}  // namespace hiber::shim
