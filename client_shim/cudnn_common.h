// libhibercudnn.so's shared pieces: statuses, the last error, handle lookup, and the registry
// that tells the descriptors this library made from any other pointer (a bad descriptor is
// refused with CUDNN_STATUS_BAD_PARAM before anything reads it).
#pragma once

#include <cudnn.h>

#include <mutex>
#include <string>
#include <unordered_set>

#include "client_shim/cudnn_entry_decls.h"
#include "client_shim/library_client.h"
#include "common/status.h"

#define HIBER_API extern "C" __attribute__((visibility("default")))

namespace hiber::shim::dnn {

// Records `message` as the thread's last error (cudnnGetLastErrorString) and logs it once.
void set_last_error(const std::string& message);
std::string take_last_error();

// The cuDNN status of a Status; a failure is recorded and logged, naming `call`.
cudnnStatus_t fail(const char* call, const Status& s);
inline cudnnStatus_t bad_param(const char* call, const std::string& why) {
  return fail(call, error(ErrorCode::kInvalidValue, why));
}
inline cudnnStatus_t not_supported(const char* call, const std::string& why) {
  return fail(call, error(ErrorCode::kNotSupported, why));
}

// The handle the program passed, or nullptr (recorded as the last error).
LibraryHandleObj* handle_of(cudnnHandle_t handle, const char* call);

// Live objects of one kind, by address.
template <typename T>
class Registry {
 public:
  T* make() {
    std::lock_guard lock(mu_);
    T* made = new T();
    live_.insert(made);
    return made;
  }
  bool destroy(const void* p) {
    std::lock_guard lock(mu_);
    if (live_.erase(p) == 0) return false;
    delete static_cast<const T*>(p);
    return true;
  }
  // The object, or nullptr if `p` is not a live one. The program must not destroy it while
  // using it (cuDNN's rule too).
  T* find(const void* p) {
    std::lock_guard lock(mu_);
    return live_.contains(p) ? static_cast<T*>(const_cast<void*>(p)) : nullptr;
  }

 private:
  std::mutex mu_;
  std::unordered_set<const void*> live_;
};

}  // namespace hiber::shim::dnn
