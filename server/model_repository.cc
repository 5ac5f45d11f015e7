#include "server/model_repository.h"

#include "server/host_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <glog/logging.h>

namespace hiber::server {
namespace {

// HostCopy::where.where.chunk of a copy in a mapping of its own (not a pool chunk).
constexpr uint32_t kOwnMapping = UINT32_MAX;

}  // namespace

Result<std::unique_ptr<ModelRepository>> ModelRepository::create(
    device::Device& device, const ModelRepositoryOptions& options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes % memory::HostPool::kMinBlockBytes != 0 ||
      options.max_bytes < options.chunk_bytes) {
    return error(ErrorCode::kInvalidValue, "model repository: chunks of ", options.chunk_bytes,
                 " bytes up to ", options.max_bytes, " (chunks must be multiples of ",
                 memory::HostPool::kMinBlockBytes, " and fit the maximum)");
  }
  std::unique_ptr<ModelRepository> repository(new ModelRepository(device, options));
  MutexLock lock(repository->mutex_);
  HIBER_RETURN_IF_ERROR(repository->grow());
  return repository;
}

ModelRepository::~ModelRepository() {
  MutexLock lock(mutex_);
  // The files stay: sessions kept by the state directory's records are served from them after a
  // restart, and the next hiberd removes those no record names.
  keep_files_ = true;
  for (const Chunk& chunk : chunks_) unmap_chunk(chunk);
  for (const Chunk& chunk : own_) unmap_chunk(chunk);
}

uint64_t ModelRepository::mapped_bytes() const {
  uint64_t bytes = 0;
  for (const Chunk& chunk : chunks_) bytes += chunk.bytes;
  for (const Chunk& chunk : own_) bytes += chunk.bytes;
  return bytes;
}

Result<ModelRepository::Chunk> ModelRepository::map_chunk(uint64_t bytes,
                                                          const std::string& name) {
  const uint64_t have = mapped_bytes();
  if (bytes > options_.max_bytes || have > options_.max_bytes - bytes) {
    return error(ErrorCode::kOutOfMemory, "the model repository holds ", have,
                 " bytes; another ", bytes, " would pass its limit of ", options_.max_bytes,
                 " (--host_pool_max_mib)");
  }
  Chunk chunk;
  chunk.bytes = bytes;
  void* data = MAP_FAILED;
  if (options_.directory.empty()) {
    // Reserved, not committed: pages cost host memory once a copy is written to them.
    data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  } else {
    // A sparse file: as above, its pages cost memory (on a tmpfs) once written.
    chunk.path = options_.directory + "/" + name;
    const int fd = ::open(chunk.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      return error(ErrorCode::kOutOfMemory, "model repository: creating ", chunk.path, ": ",
                   std::strerror(errno));
    }
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    }
    const int saved = errno;
    ::close(fd);
    errno = saved;
    if (data == MAP_FAILED) ::unlink(chunk.path.c_str());
  }
  if (data == MAP_FAILED) {
    return error(ErrorCode::kOutOfMemory, "model repository: mapping ", bytes,
                 " bytes of host memory", chunk.path.empty() ? "" : " in ", chunk.path, ": ",
                 std::strerror(errno));
  }
  chunk.data = static_cast<std::byte*>(data);
  if (options_.pinned) {
    Status registered = device_.register_host_memory(chunk.data, chunk.bytes);
    if (!registered.ok()) {
      unmap_chunk(chunk);
      return registered.with_context("model repository: pinning a chunk");
    }
    chunk.registered = true;
  }
  return chunk;
}

void ModelRepository::unmap_chunk(const Chunk& chunk) {
  if (chunk.registered) {
    Status s = device_.unregister_host_memory(chunk.data);
    LOG_IF(ERROR, !s.ok()) << "model repository: unregistering a chunk: " << s;
  }
  ::munmap(chunk.data, chunk.bytes);
  if (!chunk.path.empty() && !keep_files_ && ::unlink(chunk.path.c_str()) != 0) {
    PLOG(ERROR) << "model repository: removing " << chunk.path;
  }
}

Status ModelRepository::grow() {
  HIBER_ASSIGN_OR_RETURN(Chunk chunk,
                         map_chunk(options_.chunk_bytes,
                                   str_cat(options_.file_prefix, "-c", chunks_.size())));
  // The pool is made with its first chunk: its largest block is a chunk.
  Status added;
  if (!pool_) {
    auto pool = memory::HostPool::create({chunk.bytes}, device_.gpu_count());
    added = pool.status();
    if (pool.ok()) pool_ = std::move(pool).value();
  } else {
    added = pool_->add_chunk(chunk.bytes).status();
  }
  if (!added.ok()) {
    unmap_chunk(chunk);
    return added;
  }
  chunks_.push_back(chunk);
  return Status();
}

HostCopy ModelRepository::copy_at(const memory::Allocation& where, uint64_t bytes) const {
  return HostCopy{where, chunks_[where.where.chunk].data + where.where.offset, bytes};
}

Result<HostCopy> ModelRepository::allocate(memory::FunctionId function, uint64_t bytes) {
  MutexLock lock(mutex_);
  if (bytes > options_.chunk_bytes) {
    // Larger than the pool's largest block: a mapping of its own, exactly its size.
    const uint64_t unit = memory::HostPool::kMinBlockBytes;
    HIBER_ASSIGN_OR_RETURN(Chunk chunk, map_chunk((bytes + unit - 1) / unit * unit,
                                                  str_cat(options_.file_prefix, "-o", own_files_)));
    ++own_files_;
    own_.push_back(chunk);
    return HostCopy{memory::Allocation{{kOwnMapping, 0}, chunk.bytes}, chunk.data, bytes};
  }
  while (true) {
    memory::AllocationResult placed = pool_->allocate_model_copy(function, bytes);
    if (placed.ok()) return copy_at(*placed, bytes);
    HIBER_RETURN_IF_ERROR(grow());
  }
}

Result<HostCopy> ModelRepository::allocate_staging(int gpu, uint64_t bytes) {
  MutexLock lock(mutex_);
  while (true) {
    memory::AllocationResult placed = pool_->allocate_staging(gpu, bytes);
    if (placed.ok()) return copy_at(*placed, bytes);
    if (placed.shortfall().never_fits) {
      return error(ErrorCode::kInvalidValue, "staging of ", bytes, " bytes for GPU ", gpu,
                   " cannot be placed: ", placed.shortfall().describe());
    }
    HIBER_RETURN_IF_ERROR(grow());
  }
}

void ModelRepository::release(const HostCopy& copy) {
  if (!copy) return;
  MutexLock lock(mutex_);
  if (copy.where.where.chunk == kOwnMapping) {
    auto own = std::find_if(own_.begin(), own_.end(),
                            [&](const Chunk& chunk) { return chunk.data == copy.data; });
    if (own != own_.end()) {
      unmap_chunk(*own);
      own_.erase(own);
    }
    return;
  }
  give_back(chunks_[copy.where.where.chunk], copy.where.where.offset, copy.where.bytes);
  Status released = pool_->release(copy.where);
  LOG_IF(ERROR, !released.ok()) << "model repository: " << released;
}

void ModelRepository::give_back(const Chunk& chunk, uint64_t offset, uint64_t bytes) {
  if (keep_files_ || (chunk.registered && device_.registration_pins_pages())) return;
  const uint64_t end = std::min(offset + bytes, chunk.bytes);
  const PageSpan pages = whole_pages(offset, end > offset ? end - offset : 0);
  if (pages.empty()) return;
  // In a file the pages are the file's: only a hole punched in it frees them.
  const int advice = chunk.path.empty() ? MADV_DONTNEED : MADV_REMOVE;
  if (::madvise(chunk.data + pages.begin, pages.bytes(), advice) != 0 && !give_back_failed_) {
    give_back_failed_ = true;
    PLOG(WARNING) << "model repository: released host copies keep their memory ("
                  << (chunk.path.empty() ? "madvise(MADV_DONTNEED)" : "punching " + chunk.path)
                  << " failed)";
  }
}

void ModelRepository::keep_files() {
  MutexLock lock(mutex_);
  keep_files_ = true;
}

std::optional<HostCopyFile> ModelRepository::file_of(const HostCopy& copy) const {
  MutexLock lock(mutex_);
  if (options_.directory.empty() || !copy) return std::nullopt;
  if (copy.where.where.chunk == kOwnMapping) {
    for (const Chunk& chunk : own_) {
      if (chunk.data == copy.data) return HostCopyFile{chunk.path, 0};
    }
    return std::nullopt;
  }
  const Chunk& chunk = chunks_[copy.where.where.chunk];
  return HostCopyFile{chunk.path, static_cast<uint64_t>(copy.data - chunk.data)};
}

memory::HostPoolStats ModelRepository::stats() const {
  MutexLock lock(mutex_);
  memory::HostPoolStats stats = pool_->stats();
  for (const Chunk& chunk : own_) {
    stats.capacity_bytes += chunk.bytes;
    stats.model_bytes += chunk.bytes;
  }
  return stats;
}

}  // namespace hiber::server
