// The embedded status page (router/status_page.h) against its source, router/status_page.html:
// the bytes hiber-router serves must be the file's, and the page must stand alone (an
// operator's browser may not reach the internet from where the router runs).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "router/status_page.h"

namespace {

std::string ReadSource() {
  std::ifstream in(std::string(HIBER_SOURCE_DIR) + "/router/status_page.html", std::ios::binary);
  EXPECT_TRUE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(StatusPageEmbed, BytesAreTheSourceFile) {
  const std::string source = ReadSource();
  ASSERT_FALSE(source.empty());
  EXPECT_EQ(hiber::router::status_page_html(), source);
}

TEST(StatusPageEmbed, NoTrailingNulInTheView) {
  const std::string_view page = hiber::router::status_page_html();
  ASSERT_FALSE(page.empty());
  EXPECT_EQ(page.find('\0'), std::string_view::npos);
  EXPECT_EQ(page.substr(0, 15), "<!doctype html>");
  EXPECT_EQ(page.substr(page.size() - 8), "</html>\n");
}

TEST(StatusPageEmbed, LoadsNothingFromElsewhere) {
  const std::string_view page = hiber::router::status_page_html();
  for (const std::string_view external :
       {"http://", "https://", "<link", " src=", "@import", "url("}) {
    EXPECT_EQ(page.find(external), std::string_view::npos) << external;
  }
  // It polls the router it came from, relative to the page's own address.
  EXPECT_NE(page.find("fetch(\"v2/status\""), std::string_view::npos);
}

}  // namespace
