// An HTTP request as the router's handlers see it, and the answer they give: plain values,
// so that the handlers do not depend on the HTTP library.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hiber::router {

struct ApiRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string path;                                          // the target without its query
  std::string query;                                         // after '?', may be empty
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;

  // The first header of that (lower-case) name, or "".
  const std::string& header(std::string_view name) const;
};

struct ApiResponse {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// An error answer: {"error": message}, as KServe's v2 protocol gives them.
ApiResponse error_response(unsigned status, std::string_view message);

// A handler answers each request exactly once, now or later, through Respond.
using Respond = std::function<void(ApiResponse)>;

}  // namespace hiber::router
