// cudaGetErrorName/String and cuGetErrorName/String.
#include "client_shim/driver_table.h"
#include "client_shim/error_tables.h"

namespace hiber::shim {
namespace {

const char* find(const ErrorName* table, int code) {
  for (; table->name != nullptr; ++table) {
    if (table->code == code) return table->name;
  }
  return nullptr;
}

// The texts of the errors programs meet most; the rest are described by their names.
const ErrorName kStrings[] = {{0, "no error"},
                              {1, "invalid argument"},
                              {2, "out of memory"},
                              {3, "initialization error"},
                              {4, "driver shutting down"},
                              {9, "invalid configuration argument"},
                              {46, "all CUDA-capable devices are busy or unavailable"},
                              {98, "invalid device function"},
                              {100, "no CUDA-capable device is detected"},
                              {101, "invalid device ordinal"},
                              {200, "device kernel image is invalid"},
                              {209, "no kernel image is available for execution on the device"},
                              {400, "invalid resource handle"},
                              {500, "named symbol not found"},
                              {600, "device not ready"},
                              {700, "an illegal memory access was encountered"},
                              {701, "too many resources requested for launch"},
                              {712, "part or all of the requested memory range is already mapped"},
                              {713, "pointer does not correspond to a registered memory region"},
                              {719, "unspecified launch failure"},
                              {801, "operation not supported"},
                              {909, "timeout"},
                              {999, "unknown error"},
                              {-1, nullptr}};

}  // namespace

const char* runtime_error_name(int code) { return find(kRuntimeErrorNames, code); }
const char* driver_error_name(int code) { return find(kDriverErrorNames, code); }

const char* runtime_error_string(int code) {
  if (const char* text = find(kStrings, code)) return text;
  return runtime_error_name(code);
}

}  // namespace hiber::shim
