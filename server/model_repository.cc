#include "server/model_repository.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include <glog/logging.h>

namespace hiber::server {

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
  for (const Chunk& chunk : chunks_) {
    if (chunk.registered) {
      Status s = device_.unregister_host_memory(chunk.data);
      LOG_IF(ERROR, !s.ok()) << "model repository: unregistering a chunk: " << s;
    }
    ::munmap(chunk.data, chunk.bytes);
  }
}

Status ModelRepository::grow() {
  const uint64_t have = chunks_.size() * options_.chunk_bytes;
  if (have + options_.chunk_bytes > options_.max_bytes) {
    return error(ErrorCode::kOutOfMemory, "the model repository holds ", have,
                 " bytes, its limit (--host_pool_max_mib)");
  }
  // Reserved, not committed: pages cost host memory once a copy is written to them.
  void* data = ::mmap(nullptr, options_.chunk_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) {
    return error(ErrorCode::kOutOfMemory, "model repository: mapping ", options_.chunk_bytes,
                 " bytes of host memory: ", std::strerror(errno));
  }
  Chunk chunk{static_cast<std::byte*>(data), options_.chunk_bytes, false};
  if (options_.pinned) {
    Status registered = device_.register_host_memory(chunk.data, chunk.bytes);
    if (!registered.ok()) {
      ::munmap(data, chunk.bytes);
      return registered.with_context("model repository: pinning a chunk");
    }
    chunk.registered = true;
  }
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
    if (chunk.registered) (void)device_.unregister_host_memory(chunk.data);
    ::munmap(data, chunk.bytes);
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
  while (true) {
    memory::AllocationResult placed = pool_->allocate_model_copy(function, bytes);
    if (placed.ok()) return copy_at(*placed, bytes);
    if (placed.shortfall().never_fits && bytes > options_.chunk_bytes) {
      return error(ErrorCode::kOutOfMemory, "a host copy of ", bytes,
                   " bytes is larger than a repository chunk (--host_pool_chunk_mib)");
    }
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
  Status released = pool_->release(copy.where);
  LOG_IF(ERROR, !released.ok()) << "model repository: " << released;
}

memory::HostPoolStats ModelRepository::stats() const {
  MutexLock lock(mutex_);
  return pool_->stats();
}

}  // namespace hiber::server
