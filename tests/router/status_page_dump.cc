// Writes the embedded status page (router/status_page.h) to stdout, byte for byte, so the
// fixture server (status_fixture_server.py) serves exactly what hiber-router would.
#include <cstdio>
#include <string_view>

#include "router/status_page.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    std::fprintf(stderr,
                 "usage: %s > page.html\n"
                 "Writes hiber-router's embedded status page to stdout.\n",
                 argv[0]);
    return std::string_view(argv[1]) == "--help" ? 0 : 2;
  }
  const std::string_view page = hiber::router::status_page_html();
  return std::fwrite(page.data(), 1, page.size(), stdout) == page.size() && std::fflush(stdout) == 0
             ? 0
             : 1;
}
