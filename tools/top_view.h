// Text views of hiber-router's status JSON (`GET /v2/status`, docs/router.md): the screen
// `hiberctl top` redraws and the table `hiberctl functions` prints. Pure functions of the JSON
// (no clock, no terminal), so tests check them line by line.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace hiber::tools {

struct TopOptions {
  std::string router;     // shown in the title line
  size_t max_swaps = 10;  // rows of the recent swaps table
};

// The whole screen, lines ending in '\n'. The functions table is sorted by requests, most first;
// its RPS column is the router's own rate, the function's answers over the last 10 s (the
// status's "rps"), so the first refresh has it too. Missing fields show as "-"; a field of the
// wrong type is kInvalidValue.
Result<std::string> render_top(const nlohmann::json& status, const TopOptions& options);

// `hiberctl functions`: one row per function of the registry (`GET /v2/repository/index`, in
// its order) with its numbers from the status (`GET /v2/status`), "-" where it has none.
Result<std::string> render_functions(const nlohmann::json& index, const nlohmann::json& status);

// "[#####...............]": `width` cells, `used / total` of them filled (rounded to nearest).
std::string usage_bar(uint64_t used, uint64_t total, int width);

// "1.5 GiB", "512.0 MiB", "12.0 KiB", "100 B".
std::string format_bytes(uint64_t bytes);

}  // namespace hiber::tools
