// Lookups shared by the runtime and driver front-ends.
#pragma once

namespace hiber::shim {

// The shim's own implementation of a driver API function, by its base name as
// cuGetProcAddress and cudaGetDriverEntryPoint take it (the newest "_vN" that is not newer than
// `cuda_version`); an unimplemented one resolves to its loudly failing stub. nullptr if the
// driver API has no such function.
void* driver_entry_point(const char* symbol, int cuda_version);

// Names and descriptions of error codes (generated from the toolkit's headers).
const char* runtime_error_name(int code);
const char* runtime_error_string(int code);
const char* driver_error_name(int code);

}  // namespace hiber::shim
