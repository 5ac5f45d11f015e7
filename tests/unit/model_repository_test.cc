// The model repository gives a released host copy's pages back (a copy of a function that
// scaled to zero must not stay in hiberd's memory), except while hiberd stops and keeps its
// files for the next one. What is resident is read from the kernel (the file's allocated blocks;
// mincore for anonymous memory), not from the repository.
#include "server/model_repository.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "tests/unit/sim_device_for_test.h"
#include "tests/unit/temp_dir.h"

namespace hiber::server {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Bytes of `path` backed by storage (a sparse file's holes are not).
uint64_t allocated_bytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Pages of [data, data + bytes) resident in memory.
uint64_t resident_bytes(const std::byte* data, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> pages((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(const_cast<std::byte*>(data), bytes, pages.data()), 0);
  uint64_t resident = 0;
  for (unsigned char p : pages) resident += (p & 1) != 0 ? page : 0;
  return resident;
}

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = testing::sim_device_for_test(64 * kMiB);
    ASSERT_NE(device_, nullptr);
  }

  std::unique_ptr<ModelRepository> make(const std::string& directory) {
    ModelRepositoryOptions options;
    options.chunk_bytes = 64 * kMiB;
    options.max_bytes = 256 * kMiB;
    options.directory = directory;
    auto repository = ModelRepository::create(*device_, options);
    EXPECT_TRUE(repository.ok()) << repository.status();
    return repository.ok() ? std::move(*repository) : nullptr;
  }

  static HostCopy written_copy(ModelRepository& repository, uint64_t bytes, uint8_t value) {
    auto copy = repository.allocate(FunctionId{1}, bytes);
    EXPECT_TRUE(copy.ok()) << copy.status();
    if (!copy.ok()) return HostCopy{};
    std::memset(copy->data, value, bytes);
    return *copy;
  }

  std::unique_ptr<device::SimDevice> device_;
  testing::TempDir dir_;
};

TEST_F(ModelRepositoryTest, AReleasedCopyGivesItsPagesInTheFileBack) {
  std::unique_ptr<ModelRepository> repository = make(dir_.path());
  ASSERT_NE(repository, nullptr);
  const HostCopy kept = written_copy(*repository, 3 * kMiB, 0x11);
  const HostCopy released = written_copy(*repository, 8 * kMiB, 0x22);
  ASSERT_TRUE(kept && released);
  const std::optional<HostCopyFile> file = repository->file_of(released);
  ASSERT_TRUE(file.has_value());
  const uint64_t before = allocated_bytes(file->path);
  EXPECT_GE(before, 11 * kMiB);

  repository->release(released);
  const uint64_t after = allocated_bytes(file->path);
  EXPECT_LE(after + 8 * kMiB, before + 64 * 1024) << "the released copy's pages stay in the file";
  // The copy still held is untouched.
  for (uint64_t i = 0; i < kept.bytes; i += 4096) ASSERT_EQ(kept.data[i], std::byte{0x11});
  // Its room serves a new copy, which reads what it writes.
  const HostCopy again = written_copy(*repository, 8 * kMiB, 0x33);
  ASSERT_TRUE(again);
  for (uint64_t i = 0; i < again.bytes; i += 4096) ASSERT_EQ(again.data[i], std::byte{0x33});
  repository->release(again);
  repository->release(kept);
}

TEST_F(ModelRepositoryTest, AReleasedCopyLargerThanAChunkLosesItsFile) {
  std::unique_ptr<ModelRepository> repository = make(dir_.path());
  ASSERT_NE(repository, nullptr);
  const HostCopy big = written_copy(*repository, 100 * kMiB, 0x44);
  ASSERT_TRUE(big);
  const std::optional<HostCopyFile> file = repository->file_of(big);
  ASSERT_TRUE(file.has_value());
  EXPECT_TRUE(std::filesystem::exists(file->path));
  repository->release(big);
  EXPECT_FALSE(std::filesystem::exists(file->path));
}

TEST_F(ModelRepositoryTest, WhileHiberdStopsReleasedCopiesKeepTheirBytes) {
  std::unique_ptr<ModelRepository> repository = make(dir_.path());
  ASSERT_NE(repository, nullptr);
  const HostCopy copy = written_copy(*repository, 4 * kMiB, 0x55);
  ASSERT_TRUE(copy);
  const std::optional<HostCopyFile> file = repository->file_of(copy);
  ASSERT_TRUE(file.has_value());
  repository->keep_files();
  repository->release(copy);
  repository.reset();
  // The next hiberd reads the file, not the mapping.
  std::ifstream in(file->path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(file->offset));
  std::vector<char> bytes(4 * kMiB);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(in.good());
  for (char b : bytes) ASSERT_EQ(b, '\x55');
}

TEST_F(ModelRepositoryTest, WithoutADirectoryAReleasedCopyGivesItsMemoryBack) {
  std::unique_ptr<ModelRepository> repository = make("");
  ASSERT_NE(repository, nullptr);
  const HostCopy copy = written_copy(*repository, 8 * kMiB, 0x66);
  ASSERT_TRUE(copy);
  EXPECT_EQ(resident_bytes(copy.data, copy.bytes), copy.bytes);
  repository->release(copy);
  EXPECT_EQ(resident_bytes(copy.data, copy.bytes), 0u);
}

}  // namespace
}  // namespace hiber::server
