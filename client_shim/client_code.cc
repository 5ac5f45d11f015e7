// Code: fatbins registered by the program's binaries, modules it loads itself, their kernels,
// and launches.
//
// Modules load lazily, at the first launch of one of their kernels, as CUDA's lazy loading
// does: a program registers every fatbin of every library at start-up but uses few. An image is
// shipped at most once per node: the client first asks hiberd for it by SHA-256, and sends the
// bytes only if hiberd has never seen them. Parameter layouts come from the client's own parse
// of the image, so resolving a kernel costs no round trip unless the parse cannot tell.
#include <openssl/evp.h>

#include <array>
#include <cstring>

#include <glog/logging.h>

#include "client_shim/client.h"

#include "common/device_attributes.h"
#include "common/fatbin.h"

namespace hiber::shim {
namespace {

// crt/host_runtime.h / fatbinary_section.h: what __cudaRegisterFatBinary receives.
struct FatbinWrapper {
  int magic;
  int version;
  const unsigned long long* data;
  void* filename_or_fatbins;
};
constexpr int kFatbinWrapperMagic = 0x466243b1;

struct FatbinHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_bytes;
  uint64_t body_bytes;
};

std::array<unsigned char, 32> sha256(std::span<const std::byte> bytes) {
  std::array<unsigned char, 32> digest{};
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace

uint64_t code_image_size(const void* image) {
  const auto* bytes = static_cast<const std::byte*>(image);
  FatbinHeader fatbin;
  std::memcpy(&fatbin, bytes, sizeof(fatbin));
  if (fatbin.magic == fatbin::kFatbinMagic)
    return uint64_t{fatbin.header_bytes} + fatbin.body_bytes;
  if (std::memcmp(bytes,
                  "\x7f"
                  "ELF",
                  4) == 0) {
    uint64_t section_headers;
    uint16_t entry_bytes, entries;
    std::memcpy(&section_headers, bytes + 0x28, 8);
    std::memcpy(&entry_bytes, bytes + 0x3a, 2);
    std::memcpy(&entries, bytes + 0x3c, 2);
    return section_headers + uint64_t{entry_bytes} * entries;
  }
  return uint64_t{std::strlen(static_cast<const char*>(image))} + 1;
}

Result<ModuleObj*> Client::register_fatbin(const void* fatbin_wrapper) {
  FatbinWrapper wrapper;
  std::memcpy(&wrapper, fatbin_wrapper, sizeof(wrapper));
  if (wrapper.magic != kFatbinWrapperMagic || wrapper.data == nullptr) {
    return error(ErrorCode::kInvalidImage,
                 "__cudaRegisterFatBinary: not a fatbin wrapper (magic 0x", std::hex, wrapper.magic,
                 ")");
  }
  // Version 2 wrappers come from relocatable device code (-rdc): nvcc's device-link stub
  // registers one, whose data is the device-linked fatbin (the code of every object it linked,
  // as the GPUs built for run it) and whose second field lists the objects' own fatbins (for the
  // runtime to link at run time when no linked code fits the GPU). The linked fatbin is loaded
  // like any other; a GPU it has no code for fails at load, naming the module.
  if (wrapper.version != 1 && wrapper.version != 2) {
    return error(ErrorCode::kNotSupported, "__cudaRegisterFatBinary: fatbin wrapper version ",
                 wrapper.version, " is not supported");
  }
  FatbinHeader header;
  std::memcpy(&header, wrapper.data, sizeof(header));
  if (header.magic != fatbin::kFatbinMagic) {
    return Status(ErrorCode::kInvalidImage, "__cudaRegisterFatBinary: data is not a fatbin");
  }
  auto module = std::make_unique<ModuleObj>();
  module->bytes = {reinterpret_cast<const std::byte*>(wrapper.data),
                   uint64_t{header.header_bytes} + header.body_bytes};
  std::lock_guard lock(mu_);
  ModuleObj* raw = module.get();
  modules_.emplace(raw, std::move(module));
  return raw;
}

void Client::register_function(ModuleObj* module, const void* host_function, const char* name) {
  std::lock_guard lock(mu_);
  auto kernel = std::make_unique<KernelObj>();
  kernel->module = module;
  kernel->name = name;
  KernelObj* raw = kernel.get();
  module->kernels.push_back(std::move(kernel));
  kernels_.emplace(raw, raw);
  host_functions_[host_function] = raw;
}

void Client::unregister_fatbin(ModuleObj* module) { (void)unload_module(module); }

Result<KernelObj*> Client::kernel_for_host_function(const void* host_function) {
  std::lock_guard lock(mu_);
  auto it = host_functions_.find(host_function);
  if (it == host_functions_.end()) {
    return error(ErrorCode::kNotFound, "no kernel is registered for host function ", host_function);
  }
  return it->second;
}

Result<KernelObj*> Client::kernel(const void* handle) {
  std::lock_guard lock(mu_);
  auto it = kernels_.find(handle);
  if (it == kernels_.end()) return error(ErrorCode::kInvalidHandle, "unknown kernel ", handle);
  return it->second;
}

Result<ModuleObj*> Client::load_module(std::span<const std::byte> image) {
  auto module = std::make_unique<ModuleObj>();
  module->image.assign(image.begin(), image.end());
  module->bytes = module->image;
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  ModuleObj* raw = module.get();
  modules_.emplace(raw, std::move(module));
  // cuModuleLoadData reports a bad image at once.
  Status loaded = load_module_locked(raw);
  if (!loaded.ok()) {
    modules_.erase(raw);
    return loaded;
  }
  return raw;
}

Result<ModuleObj*> Client::module(const void* handle) {
  std::lock_guard lock(mu_);
  auto it = modules_.find(handle);
  if (it == modules_.end()) return error(ErrorCode::kInvalidHandle, "unknown module ", handle);
  return it->second.get();
}

Status Client::unload_module(ModuleObj* module) {
  std::lock_guard lock(mu_);
  auto it = modules_.find(module);
  if (it == modules_.end()) return error(ErrorCode::kInvalidHandle, "unknown module ", module);
  for (const auto& kernel : module->kernels) kernels_.erase(kernel.get());
  std::erase_if(host_functions_, [module](const auto& f) { return f.second->module == module; });
  Status unloaded;
  if (!module->wire.is_zero() && calls_ && !forked_child_) {
    unloaded = enqueue_locked(wire::calls::ModuleUnload{.module = module->wire});
  }
  modules_.erase(it);
  return unloaded;
}

Result<KernelObj*> Client::module_function(ModuleObj* module, const std::string& name) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  for (const auto& kernel : module->kernels) {
    if (kernel->name == name) return kernel.get();
  }
  auto kernel = std::make_unique<KernelObj>();
  kernel->module = module;
  kernel->name = name;
  // cuModuleGetFunction reports an unknown name at once.
  HIBER_RETURN_IF_ERROR(resolve_kernel_locked(kernel.get()));
  KernelObj* raw = kernel.get();
  module->kernels.push_back(std::move(kernel));
  kernels_.emplace(raw, raw);
  return raw;
}

Status Client::load_module_locked(ModuleObj* module) {
  if (!module->wire.is_zero()) return Status();
  HIBER_RETURN_IF_ERROR(check_session_locked());
  return load_module_as_locked(module, new_handle_locked<wire::ModuleHandle>());
}

Status Client::load_module_as_locked(ModuleObj* module, wire::ModuleHandle handle) {
  const auto digest = sha256(module->bytes);
  auto cached = calls_->call(
      wire::calls::ModuleLoadCached{.module = handle, .sha256 = std::as_bytes(std::span(digest))},
      /*sticky=*/false);
  if (cached.ok()) {
    module->wire = handle;
    journal_.modules[handle] = module;
    return Status();
  }
  const ErrorCode why = cached.status().code();
  if (why != ErrorCode::kNotFound && why != ErrorCode::kNotSupported) {
    return lost_session_locked(cached.status(), /*answer_lost=*/true);
  }

  const uint64_t size = module->bytes.size();
  if (size > calls_->staging_capacity()) {
    return error(ErrorCode::kNotSupported, "a code image of ", size,
                 " bytes is larger than the channel's staging area (", calls_->staging_capacity(),
                 " bytes); start hiberd with a larger --arena_mib");
  }
  HIBER_ASSIGN_OR_RETURN(wire::CallClient::Staged staged, calls_->stage(size));
  std::memcpy(staged.bytes.data(), module->bytes.data(), size);
  auto loaded = calls_->call(wire::calls::ModuleLoad{.module = handle,
                                                     .image_offset = staged.offset,
                                                     .image_bytes = size,
                                                     .staging_end = staged.staging_end},
                             /*sticky=*/false);
  if (!loaded.ok()) return lost_session_locked(loaded.status(), /*answer_lost=*/true);
  module->wire = handle;
  journal_.modules[handle] = module;
  return Status();
}

Status Client::resolve_kernel_locked(KernelObj* kernel) {
  if (!kernel->wire.is_zero()) return Status();
  ModuleObj* module = kernel->module;
  HIBER_RETURN_IF_ERROR(load_module_locked(module));
  if (module->parsed.empty() && !module->parse_failed) {
    auto parsed = fatbin::image_kernels(module->bytes);
    if (parsed.ok()) {
      module->parsed = std::move(parsed).value();
    } else {
      module->parse_failed = true;
      LOG(WARNING) << "hibercuda: cannot read kernel layouts from a code image ("
                   << parsed.status().message() << "); asking hiberd for each kernel";
    }
  }
  const KernelInfo* known = nullptr;
  for (const KernelInfo& info : module->parsed) {
    if (info.name == kernel->name) known = &info;
  }
  const auto handle = new_handle_locked<wire::FunctionHandle>();
  const wire::calls::FunctionGet get{
      .function = handle, .module = module->wire, .name = kernel->name};
  if (known != nullptr) {
    // The layout is known: hiberd resolves the name in the background, and a failure
    // becomes the sticky error, reported with the launch's synchronisation.
    HIBER_RETURN_IF_ERROR(enqueue_locked(get));
    kernel->info = *known;
  } else {
    auto reply = calls_->call(get, /*sticky=*/false);
    if (!reply.ok()) return lost_session_locked(reply.status(), /*answer_lost=*/true);
    journal_.note(get);
    const KernelInfo* info = std::get_if<KernelInfo>(&*reply);
    if (info == nullptr) return Status(ErrorCode::kUnknown, "functionGet: reply without a layout");
    kernel->info = *info;
  }
  kernel->wire = handle;
  return Status();
}

Result<const KernelInfo*> Client::kernel_info(KernelObj* kernel) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(resolve_kernel_locked(kernel));
  return &kernel->info;
}

Status Client::prepare_launch_locked(KernelObj* kernel, uint32_t shared_bytes, void** args,
                                     std::vector<std::byte>* params) {
  HIBER_RETURN_IF_ERROR(resolve_kernel_locked(kernel));
  const KernelInfo& info = kernel->info;
  if (!info.params.empty() && args == nullptr) {
    return error(ErrorCode::kInvalidValue, "launch of ", kernel->name, ": ", info.params.size(),
                 " parameters but no arguments");
  }
  // Dynamic shared memory above the default per-block limit needs the kernel's
  // cudaFuncAttributeMaxDynamicSharedMemorySize raised first, as in CUDA (hiberd then raises the
  // real function's limit before launching).
  const int limit =
      kernel->max_dynamic_shared.value_or(attribute_locked(0, kAttrMaxSharedMemoryPerBlock));
  if (shared_bytes > static_cast<uint32_t>(std::max(limit, 0))) {
    return error(ErrorCode::kInvalidValue, "launch of ", kernel->name, " with ", shared_bytes,
                 " bytes of dynamic shared memory, above its limit of ", limit,
                 " (raise it with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)"
                 " or cuFuncSetAttribute, up to the device's opt-in limit)");
  }
  // Parameter i goes to its offset in the packed buffer.
  params->assign(info.param_bytes(), std::byte{0});
  for (size_t i = 0; i < info.params.size(); ++i) {
    std::memcpy(params->data() + info.params[i].offset, args[i], info.params[i].bytes);
  }
  return Status();
}

Status Client::launch(KernelObj* kernel, Dim3 grid, Dim3 block, uint32_t shared_bytes,
                      StreamObj* stream, void** args) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  HIBER_RETURN_IF_ERROR(prepare_launch_locked(kernel, shared_bytes, args, &launch_params_));
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  return enqueue_locked(wire::calls::LaunchKernel{.stream = stream_wire(stream),
                                                  .function = kernel->wire,
                                                  .grid_x = grid.x,
                                                  .grid_y = grid.y,
                                                  .grid_z = grid.z,
                                                  .block_x = block.x,
                                                  .block_y = block.y,
                                                  .block_z = block.z,
                                                  .shared_mem_bytes = shared_bytes,
                                                  .params = launch_params_});
}

// Occupancy from what the client knows: the device's limits on threads, blocks and shared memory
// per multiprocessor and the launch's dynamic shared memory. Registers and static shared memory
// are known only to the driver in hiberd, so for kernels limited by them this is an upper bound.
int Client::max_active_blocks(int device, int block_size, uint64_t dynamic_shared) {
  std::lock_guard lock(mu_);
  if (!ensure_open_locked().ok() || block_size <= 0) return 0;
  const int warp = std::max(1, attribute_locked(device, kAttrWarpSize));
  const int threads = (block_size + warp - 1) / warp * warp;
  int limit = attribute_locked(device, kAttrMaxThreadsPerMultiprocessor) / threads;
  limit = std::min(limit, attribute_locked(device, kAttrMaxBlocksPerMultiprocessor));
  if (dynamic_shared > 0) {
    const uint64_t per_sm = static_cast<uint64_t>(
        std::max(0, attribute_locked(device, kAttrMaxSharedMemoryPerMultiprocessor)));
    limit = std::min<int64_t>(limit, static_cast<int64_t>(per_sm / dynamic_shared));
  }
  return std::max(0, limit);
}

}  // namespace hiber::shim
