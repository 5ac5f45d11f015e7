#include "router/status_page.h"

#include <cstddef>

namespace hiber::router {
namespace embedded {
// Defined in the generated status_page_data.cc (router/CMakeLists.txt).
extern const unsigned char kStatusPage[];
extern const std::size_t kStatusPage_size;
}  // namespace embedded

std::string_view status_page_html() {
  return {reinterpret_cast<const char*>(embedded::kStatusPage), embedded::kStatusPage_size};
}

}  // namespace hiber::router
