#pragma once
// The router's live status page (docs/router.md, "Status page"): one self-contained HTML
// document, router/status_page.html, embedded at build time. hiber-router answers it for GET /;
// the page polls GET /v2/status and draws it.
#include <string_view>

namespace hiber::router {

// The page's bytes (UTF-8 HTML), valid for the program's life.
std::string_view status_page_html();

}  // namespace hiber::router
