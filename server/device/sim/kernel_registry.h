// Host implementations of kernels, by mangled name (server/device/sim_kernel_plugin.h).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/sim_kernel_plugin.h"

namespace hiber::device::sim {

// Thread-safe. Plugins stay loaded until the registry is destroyed.
class KernelRegistry {
 public:
  KernelRegistry() = default;
  ~KernelRegistry();
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // Loads a plugin and registers all of its kernels, or none: a name that is already registered
  // (or listed twice) fails the whole plugin with kInvalidValue naming both sources.
  Status load_plugin(const std::string& path);
  Status add(const std::string& name, HiberSimKernelFn run, const std::string& source);
  // nullptr if no implementation is registered.
  HiberSimKernelFn find(const std::string& name) const;

 private:
  struct Entry {
    HiberSimKernelFn run;
    std::string source;  // plugin path, or "register_kernel()"
  };

  mutable Mutex mu_;
  std::unordered_map<std::string, Entry> kernels_ GUARDED_BY(mu_);
  std::vector<void*> plugins_ GUARDED_BY(mu_);  // dlopen handles
};

}  // namespace hiber::device::sim
