#include "server/module_cache.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <glog/logging.h>

namespace hiber::server {

Sha256 sha256(std::span<const std::byte> bytes) {
  Sha256 digest;
  unsigned int length = 0;
  // EVP_Digest fails only if libcrypto cannot allocate a context: nothing sensible is left to do.
  CHECK_EQ(EVP_Digest(bytes.data(), bytes.size(), reinterpret_cast<unsigned char*>(digest.data()),
                      &length, EVP_sha256(), nullptr),
           1)
      << "EVP_Digest(SHA-256) failed";
  CHECK_EQ(length, digest.size());
  return digest;
}

std::string to_hex(const Sha256& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * digest.size());
  for (std::byte b : digest) {
    out.push_back(kDigits[std::to_integer<unsigned>(b) >> 4]);
    out.push_back(kDigits[std::to_integer<unsigned>(b) & 0xf]);
  }
  return out;
}

// An image loaded, or being loaded by one caller while others wait for it.
struct ModuleCache::Entry {
  bool loading = true;    // a caller is in Device::load_module for it
  device::Module module;  // once loaded
  uint64_t image_bytes = 0;
  uint64_t references = 0;  // Refs handed out and not released
};

size_t ModuleCache::DigestHash::operator()(const Sha256& digest) const {
  // The digest is uniformly distributed already; a client can choose the hashes it looks up,
  // but not the keys the cache holds (they are computed here), so its 64 bits do.
  size_t h;
  std::memcpy(&h, digest.data(), sizeof h);
  return h;
}

ModuleCache::ModuleCache(device::Device& device, uint64_t max_bytes)
    : device_(device), max_bytes_(max_bytes) {}

ModuleCache::~ModuleCache() {
  for (const auto& [digest, entry] : entries_) {
    LOG(ERROR) << "module cache: image " << to_hex(digest) << " still has " << entry->references
               << " references at exit; unloading it";
    if (!entry->loading) {
      Status unloaded = device_.unload_module(entry->module);
      if (!unloaded.ok()) LOG(ERROR) << "module cache: " << unloaded;
    }
  }
}

ModuleCache::Lookup ModuleCache::find_locked(MutexLock& lock, const Sha256& digest, Ref& ref) {
  while (true) {
    auto it = entries_.find(digest);
    if (it == entries_.end()) return Lookup::kAbsent;
    std::shared_ptr<Entry> entry = it->second;
    if (!entry->loading) {
      ++entry->references;
      ++stats_.references;
      ++stats_.hits;
      ref = Ref{entry->module, digest, entry->image_bytes};
      return Lookup::kFound;
    }
    // Another caller is loading these bytes: wait for it, then look again (it may have failed
    // and left the map, or been loaded and already released by its only user).
    lock.wait(load_done_, [&] { return !entry->loading; });
  }
}

Result<ModuleCache::Ref> ModuleCache::acquire_by_image(std::span<const std::byte> image) {
  // Hashing hundreds of MiB takes a while: outside the lock.
  const Sha256 digest = sha256(image);
  MutexLock lock(mutex_);
  Ref ref;
  if (find_locked(lock, digest, ref) == Lookup::kFound) return ref;

  // A miss: this caller loads, outside the lock; callers of the same image wait on the entry.
  // Its bytes count from now, so concurrent loads cannot together pass the budget.
  if (max_bytes_ != 0 && image.size() > max_bytes_ - std::min(max_bytes_, stats_.image_bytes)) {
    return error(ErrorCode::kOutOfMemory, "loading an image of ", image.size(),
                 " bytes would bring hiberd's loaded code images to ",
                 stats_.image_bytes + image.size(), " bytes, above the ", max_bytes_,
                 " that --max_module_mib allows; unload modules first");
  }
  auto entry = std::make_shared<Entry>();
  entry->image_bytes = image.size();
  entries_.emplace(digest, entry);
  stats_.image_bytes += image.size();
  lock.unlock();
  Result<device::Module> module = device_.load_module(image);
  lock.lock();
  entry->loading = false;
  if (!module.ok()) {
    entries_.erase(digest);
    stats_.image_bytes -= image.size();
    load_done_.notify_all();
    return module.status();
  }
  entry->module = *module;
  entry->references = 1;
  ++stats_.entries;
  ++stats_.references;
  ++stats_.misses;
  load_done_.notify_all();
  VLOG(1) << "module cache: loaded " << to_hex(digest) << " (" << image.size()
          << " bytes) as module " << module->id;
  return Ref{*module, digest, image.size()};
}

Result<ModuleCache::Ref> ModuleCache::acquire_by_hash(std::span<const std::byte, 32> digest) {
  Sha256 key;
  std::memcpy(key.data(), digest.data(), key.size());
  MutexLock lock(mutex_);
  Ref ref;
  if (find_locked(lock, key, ref) == Lookup::kFound) return ref;
  ++stats_.unknown_hashes;
  return error(ErrorCode::kNotFound, "hiberd holds no image with SHA-256 ", to_hex(key),
               "; load it with moduleLoad");
}

Status ModuleCache::release(const Ref& ref) {
  std::shared_ptr<Entry> entry;
  {
    MutexLock lock(mutex_);
    auto it = entries_.find(ref.sha256);
    if (it == entries_.end() || it->second->loading || it->second->module.id != ref.module.id ||
        it->second->references == 0) {
      return error(ErrorCode::kInvalidHandle, "module cache: no reference to module ",
                   ref.module.id, " (image ", to_hex(ref.sha256), ") is held");
    }
    entry = it->second;
    --stats_.references;
    if (--entry->references > 0) return Status();
    // The last user: the image goes. (A keep-warm policy would keep it here.) Unloaded outside
    // the lock; a session loading the same bytes meanwhile loads a module of its own.
    entries_.erase(it);
    --stats_.entries;
    stats_.image_bytes -= entry->image_bytes;
  }
  VLOG(1) << "module cache: unloading " << to_hex(ref.sha256) << " (module " << ref.module.id
          << ")";
  return device_.unload_module(entry->module);
}

ModuleCacheStats ModuleCache::stats() const {
  MutexLock lock(mutex_);
  return stats_;
}

}  // namespace hiber::server
