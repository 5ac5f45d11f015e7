// Code images (fatbins, cubins, PTX) loaded once per hiberd, shared by every session.
//
// Functions of one model load the same images: every PyTorch process ships the same few hundred
// MiB of fatbins. hiberd keys each loaded image by the SHA-256 of its bytes and hands every
// session that loads those bytes again, or names that hash (moduleLoadCached), a reference to the
// one device::Module already loaded, so an image is loaded, and held in device memory, once per
// node rather than once per session.
//
// Trust. The key of an image is always the hash hiberd computed itself over the very bytes it
// loaded (the session's private copy, never the client's arena, which the client can rewrite
// while we read). A client-supplied hash is only ever used to look an image up: a client that
// names a hash it does not have the bytes of gets what it could have sent itself, and can never
// place an image under a hash that is not its own. What a lookup does reveal is whether some
// session of this hiberd loaded exactly those bytes; its clients are trusted that far (they hold
// the node's token and an allowed uid).
//
// Lifetime. An entry lives while at least one reference (a session's module handle) uses it;
// the last release unloads the module. Functions are per module on both backends
// (Device::get_function returns the same Function for the same module and name, however many
// times it is asked), so the Functions sessions looked up stay valid while they hold their
// reference. A later keep-warm policy (keep an image for a while after its last user, for the
// next cold start of the same model, within a byte budget) would go in release().
//
// Budget. Loaded images cost hiberd memory beyond their bytes (the device keeps the image, its
// parsed kernels or the code the driver compiled from it), so the bytes of the distinct images
// loaded at once are bounded (--max_module_mib): a load that would pass the bound fails with
// kOutOfMemory and loads nothing; the last release of an image gives its bytes back. An image
// being loaded counts from the start of its load. (Each session's own share is bounded by the
// session: server/session.h.)
//
// Thread safety: every method may be called from any thread concurrently. Concurrent loads of
// the same image load it once: the first caller loads (outside the lock); the others wait for it.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/device.h"

namespace hiber::server {

// A SHA-256 digest.
using Sha256 = std::array<std::byte, 32>;

// The SHA-256 of `bytes` (OpenSSL libcrypto).
Sha256 sha256(std::span<const std::byte> bytes);
// Lower-case hex, 64 characters.
std::string to_hex(const Sha256& digest);

// A point-in-time view for status reports.
struct ModuleCacheStats {
  uint64_t entries = 0;         // images loaded
  uint64_t image_bytes = 0;     // the size of their images (and of those being loaded)
  uint64_t references = 0;      // session module handles using them
  uint64_t hits = 0;            // acquisitions served by an image already loaded
  uint64_t misses = 0;          // acquisitions that loaded an image
  uint64_t unknown_hashes = 0;  // acquire_by_hash of a hash no loaded image has
};

class ModuleCache {
 public:
  // One user's hold on a loaded image. Plain value; give it back with release() exactly once.
  struct Ref {
    device::Module module;
    Sha256 sha256{};
    uint64_t image_bytes = 0;  // what the session's budget counts for it
  };

  // `device` must outlive the cache. `max_bytes`: the most image bytes loaded at once (0: no
  // bound).
  ModuleCache(device::Device& device, uint64_t max_bytes);
  // Unloads whatever is still loaded (references not released: a caller bug, logged).
  // REQUIRES: no call in progress.
  ~ModuleCache();

  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

  // The image with these bytes: the one already loaded, or loaded now. Errors are
  // Device::load_module's (kInvalidImage, kNoBinaryForGpu, ...), or kOutOfMemory when loading
  // it would pass the budget; nothing is kept on an error.
  Result<Ref> acquire_by_image(std::span<const std::byte> image);
  // The image already loaded whose bytes hash to `digest`; kNotFound if there is none. Waits if
  // that image is being loaded right now.
  Result<Ref> acquire_by_hash(std::span<const std::byte, 32> digest);
  // Gives a reference back; the last one unloads the module (the unload's error, if any, is
  // returned; the entry is gone either way). kInvalidHandle for a reference this cache does not
  // hold (a caller bug).
  Status release(const Ref& ref);

  ModuleCacheStats stats() const;

 private:
  struct Entry;
  struct DigestHash {
    size_t operator()(const Sha256& digest) const;
  };
  enum class Lookup { kFound, kAbsent };

  // With mutex_ held through `lock`: waits out a load of `digest` in progress, then takes a
  // reference to the loaded entry if there is one.
  Lookup find_locked(MutexLock& lock, const Sha256& digest, Ref& ref) REQUIRES(mutex_);

  device::Device& device_;
  const uint64_t max_bytes_;
  mutable Mutex mutex_;
  std::condition_variable load_done_;  // a load in progress finished (or failed)
  // Loaded entries and loads in progress.
  std::unordered_map<Sha256, std::shared_ptr<Entry>, DigestHash> entries_ GUARDED_BY(mutex_);
  ModuleCacheStats stats_ GUARDED_BY(mutex_);
};

}  // namespace hiber::server
