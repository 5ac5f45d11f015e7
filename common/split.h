// Splitting a list written in one string ("a,b,c", LD_PRELOAD's "a b:c") into its items.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

namespace hiber {

// The items of `text` between any of the characters of `separators`, empty items dropped. The
// views point into `text`.
inline std::vector<std::string_view> split_nonempty(std::string_view text,
                                                    std::string_view separators) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find_first_of(separators, start), text.size());
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

}  // namespace hiber
