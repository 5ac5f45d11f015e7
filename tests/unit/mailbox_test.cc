// Mailbox: posts are taken in order, waits end on a post or a close, a closed mailbox refuses.
#include "common/mailbox.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace hiber {
namespace {

using std::chrono::milliseconds;

TEST(Mailbox, TakesEverythingInPostingOrder) {
  Mailbox<std::string> box;
  EXPECT_TRUE(box.take_all().empty());
  EXPECT_TRUE(box.post("a"));
  EXPECT_TRUE(box.post("b"));
  EXPECT_EQ(box.take_all(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(box.take_all().empty());
}

TEST(Mailbox, WaitTimesOutWhenNothingIsPosted) {
  Mailbox<int> box;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(box.wait_for(milliseconds(20)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
}

TEST(Mailbox, WaitReturnsAtOnceWithMailWaiting) {
  Mailbox<int> box;
  box.post(1);
  EXPECT_TRUE(box.wait_for(std::chrono::hours(1)));
}

TEST(Mailbox, AWaiterWakesOnAPostFromAnotherThread) {
  Mailbox<int> box;
  std::thread poster([&] {
    std::this_thread::sleep_for(milliseconds(10));
    box.post(7);
  });
  EXPECT_TRUE(box.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(box.take_all(), std::vector<int>{7});
  poster.join();
}

TEST(Mailbox, CloseWakesWaitersAndRefusesLaterPosts) {
  Mailbox<int> box;
  box.post(1);
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(10));
    box.close();
  });
  box.take_all();
  EXPECT_FALSE(box.wait_for(std::chrono::seconds(30)));
  closer.join();
  EXPECT_TRUE(box.closed());
  EXPECT_FALSE(box.post(2));
  EXPECT_TRUE(box.take_all().empty());
}

}  // namespace
}  // namespace hiber
