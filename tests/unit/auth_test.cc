#include "server/auth.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/unique_fd.h"
#include "tests/unit/temp_dir.h"

namespace hiber::server {
namespace {

using ::hiber::testing::TempDir;

TEST(Auth, CreatesAPrivateRandomTokenOnceAndReadsItBack) {
  TempDir dir;
  const std::string path = dir.path() + "/token";
  auto first = load_or_create_token(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto again = load_or_create_token(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);

  TempDir other;
  auto different = load_or_create_token(other.path() + "/token");
  EXPECT_NE(*different, *first);
}

TEST(Auth, RefusesATokenOthersCanRead) {
  TempDir dir;
  const std::string path = dir.path() + "/token";
  std::ofstream(path) << "secret\n";
  ::chmod(path.c_str(), 0644);
  auto token = load_or_create_token(path);
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), ErrorCode::kNotPermitted);
  ::chmod(path.c_str(), 0600);
  token = load_or_create_token(path);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "secret");
}

TEST(Auth, TokensCompareByContent) {
  EXPECT_TRUE(tokens_equal("abc", "abc"));
  EXPECT_FALSE(tokens_equal("abc", "abd"));
  EXPECT_FALSE(tokens_equal("abc", "abcd"));
  EXPECT_FALSE(tokens_equal("", "a"));
}

TEST(Auth, ParsesUidLists) {
  auto uids = parse_uid_list("0,1000,65534");
  ASSERT_TRUE(uids.ok());
  EXPECT_EQ(*uids, (std::vector<uid_t>{0, 1000, 65534}));
  EXPECT_FALSE(parse_uid_list("0,,1").ok());
  EXPECT_FALSE(parse_uid_list("root").ok());
  EXPECT_FALSE(parse_uid_list("1x").ok());
}

TEST(Auth, PeerCredentialsAreTheKernels) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  auto peer = peer_credentials(a.get());
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->pid, ::getpid());
  EXPECT_EQ(peer->uid, ::geteuid());
}

}  // namespace
}  // namespace hiber::server
