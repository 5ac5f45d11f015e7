#include "router/registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "router/worker_programs.h"

namespace hiber::router {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Status field_error(std::string_view field, std::string_view what) {
  return error(ErrorCode::kInvalidValue, "registration field \"", field, "\": ", what);
}

// Reads an optional number field within [low, high].
Status read_number(const json& body, std::string_view field, double low, double high, double& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return Status();
  if (!it->is_number()) return field_error(field, "must be a number");
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < low || value > high) {
    return field_error(field, str_cat("must be within [", low, ", ", high, "]"));
  }
  out = value;
  return Status();
}

Status read_bool(const json& body, std::string_view field, bool& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return Status();
  if (!it->is_boolean()) return field_error(field, "must be true or false");
  out = it->get<bool>();
  return Status();
}

}  // namespace

wire::FunctionRegistration FunctionSpec::registration() const {
  wire::FunctionRegistration r;
  r.function_id = name;
  r.slo_ms = slo_ms;
  r.tail_percentile = percentile;
  r.quota_bytes = quota_mib << 20;
  r.stateful = stateful;
  r.heavy = heavy;
  r.exec_ms_hint = exec_ms_hint;
  return r;
}

json FunctionSpec::to_json() const {
  json out = {{"env", env},
              {"shim", shim},
              {"slo_ms", slo_ms},
              {"percentile", percentile},
              {"quota_mib", quota_mib},
              {"concurrency", concurrency},
              {"max_instances", max_instances},
              {"stateful", stateful},
              {"idle_timeout_s", idle_timeout.count()},
              {"exec_ms_hint", exec_ms_hint}};
  out["heavy"] = heavy ? json(*heavy) : json(nullptr);
  for (const auto& [field, tensors] : {std::pair{"inputs", &inputs}, {"outputs", &outputs}}) {
    if (tensors->empty()) continue;
    json& list = out[field] = json::array();
    for (const TensorSpec& t : *tensors) list.push_back(t.to_json());
  }
  if (external) {
    out["external"] = true;
  } else {
    out["command"] = command;
  }
  return out;
}

Result<FunctionSpec> parse_function_spec(std::string_view name, std::string_view json_body) {
  HIBER_RETURN_IF_ERROR(check_function_name(name));
  json body = json::parse(json_body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return error(ErrorCode::kInvalidValue, "registration is not JSON");
  if (!body.is_object()) return error(ErrorCode::kInvalidValue, "registration is not an object");
  static const char* const kKnown[] = {
      "command",      "env",         "shim",          "slo_ms",   "percentile",
      "quota_mib",    "concurrency", "max_instances", "stateful", "idle_timeout_s",
      "exec_ms_hint", "heavy",       "external",      "inputs",   "outputs"};
  for (const auto& [key, value] : body.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return field_error(key, "unknown field");
    }
  }
  FunctionSpec spec;
  spec.name = std::string(name);

  HIBER_RETURN_IF_ERROR(read_bool(body, "external", spec.external));
  auto command = body.find("command");
  if (spec.external) {
    if (command != body.end() && !command->is_null()) {
      return field_error("command",
                         "must be absent with external: true (the router starts no worker)");
    }
  } else {
    if (command == body.end() || !command->is_array() || command->empty()) {
      return field_error("command",
                         "must be a non-empty array of strings (the worker's argv), unless "
                         "external is true");
    }
    for (const json& arg : *command) {
      if (!arg.is_string()) return field_error("command", "must hold strings only");
      spec.command.push_back(arg.get<std::string>());
    }
    if (spec.command[0].empty()) return field_error("command", "the program is empty");
  }

  if (auto env = body.find("env"); env != body.end() && !env->is_null()) {
    if (!env->is_object()) return field_error("env", "must be an object of strings");
    for (const auto& [key, value] : env->items()) {
      if (!value.is_string()) return field_error("env", "must be an object of strings");
      if (key.empty() || key.find('=') != std::string::npos) {
        return field_error("env", str_cat("bad variable name \"", key, "\""));
      }
      spec.env[key] = value.get<std::string>();
    }
    HIBER_RETURN_IF_ERROR(check_worker_environment(spec.env));
  }
  HIBER_RETURN_IF_ERROR(read_bool(body, "shim", spec.shim));
  HIBER_RETURN_IF_ERROR(read_bool(body, "stateful", spec.stateful));
  HIBER_RETURN_IF_ERROR(read_number(body, "slo_ms", 0.001, 86400e3, spec.slo_ms));
  // hiberd takes a percentile in (0, 1).
  HIBER_RETURN_IF_ERROR(read_number(body, "percentile", 0.01, 0.9999, spec.percentile));
  double quota = 0, concurrency = 1, instances = 1, idle = 60;
  HIBER_RETURN_IF_ERROR(read_number(body, "quota_mib", 0, 1 << 24, quota));
  HIBER_RETURN_IF_ERROR(read_number(body, "concurrency", 1, 1024, concurrency));
  HIBER_RETURN_IF_ERROR(read_number(body, "max_instances", 1, 1024, instances));
  HIBER_RETURN_IF_ERROR(read_number(body, "idle_timeout_s", 0, 7 * 86400, idle));
  HIBER_RETURN_IF_ERROR(read_number(body, "exec_ms_hint", 0, 86400e3, spec.exec_ms_hint));
  for (auto [field, value] : {std::pair{"quota_mib", quota},
                              {"concurrency", concurrency},
                              {"max_instances", instances},
                              {"idle_timeout_s", idle}}) {
    if (value != std::floor(value)) return field_error(field, "must be a whole number");
  }
  spec.quota_mib = static_cast<uint64_t>(quota);
  spec.concurrency = static_cast<uint32_t>(concurrency);
  spec.max_instances = static_cast<uint32_t>(instances);
  spec.idle_timeout = std::chrono::seconds(static_cast<int64_t>(idle));
  if (auto heavy = body.find("heavy"); heavy != body.end() && !heavy->is_null()) {
    if (!heavy->is_boolean()) return field_error("heavy", "must be true, false or null");
    spec.heavy = heavy->get<bool>();
  }
  for (const auto& [field, tensors] :
       {std::pair{"inputs", &spec.inputs}, {"outputs", &spec.outputs}}) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) continue;
    HIBER_ASSIGN_OR_RETURN(*tensors, parse_tensor_specs(*it, field));
  }
  return spec;
}

namespace {

// Reads the registrations in `folder` into `out`.
Status read_folder(const std::string& folder, std::map<std::string, FunctionSpec>& out) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return error(ErrorCode::kOperatingSystem, "cannot create ", folder, ": ", ec.message());
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, ec)) {
    const fs::path& path = entry.path();
    if (path.extension() != ".json") continue;  // a temporary file left by a crash
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return error(ErrorCode::kOperatingSystem, "cannot read ", path.string());
    Result<FunctionSpec> spec = parse_function_spec(path.stem().string(), text.str());
    if (!spec.ok()) return spec.status().with_context(path.string());
    out[spec->name] = std::move(*spec);
  }
  if (ec) return error(ErrorCode::kOperatingSystem, "cannot list ", folder, ": ", ec.message());
  return Status();
}

}  // namespace

Result<Registry> Registry::open(const std::string& state_dir) {
  Registry registry((fs::path(state_dir) / "functions").string());
  HIBER_RETURN_IF_ERROR(read_folder(registry.folder_, registry.functions_));
  HIBER_RETURN_IF_ERROR(
      read_folder((fs::path(registry.folder_) / "unloaded").string(), registry.unloaded_));
  // A crash between a load's rename and its unlink leaves both: the load happened.
  for (const auto& [name, spec] : registry.functions_) {
    if (registry.unloaded_.erase(name) > 0) {
      if (::unlink(registry.unloaded_path_of(name).c_str()) != 0 && errno != ENOENT) {
        return os_error("unlink " + registry.unloaded_path_of(name));
      }
    }
  }
  return registry;
}

const FunctionSpec* Registry::find_unloaded(const std::string& name) const {
  auto it = unloaded_.find(name);
  return it == unloaded_.end() ? nullptr : &it->second;
}

const FunctionSpec* Registry::find(const std::string& name) const {
  auto it = functions_.find(name);
  return it == functions_.end() ? nullptr : &it->second;
}

std::string Registry::path_of(const std::string& name) const {
  return (fs::path(folder_) / (name + ".json")).string();
}

std::string Registry::unloaded_path_of(const std::string& name) const {
  return (fs::path(folder_) / "unloaded" / (name + ".json")).string();
}

Status Registry::put(FunctionSpec spec) {
  const std::string path = path_of(spec.name);
  const std::string temporary = path + ".tmp";
  const std::string text = spec.to_json().dump(2) + "\n";
  {
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return os_error("open " + temporary);
    size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        Status failed = os_error("write " + temporary);
        ::close(fd);
        return failed;
      }
      written += static_cast<size_t>(n);
    }
    // The rename below must not make an empty file visible after a power cut.
    if (::fsync(fd) != 0 || ::close(fd) != 0) return os_error("fsync " + temporary);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) return os_error("rename " + path);
  if (unloaded_.erase(spec.name) > 0 && ::unlink(unloaded_path_of(spec.name).c_str()) != 0 &&
      errno != ENOENT) {
    return os_error("unlink " + unloaded_path_of(spec.name));
  }
  functions_[spec.name] = std::move(spec);
  return Status();
}

Status Registry::unload(const std::string& name) {
  auto it = functions_.find(name);
  if (it == functions_.end()) {
    return error(ErrorCode::kNotFound, "function \"", name, "\" is not loaded");
  }
  if (::rename(path_of(name).c_str(), unloaded_path_of(name).c_str()) != 0) {
    return os_error("rename " + path_of(name));
  }
  unloaded_[name] = std::move(it->second);
  functions_.erase(it);
  return Status();
}

}  // namespace hiber::router
