#include "tools/registration.h"

namespace hiber::tools {

using nlohmann::json;

Result<std::vector<std::string>> split_command(std::string_view command) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        word += c;
      }
      continue;
    }
    if (c == '\\') {
      if (i + 1 == command.size()) {
        return Status(ErrorCode::kInvalidValue, "the command ends in a lone backslash");
      }
      word += command[++i];
      in_word = true;
      continue;
    }
    if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else {
        word += c;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote != 0) return error(ErrorCode::kInvalidValue, "unterminated ", quote, " in the command");
  if (in_word) words.push_back(std::move(word));
  return words;
}

Result<std::map<std::string, std::string>> parse_env(std::string_view env) {
  std::map<std::string, std::string> out;
  while (!env.empty()) {
    const size_t comma = env.find(',');
    const std::string_view entry = env.substr(0, comma);
    env = comma == std::string_view::npos ? std::string_view() : env.substr(comma + 1);
    if (entry.empty()) continue;
    const size_t equals = entry.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      return error(ErrorCode::kInvalidValue, "'", entry, "' is not NAME=VALUE");
    }
    out[std::string(entry.substr(0, equals))] = std::string(entry.substr(equals + 1));
  }
  return out;
}

Result<json> build_registration(json base, const RegistrationFlags& flags) {
  if (base.is_null()) base = json::object();
  if (!base.is_object()) {
    return Status(ErrorCode::kInvalidValue, "a registration must be a JSON object");
  }
  if (flags.command) {
    HIBER_ASSIGN_OR_RETURN(auto words, split_command(*flags.command));
    base["command"] = words;
  }
  if (flags.env) {
    HIBER_ASSIGN_OR_RETURN(auto env, parse_env(*flags.env));
    json& into = base["env"];
    if (into.is_null()) into = json::object();
    if (!into.is_object()) return Status(ErrorCode::kInvalidValue, "\"env\" must be an object");
    for (const auto& [name, value] : env) into[name] = value;
  }
  auto set = [&](const char* key, const auto& value) {
    if (value) base[key] = *value;
  };
  set("shim", flags.shim);
  set("slo_ms", flags.slo_ms);
  set("percentile", flags.percentile);
  set("quota_mib", flags.quota_mib);
  set("concurrency", flags.concurrency);
  set("max_instances", flags.max_instances);
  set("stateful", flags.stateful);
  set("idle_timeout_s", flags.idle_timeout_s);
  set("exec_ms_hint", flags.exec_ms_hint);
  set("heavy", flags.heavy);
  set("external", flags.external);

  auto it = base.find("command");
  if (base.value("external", false) == true) {
    if (it != base.end()) {
      return Status(ErrorCode::kInvalidValue,
                    "an external function (its workers attach by themselves) has no \"command\"");
    }
    return base;
  }
  bool good = it != base.end() && it->is_array() && !it->empty();
  if (good) {
    for (const auto& word : *it) good = good && word.is_string();
  }
  if (!good) {
    return Status(ErrorCode::kInvalidValue,
                  "a registration needs \"command\": a non-empty array of strings (or "
                  "\"external\": true)");
  }
  return base;
}

}  // namespace hiber::tools
