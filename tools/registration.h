// The registration JSON `hiberctl load` sends to hiber-router
// (`POST /v2/repository/models/{fn}/load`, docs/router.md): a file's, with the fields given as
// flags set over it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace hiber::tools {

// The registration fields hiberctl takes as flags; none means "as the file says, else the
// router's default".
struct RegistrationFlags {
  std::optional<std::string> command;  // split as a shell would split plain words and quotes
  std::optional<std::string> env;      // "K=V,K2=V2"
  std::optional<bool> shim;
  std::optional<double> slo_ms;
  std::optional<double> percentile;
  std::optional<uint64_t> quota_mib;
  std::optional<uint64_t> concurrency;
  std::optional<uint64_t> max_instances;
  std::optional<bool> stateful;
  std::optional<uint64_t> idle_timeout_s;
  std::optional<double> exec_ms_hint;
  std::optional<bool> heavy;
  std::optional<bool> external;  // workers attach by themselves: no command
};

// `base` (an object, or null for none) with `flags` set over it. `env` entries are added to the
// base's. kInvalidValue when the result has no non-empty "command" array of strings, unless it
// has "external": true, which must come without one.
Result<nlohmann::json> build_registration(nlohmann::json base, const RegistrationFlags& flags);

// "python3 'my worker.py' --x=\"a b\"" -> {python3, my worker.py, --x=a b}: blanks separate
// words; single quotes keep everything literally, double quotes keep blanks (a backslash
// escapes the next character outside single quotes). No expansions.
Result<std::vector<std::string>> split_command(std::string_view command);

// "A=1,B=x=y" -> {A: 1, B: x=y}. Empty names and entries without '=' are kInvalidValue.
Result<std::map<std::string, std::string>> parse_env(std::string_view env);

}  // namespace hiber::tools
