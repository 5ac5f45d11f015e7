// What a restarted hiberd hands back, and to whom: a session kept by one store is recovered by
// the next (a new process's view: a new device, the files read back), verified byte for byte
// against the digest the test computes, and claimed only with its token, by its own function
// and instance, once. A kept model whose bytes changed is dropped, never handed out.
#include "server/session_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "server/model_repository.h"
#include "tests/unit/sim_device_for_test.h"
#include "tests/unit/temp_dir.h"

namespace hiber::server {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kRange = 64 * kMiB;
constexpr uint64_t kModel = 2 * kMiB;

std::unique_ptr<device::SimDevice> make_device() { return testing::sim_device_for_test(256 * kMiB); }

// Bytes of `path` backed by storage (a sparse file's holes are not).
uint64_t allocated_bytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

class SessionStoreTest : public ::testing::Test {
 protected:
  struct Kept {
    std::string token;
    std::string function;
    uint64_t va = 0;        // the session's range, kRange bytes
    HostCopyFile file;      // where its model's host copy lies
  };

  // One hiberd's life: `count` sessions, of functions "f0", "f1", ..., each of instance "i" with
  // a model of one block holding model_bytes(index), saved, and hiberd stopped keeping its files.
  std::vector<Kept> keep_sessions(int count) {
    std::vector<Kept> kept;
    auto device = make_device();
    auto store = SessionStore::open(*device, {state_dir(), std::chrono::minutes(10)});
    EXPECT_TRUE(store.ok()) << store.status();
    ModelRepositoryOptions options;
    options.chunk_bytes = 64 * kMiB;
    options.max_bytes = 64 * kMiB;
    options.directory = (*store)->repository_directory();
    options.file_prefix = (*store)->file_prefix();
    auto repository = ModelRepository::create(*device, options);
    EXPECT_TRUE(repository.ok()) << repository.status();
    for (int i = 0; i < count; ++i) {
      auto copy = (*repository)->allocate(FunctionId{1}, kModel);
      EXPECT_TRUE(copy.ok()) << copy.status();
      const std::vector<std::byte> bytes = model_bytes(i);
      std::memcpy(copy->data, bytes.data(), bytes.size());
      auto va = device->reserve_address_range(kRange, 2 * kMiB);
      EXPECT_TRUE(va.ok()) << va.status();
      auto token = SessionStore::new_token();
      EXPECT_TRUE(token.ok());
      std::optional<HostCopyFile> file = (*repository)->file_of(*copy);
      EXPECT_TRUE(file.has_value());
      Kept k{*token, "f" + std::to_string(i), *va, *file};
      const StoredSession who{k.function, "i", k.va, kRange, 32 * kMiB, false};
      const Status saved = (*store)->save(
          k.token, who, {FunctionMemory::KeptBlock{k.va + 4 * kMiB, kModel, k.file, sha256(bytes)}});
      EXPECT_TRUE(saved.ok()) << saved;
      kept.push_back(k);
    }
    for (const Kept& k : kept) EXPECT_TRUE(device->free_address_range(k.va, kRange).ok());
    (*repository)->keep_files();
    return kept;
  }

  static std::vector<std::byte> model_bytes(int index) {
    std::vector<std::byte> bytes(kModel);
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<std::byte>((i * 31 + 7 + static_cast<size_t>(index) * 101) & 0xff);
    return bytes;
  }

  std::string state_dir() const { return dir_.path() + "/state"; }
  size_t files_in(const std::string& sub) const {
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(state_dir() + "/" + sub)) {
      (void)entry;
      ++n;
    }
    return n;
  }

  testing::TempDir dir_;
};

TEST_F(SessionStoreTest, AKeptSessionIsHandedOnlyToItsOwnFunctionAndInstanceOnce) {
  const std::vector<Kept> kept = keep_sessions(1);
  ASSERT_FALSE(HasFailure());
  const Kept& k = kept[0];
  auto device = make_device();
  auto store = SessionStore::open(*device, {state_dir(), std::chrono::minutes(10)});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->recovered(), 1u);

  // Another function's session, another instance's, and a token nobody was given: refused,
  // and the session stays for its own client.
  auto foreign = (*store)->claim(k.token, "g", "i");
  EXPECT_EQ(foreign.status().code(), ErrorCode::kNotPermitted) << foreign.status();
  auto other_instance = (*store)->claim(k.token, k.function, "j");
  EXPECT_EQ(other_instance.status().code(), ErrorCode::kNotPermitted) << other_instance.status();
  std::string guessed = k.token;
  guessed[0] = guessed[0] == '0' ? '1' : '0';
  EXPECT_EQ((*store)->claim(guessed, k.function, "i").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ((*store)->recovered(), 1u);

  // Its range is held: a new session cannot be given it.
  EXPECT_FALSE(device->reserve_address_range_at(k.va, kRange).ok());

  auto claimed = (*store)->claim(k.token, k.function, "i");
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ((*claimed)->who.va_base, k.va);
  EXPECT_EQ((*claimed)->who.va_bytes, kRange);
  ASSERT_EQ((*claimed)->blocks.size(), 1u);
  EXPECT_EQ((*claimed)->blocks[0].va, k.va + 4 * kMiB);
  const std::vector<std::byte> want = model_bytes(0);
  ASSERT_EQ((*claimed)->blocks[0].contents.size(), want.size());
  EXPECT_EQ(std::memcmp((*claimed)->blocks[0].contents.data(), want.data(), want.size()), 0);
  EXPECT_EQ((*store)->claim(k.token, k.function, "i").status().code(), ErrorCode::kNotFound)
      << "a session is handed out once";

  // The claimant owns the range; finishing the claim removes the record and the old files.
  EXPECT_TRUE(device->free_address_range(k.va, kRange).ok());
  (*store)->finish_claim(k.token);
  EXPECT_EQ((*store)->recovered(), 0u);
  EXPECT_EQ(files_in("sessions"), 0u);
  EXPECT_EQ(files_in("repository"), 0u);
}

// Two sessions' models in one old file: the first one resumed gives its bytes' memory back at
// once, and the other's bytes, still needed, stay exactly as kept.
TEST_F(SessionStoreTest, AResumedSessionsOldBytesGoWhileAnotherStillNeedsTheFile) {
  const std::vector<Kept> kept = keep_sessions(2);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(kept[0].file.path, kept[1].file.path);
  auto device = make_device();
  auto store = SessionStore::open(*device, {state_dir(), std::chrono::minutes(10)});
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->recovered(), 2u);
  const uint64_t before = allocated_bytes(kept[0].file.path);

  auto first = (*store)->claim(kept[0].token, kept[0].function, "i");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(device->free_address_range(kept[0].va, kRange).ok());
  (*store)->finish_claim(kept[0].token);
  EXPECT_LE(allocated_bytes(kept[0].file.path) + kModel, before + 8192)
      << "the resumed session's old bytes still take memory";

  auto second = (*store)->claim(kept[1].token, kept[1].function, "i");
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<std::byte> want = model_bytes(1);
  ASSERT_EQ((*second)->blocks.size(), 1u);
  ASSERT_EQ((*second)->blocks[0].contents.size(), want.size());
  EXPECT_EQ(std::memcmp((*second)->blocks[0].contents.data(), want.data(), want.size()), 0);
  EXPECT_TRUE(device->free_address_range(kept[1].va, kRange).ok());
  (*store)->finish_claim(kept[1].token);
  EXPECT_EQ(files_in("repository"), 0u);
}

TEST_F(SessionStoreTest, AKeptModelWhoseBytesChangedIsDroppedAndItsFilesRemoved) {
  const std::vector<Kept> kept = keep_sessions(1);
  ASSERT_FALSE(HasFailure());
  const Kept& k = kept[0];
  {
    std::fstream file(k.file.path, std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(static_cast<std::streamoff>(k.file.offset + kModel / 2));
    file.put(static_cast<char>(~static_cast<unsigned char>(model_bytes(0)[kModel / 2])));
  }
  auto device = make_device();
  auto store = SessionStore::open(*device, {state_dir(), std::chrono::minutes(10)});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->recovered(), 0u);
  EXPECT_EQ((*store)->claim(k.token, k.function, "i").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(files_in("sessions"), 0u);
  EXPECT_EQ(files_in("repository"), 0u);
  // Its range was never held.
  auto reserved = device->reserve_address_range_at(k.va, kRange);
  EXPECT_TRUE(reserved.ok()) << reserved.status();
}

}  // namespace
}  // namespace hiber::server
