// What a restarted hiberd hands back, and to whom: a session kept by one store is recovered by
// the next (a new process's view: a new device, the files read back), verified byte for byte
// against the digest the test computes, and claimed only with its token, by its own function
// and instance, once. A kept model whose bytes changed is dropped, never handed out.
#include "server/session_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "server/device/sim_device.h"
#include "server/model_repository.h"
#include "tests/unit/temp_dir.h"

namespace hiber::server {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kRange = 64 * kMiB;
constexpr uint64_t kModel = 2 * kMiB;

std::unique_ptr<device::SimDevice> make_device() {
  device::SimDeviceOptions options;
  for (GpuSpec& gpu : options.node.gpus) gpu.memory_bytes = 256 * kMiB;
  auto device = device::SimDevice::create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

std::vector<std::byte> model_bytes() {
  std::vector<std::byte> bytes(kModel);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>((i * 31 + 7) & 0xff);
  return bytes;
}

class SessionStoreTest : public ::testing::Test {
 protected:
  // One hiberd's life: a session of function "f", instance "i", whose model is one block
  // holding model_bytes(), saved, and hiberd stopped keeping its files. Returns the token.
  std::string keep_a_session() {
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
    auto copy = (*repository)->allocate(FunctionId{1}, kModel);
    EXPECT_TRUE(copy.ok()) << copy.status();
    const std::vector<std::byte> bytes = model_bytes();
    std::memcpy(copy->data, bytes.data(), bytes.size());
    auto va = device->reserve_address_range(kRange, 2 * kMiB);
    EXPECT_TRUE(va.ok()) << va.status();
    va_ = *va;
    EXPECT_TRUE(device->free_address_range(*va, kRange).ok());

    auto token = SessionStore::new_token();
    EXPECT_TRUE(token.ok());
    const StoredSession who{"f", "i", va_, kRange, 32 * kMiB, false};
    std::optional<HostCopyFile> file = (*repository)->file_of(*copy);
    EXPECT_TRUE(file.has_value());
    kept_file_ = *file;
    const Status saved = (*store)->save(
        *token, who, {FunctionMemory::KeptBlock{va_ + 4 * kMiB, kModel, *file, sha256(bytes)}});
    EXPECT_TRUE(saved.ok()) << saved;
    (*repository)->keep_files();
    return *token;
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
  uint64_t va_ = 0;
  HostCopyFile kept_file_;  // where the model's host copy lies
};

TEST_F(SessionStoreTest, AKeptSessionIsHandedOnlyToItsOwnFunctionAndInstanceOnce) {
  const std::string token = keep_a_session();
  ASSERT_FALSE(HasFailure());
  auto device = make_device();
  auto store = SessionStore::open(*device, {state_dir(), std::chrono::minutes(10)});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->recovered(), 1u);

  // Another function's session, another instance's, and a token nobody was given: refused,
  // and the session stays for its own client.
  auto foreign = (*store)->claim(token, "g", "i");
  EXPECT_EQ(foreign.status().code(), ErrorCode::kNotPermitted) << foreign.status();
  auto other_instance = (*store)->claim(token, "f", "j");
  EXPECT_EQ(other_instance.status().code(), ErrorCode::kNotPermitted) << other_instance.status();
  std::string guessed = token;
  guessed[0] = guessed[0] == '0' ? '1' : '0';
  EXPECT_EQ((*store)->claim(guessed, "f", "i").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ((*store)->recovered(), 1u);

  // Its range is held: a new session cannot be given it.
  EXPECT_FALSE(device->reserve_address_range_at(va_, kRange).ok());

  auto claimed = (*store)->claim(token, "f", "i");
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ((*claimed)->who.va_base, va_);
  EXPECT_EQ((*claimed)->who.va_bytes, kRange);
  ASSERT_EQ((*claimed)->blocks.size(), 1u);
  EXPECT_EQ((*claimed)->blocks[0].va, va_ + 4 * kMiB);
  const std::vector<std::byte> want = model_bytes();
  ASSERT_EQ((*claimed)->blocks[0].contents.size(), want.size());
  EXPECT_EQ(std::memcmp((*claimed)->blocks[0].contents.data(), want.data(), want.size()), 0);
  EXPECT_EQ((*store)->claim(token, "f", "i").status().code(), ErrorCode::kNotFound)
      << "a session is handed out once";

  // The claimant owns the range; finishing the claim removes the record and the old files.
  EXPECT_TRUE(device->free_address_range(va_, kRange).ok());
  (*store)->finish_claim(token);
  EXPECT_EQ((*store)->recovered(), 0u);
  EXPECT_EQ(files_in("sessions"), 0u);
  EXPECT_EQ(files_in("repository"), 0u);
}

TEST_F(SessionStoreTest, AKeptModelWhoseBytesChangedIsDroppedAndItsFilesRemoved) {
  const std::string token = keep_a_session();
  ASSERT_FALSE(HasFailure());
  {
    std::fstream file(kept_file_.path, std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(static_cast<std::streamoff>(kept_file_.offset + kModel / 2));
    file.put(static_cast<char>(~static_cast<unsigned char>(model_bytes()[kModel / 2])));
  }
  auto device = make_device();
  auto store = SessionStore::open(*device, {state_dir(), std::chrono::minutes(10)});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->recovered(), 0u);
  EXPECT_EQ((*store)->claim(token, "f", "i").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(files_in("sessions"), 0u);
  EXPECT_EQ(files_in("repository"), 0u);
  // Its range was never held.
  auto reserved = device->reserve_address_range_at(va_, kRange);
  EXPECT_TRUE(reserved.ok()) << reserved.status();
}

}  // namespace
}  // namespace hiber::server
