#include "server/device/sim/kernel_registry.h"

#include <dlfcn.h>
#include <glog/logging.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace hiber::device::sim {

KernelRegistry::~KernelRegistry() {
  for (void* handle : plugins_) dlclose(handle);
}

Status KernelRegistry::load_plugin(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return error(ErrorCode::kFileNotFound, "kernel plugin ", path, ": ", std::strerror(errno));
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr)
    return error(ErrorCode::kInvalidImage, "kernel plugin ", path, ": dlopen failed: ", dlerror());
  auto close_on_error = [&](Status status) {
    dlclose(handle);
    return status;
  };
  auto get = reinterpret_cast<HiberSimKernelsV1Fn>(dlsym(handle, HIBER_SIM_KERNELS_V1_SYMBOL));
  if (get == nullptr)
    return close_on_error(error(ErrorCode::kNotFound, "kernel plugin ", path, " does not export ",
                                HIBER_SIM_KERNELS_V1_SYMBOL));
  size_t count = 0;
  const HiberSimKernel* table = get(&count);
  if (table == nullptr && count != 0)
    return close_on_error(error(ErrorCode::kInvalidValue, "kernel plugin ", path, ": ",
                                HIBER_SIM_KERNELS_V1_SYMBOL, " returned no table for ", count,
                                " kernels"));

  MutexLock lock(mu_);
  std::set<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    const HiberSimKernel& k = table[i];
    if (k.mangled_name == nullptr || k.mangled_name[0] == '\0' || k.run == nullptr)
      return close_on_error(error(ErrorCode::kInvalidValue, "kernel plugin ", path, ": entry ", i,
                                  " has no name or no function"));
    if (!names.insert(k.mangled_name).second)
      return close_on_error(error(ErrorCode::kInvalidValue, "kernel plugin ", path, " lists ",
                                  k.mangled_name, " twice"));
    auto existing = kernels_.find(k.mangled_name);
    if (existing != kernels_.end())
      return close_on_error(error(ErrorCode::kInvalidValue, "kernel ", k.mangled_name,
                                  " of plugin ", path, " is already registered by ",
                                  existing->second.source, "; keeping that one"));
  }
  for (size_t i = 0; i < count; ++i)
    kernels_.emplace(table[i].mangled_name, Entry{table[i].run, path});
  plugins_.push_back(handle);
  VLOG(1) << "kernel plugin " << path << ": " << count << " kernels";
  return Status();
}

Status KernelRegistry::add(const std::string& name, HiberSimKernelFn run,
                           const std::string& source) {
  if (name.empty() || run == nullptr)
    return error(ErrorCode::kInvalidValue, "register_kernel: empty name or null function");
  MutexLock lock(mu_);
  auto [it, inserted] = kernels_.try_emplace(name, Entry{run, source});
  if (!inserted)
    return error(ErrorCode::kInvalidValue, "kernel ", name, " from ", source,
                 " is already registered by ", it->second.source, "; keeping that one");
  return Status();
}

HiberSimKernelFn KernelRegistry::find(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : it->second.run;
}

}  // namespace hiber::device::sim
