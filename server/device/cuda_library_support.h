// What the CUDA backend's library parts (cuda_libraries.cc: cuBLAS; cuda_dnn.cc: cuDNN) share:
// opening a library at run time and resolving its entry points, and the table of real handles per
// (owner, client handle, GPU and context). Internal to server/device; see cuda_libraries.h for the
// design.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/cuda_device.h"
#include "server/device/cuda_libraries.h"

namespace hiber::device::cuda_lib {

struct OpenedLibrary {
  void* handle = nullptr;
  std::string path;  // for messages
};

// `soname` through the loader's default search, then in each folder. RTLD_LOCAL: nothing in
// hiberd needs their symbols globally, and a library opened later cannot bind to them by chance.
// The libraries find their own dependencies (libcublasLt.so.13, cuDNN's sub-libraries) next to
// themselves ($ORIGIN).
Result<OpenedLibrary> open_library(const CudaLibraryOptions& options, const char* soname);

// Resolves `name` into `*out`; kNotSupported naming the library when it lacks it (a version
// older than the headers Hiber was built with).
Status resolve(const OpenedLibrary& library, const char* name, void** out);

// A library opened once, on first use, by whichever thread asks first; later calls get the same
// entry points or the same error.
template <typename Api>
class LazyLibrary {
 public:
  LazyLibrary(const CudaLibraryOptions& options, const char* soname)
      : options_(options), soname_(soname) {}

  Result<const Api*> get() {
    std::call_once(once_, [this] {
      Result<OpenedLibrary> opened = open_library(options_, soname_);
      if (!opened.ok()) {
        status_ = opened.status();
        LOG(WARNING) << status_.message();
        return;
      }
      status_ = api_.resolve_all(*opened);
      if (!status_.ok()) {
        LOG(WARNING) << status_.message();
        dlclose(opened->handle);
        return;
      }
      LOG(INFO) << soname_ << " loaded from " << opened->path;
    });
    if (!status_.ok()) return status_;
    return &api_;
  }

 private:
  const CudaLibraryOptions options_;
  const char* const soname_;
  std::once_flag once_;
  Status status_;  // written once, under once_
  Api api_;
};

// ---- Real handles per (owner, client handle, GPU and context) ----

struct HandleKey {
  uint64_t owner = 0;
  uint64_t handle = 0;
  Context context;  // where the real handle was made, and must be used and destroyed
  friend auto operator<=>(const HandleKey&, const HandleKey&) = default;
};
// The key of `owner`'s `handle` for work on `stream`.
inline HandleKey handle_key(uint64_t owner, uint64_t handle, const Stream& stream) {
  return {owner, handle, Context{stream.context, stream.gpu}};
}

// Traits: Raw (the library's handle type), Settings (what was last applied to it), and
// create/destroy through the Api.
template <typename Api, typename Traits>
class HandleTable {
 public:
  struct Entry {
    Mutex mutex;  // one thread uses the real handle at a time
    typename Traits::Raw raw GUARDED_BY(mutex) = nullptr;
    typename Traits::Settings settings GUARDED_BY(mutex);
  };

  explicit HandleTable(const CudaContexts& contexts) : contexts_(contexts) {}
  ~HandleTable() {
    release_if([](const HandleKey&) { return true; });
  }

  // The entry for `key`, creating the real handle if there is none yet. The GPU's context must
  // be current on this thread (the caller made it so through use_stream).
  Result<std::shared_ptr<Entry>> get(const Api& api, const HandleKey& key) {
    {
      MutexLock lock(mutex_);
      if (auto it = entries_.find(key); it != entries_.end()) return it->second;
    }
    // Created outside the table's lock: creating a handle takes milliseconds (it allocates on
    // the GPU), and other sessions' calls must not wait for it.
    typename Traits::Raw raw = nullptr;
    HIBER_RETURN_IF_ERROR(Traits::create(api, &raw).with_context(
        str_cat("a handle on GPU ", key.context.gpu, " for session ", key.owner)));
    auto entry = std::make_shared<Entry>();
    {
      MutexLock entry_lock(entry->mutex);
      entry->raw = raw;
    }
    MutexLock lock(mutex_);
    auto [it, inserted] = entries_.emplace(key, entry);
    if (!inserted) {
      // Another thread of the same owner won (sessions are single-threaded, so this is rare):
      // keep theirs.
      Status destroyed = Traits::destroy(api, raw);
      LOG_IF(WARNING, !destroyed.ok()) << destroyed;
    }
    return it->second;
  }

  // Destroys the real handles whose key matches, each with its context current.
  template <typename Match>
  void release_if(Match&& match) {
    std::vector<std::pair<HandleKey, std::shared_ptr<Entry>>> gone;
    {
      MutexLock lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (match(it->first)) {
          gone.emplace_back(it->first, std::move(it->second));
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (gone.empty()) return;
    const Api* api = api_for_release_;
    for (auto& [key, entry] : gone) {
      MutexLock lock(entry->mutex);
      if (entry->raw == nullptr || api == nullptr) continue;
      Status status = contexts_.use_context(key.context);
      if (status.ok()) status = Traits::destroy(*api, entry->raw);
      LOG_IF(WARNING, !status.ok()) << "destroying the " << Traits::kName << " handle of session "
                                    << key.owner << " on GPU " << key.context.gpu << ": " << status;
      entry->raw = nullptr;
    }
  }

  // Drops the entries whose key matches without destroying their real handles: their context
  // was reset, and they went with it (on CUDA their values may name new objects now).
  template <typename Match>
  void forget_if(Match&& match) {
    MutexLock lock(mutex_);
    std::erase_if(entries_, [&](const auto& entry) { return match(entry.first); });
  }

  // Set once the library is loaded: release needs it, and nothing exists to release before.
  void set_api(const Api* api) { api_for_release_ = api; }

 private:
  const CudaContexts& contexts_;
  std::atomic<const Api*> api_for_release_{nullptr};
  Mutex mutex_;
  std::map<HandleKey, std::shared_ptr<Entry>> entries_ GUARDED_BY(mutex_);
};

// A failed cuBLAS or cuBLASLt status (a cublasStatus_t) as a Status, "call: NAME (text)" with
// the library's own name and text for it (nullptr where it has none), and the code the client
// turns back into the same cublasStatus_t (client_shim/cublas_status.h). Success for 0.
Status cublas_status(int status, std::string_view call, const char* name, const char* text);

}  // namespace hiber::device::cuda_lib
