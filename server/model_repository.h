// The model repository: where functions' models sleep in host memory (Torpor §4.1, §4.3).
//
// Every block a function swaps has a host copy here; for a model block the host copy is
// authoritative, so evicting the GPU copy copies nothing back (docs/design.md, "Model state"). The
// memory is allocated and registered with the device (pinned) once, in large chunks, and
// sub-allocated by memory::HostPool: nothing is pinned per request, because registering is slow
// and serialises the driver. The pool grows by whole chunks up to a limit. A copy larger than a
// chunk (a block of a large allocation: a KV cache) gets a mapping of its own, registered once,
// and counted against the same limit.
//
// For the swap ablation (the paper's Fig. 7) the repository can keep its copies in pageable
// memory instead: the same chunks, never registered, so the device copies them as it would a
// malloc'd buffer.
//
// With a directory (hiberd's --state_dir), every chunk and own mapping is a file there, mapped
// shared, so the copies outlive hiberd: a restarted hiberd reads them back to resume sessions
// (server/session_store.h). Files are named "<prefix>-c<n>" and "<prefix>-o<n>"; the prefix
// (hiberd's incarnation) keeps a new hiberd's files apart from those it is still reading.
//
// A released copy's pages go back to the host at once (a model of a function that scaled to
// zero must not stay in hiberd's memory), except where the device pins them (CUDA: the pinned
// chunks are resident for good, and bounded by the limit) and while hiberd stops.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "memory/host_pool.h"
#include "server/device/device.h"

namespace hiber::server {

struct ModelRepositoryOptions {
  uint64_t chunk_bytes = 1ull << 30;  // registered at a time
  uint64_t max_bytes = 64ull << 30;   // the most the pool grows to
  bool pinned = true;                 // register the chunks with the device
  std::string directory;              // "": anonymous memory, gone with the process
  std::string file_prefix = "r";      // the files' names in `directory`
};

// Where a host copy's bytes lie in the repository's files.
struct HostCopyFile {
  std::string path;
  uint64_t offset = 0;
};

// One block's host copy.
struct HostCopy {
  memory::Allocation where;
  std::byte* data = nullptr;
  uint64_t bytes = 0;  // usable bytes at data (the request; the allocation may be larger)
  explicit operator bool() const { return data != nullptr; }
};

class ModelRepository {
 public:
  // Maps and registers the first chunk. `gpu_count` is for the staging accounts.
  static Result<std::unique_ptr<ModelRepository>> create(device::Device& device,
                                                         const ModelRepositoryOptions& options);
  // Unregisters and unmaps every chunk. REQUIRES: no copy is in flight.
  ~ModelRepository();

  // Room for `bytes` of function `function`'s blocks; grows by a chunk when full, and maps a
  // copy larger than a chunk on its own. kOutOfMemory once max_bytes is reached.
  Result<HostCopy> allocate(memory::FunctionId function, uint64_t bytes);
  // Staging for transfers to or from `gpu` (the elbow measurement uses it).
  Result<HostCopy> allocate_staging(int gpu, uint64_t bytes);
  void release(const HostCopy& copy);
  // From now on no file is removed, not even a released copy's (hiberd is stopping: the next
  // hiberd resumes its sessions from the files).
  void keep_files();
  // The file and offset of `copy`; nullopt without a directory.
  std::optional<HostCopyFile> file_of(const HostCopy& copy) const;

  bool pinned() const { return options_.pinned; }
  memory::HostPoolStats stats() const;

 private:
  struct Chunk {
    std::byte* data = nullptr;
    uint64_t bytes = 0;
    bool registered = false;
    std::string path;  // its file, with a directory
  };
  ModelRepository(device::Device& device, const ModelRepositoryOptions& options)
      : device_(device), options_(options) {}
  Status grow() REQUIRES(mutex_);
  // Maps (and registers) `bytes`; kOutOfMemory past max_bytes.
  // `name`: its file's name, with a directory.
  Result<Chunk> map_chunk(uint64_t bytes, const std::string& name) REQUIRES(mutex_);
  void unmap_chunk(const Chunk& chunk) REQUIRES(mutex_);
  // [offset, offset + bytes) of `chunk` holds nothing anyone needs: its pages go back to the
  // host (punched out of the file with a directory), unless hiberd is keeping its files or the
  // device pins them.
  void give_back(const Chunk& chunk, uint64_t offset, uint64_t bytes) REQUIRES(mutex_);
  uint64_t mapped_bytes() const REQUIRES(mutex_);
  HostCopy copy_at(const memory::Allocation& where, uint64_t bytes) const REQUIRES(mutex_);

  device::Device& device_;
  const ModelRepositoryOptions options_;
  mutable Mutex mutex_;
  std::unique_ptr<memory::HostPool> pool_ GUARDED_BY(mutex_);
  std::vector<Chunk> chunks_ GUARDED_BY(mutex_);  // index = pool chunk
  std::vector<Chunk> own_ GUARDED_BY(mutex_);     // copies larger than a chunk, one each
  bool keep_files_ GUARDED_BY(mutex_) = false;
  uint64_t own_files_ GUARDED_BY(mutex_) = 0;     // own mappings ever made (their names)
  bool give_back_failed_ GUARDED_BY(mutex_) = false;  // logged once
};

}  // namespace hiber::server
