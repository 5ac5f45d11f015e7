#include "containers/webhook/pod_patch.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string_view>

#include "common/split.h"
#include "router/function_name.h"

namespace hiber::inject {
namespace {

using nlohmann::json;

Status invalid(const auto&... parts) { return error(ErrorCode::kInvalidValue, parts...); }

// A volume hiber-inject adds, the mount it gets in every container, and how to tell whether a
// volume of that name already in the pod is this one (a re-invocation) or the user's.
struct Volume {
  json volume;
  json mount;
  std::string source_field;  // "hostPath" or "secret"
  std::string source_key;    // "path" or "secretName"
  std::string source;        // what that key must hold
};

json secret_volume(const std::string& name, const std::string& secret, const std::string& key) {
  return {{"name", name},
          {"secret",
           {{"secretName", secret}, {"items", json::array({{{"key", key}, {"path", key}}})}}}};
}

std::vector<Volume> volumes(const InjectConfig& c) {
  auto mount = [](const char* name, const std::string& path) {
    return json{{"name", name}, {"mountPath", path}, {"readOnly", true}};
  };
  // Directory, not DirectoryOrCreate: a pod scheduled before hiberd's DaemonSet has filled the
  // node waits in ContainerCreating instead of running without the shim.
  return {
      {{{"name", "hiber-shim"}, {"hostPath", {{"path", c.shim_host_path}, {"type", "Directory"}}}},
       mount("hiber-shim", c.shim_mount_path),
       "hostPath",
       "path",
       c.shim_host_path},
      // Read-only suffices: connecting to a Unix socket needs no write access to its file system.
      {{{"name", "hiber-run"},
        {"hostPath", {{"path", c.run_dir_host_path}, {"type", "Directory"}}}},
       mount("hiber-run", c.run_dir_mount_path),
       "hostPath",
       "path",
       c.run_dir_host_path},
      {secret_volume("hiber-function-token", c.token_secret, c.token_secret_key),
       mount("hiber-function-token", kTokenMountPath), "secret", "secretName", c.token_secret},
      {secret_volume("hiber-worker-token", c.worker_token_secret, c.worker_token_secret_key),
       mount("hiber-worker-token", kWorkerTokenMountPath), "secret", "secretName",
       c.worker_token_secret},
  };
}

std::string preload(const InjectConfig& c) {
  std::string value;
  for (const std::string& library : c.shim_libraries) {
    value += (value.empty() ? "" : " ") + c.shim_mount_path + "/" + library;
  }
  return value;
}

// Every container's environment, LD_PRELOAD first (merged with the user's, below).
std::vector<std::pair<std::string, std::string>> environment(const InjectConfig& c,
                                                             const std::string& function_id) {
  return {
      {"LD_PRELOAD", preload(c)},
      {"HIBER_RUN_DIR", c.run_dir_mount_path},
      {"HIBER_AUTH_TOKEN_FILE", std::string(kTokenMountPath) + "/" + c.token_secret_key},
      {"HIBER_FUNCTION_ID", function_id},
      {"HIBER_WORKER_SOCKET", c.router_worker_address},
      {"HIBER_WORKER_TOKEN_FILE",
       std::string(kWorkerTokenMountPath) + "/" + c.worker_token_secret_key},
      // The NVIDIA container runtime exposes every GPU to a container whose image sets
      // NVIDIA_VISIBLE_DEVICES=all (CUDA images do), requested or not; "void" exposes none.
      {"NVIDIA_VISIBLE_DEVICES", "void"},
  };
}

// LD_PRELOAD's separators are spaces and colons.
std::vector<std::string_view> split_preload(std::string_view value) {
  return split_nonempty(value, " :");
}

// The user's LD_PRELOAD with the shim's libraries in front, unless they are all there already.
std::string merged_preload(const std::string& ours, std::string_view theirs) {
  const std::vector<std::string_view> present = split_preload(theirs);
  bool all_there = true;
  for (std::string_view library : split_preload(ours)) {
    all_there = all_there && std::find(present.begin(), present.end(), library) != present.end();
  }
  if (all_there) return std::string(theirs);
  if (present.empty()) return ours;
  return ours + " " + std::string(theirs);
}

Status check_array(const json& parent, const char* field, const std::string& where) {
  auto it = parent.find(field);
  if (it == parent.end() || it->is_null() || it->is_array()) return Status();
  return invalid(where, ".", field, " is not a list");
}

std::string container_name(const json& container, size_t index) {
  auto name = container.find("name");
  if (name != container.end() && name->is_string()) return name->get<std::string>();
  return str_cat("#", index);
}

// Appends to `array` at `path`: one "add" of the whole list when the pod has none, else one
// "add" per item at the end.
void append_all(json& patch, const std::string& path, bool exists, const std::vector<json>& items) {
  if (items.empty()) return;
  if (!exists) {
    patch.push_back({{"op", "add"}, {"path", path}, {"value", items}});
    return;
  }
  for (const json& item : items)
    patch.push_back({{"op", "add"}, {"path", path + "/-"}, {"value", item}});
}

bool has_array(const json& parent, const char* field) {
  auto it = parent.find(field);
  return it != parent.end() && it->is_array();
}

Status add_volumes(const json& spec, const std::vector<Volume>& ours, json& patch) {
  HIBER_RETURN_IF_ERROR(check_array(spec, "volumes", "spec"));
  std::vector<json> missing;
  for (const Volume& v : ours) {
    const std::string name = v.volume["name"];
    std::optional<json> existing;
    if (has_array(spec, "volumes")) {
      for (const json& volume : spec["volumes"]) {
        if (volume.is_object() && volume.value("name", json()) == name) existing = volume;
      }
    }
    if (!existing) {
      missing.push_back(v.volume);
      continue;
    }
    // Already there from an earlier invocation (the API server may have added defaults since).
    const json* source = nullptr;
    if (auto it = existing->find(v.source_field); it != existing->end() && it->is_object()) {
      source = &*it;
    }
    if (source == nullptr || source->value(v.source_key, json()) != v.source) {
      return invalid("the pod has its own volume \"", name,
                     "\"; volume names starting with "
                     "\"hiber-\" are hiber-inject's: rename it");
    }
  }
  append_all(patch, "/spec/volumes", has_array(spec, "volumes"), missing);
  return Status();
}

Status add_mounts(const json& container, const std::string& path, const std::string& name,
                  const std::vector<Volume>& ours, json& patch) {
  const std::string where = "container \"" + name + "\"";
  HIBER_RETURN_IF_ERROR(check_array(container, "volumeMounts", where));
  const bool exists = has_array(container, "volumeMounts");
  std::vector<json> missing;
  for (const Volume& v : ours) {
    const std::string volume = v.mount["name"];
    const std::string mount_path = v.mount["mountPath"];
    bool present = false;
    if (exists) {
      for (const json& mount : container["volumeMounts"]) {
        if (!mount.is_object()) return invalid(where, " has a volume mount that is not an object");
        const json mount_name = mount.value("name", json());
        const json at = mount.value("mountPath", json());
        if (mount_name == volume && at == mount_path) {
          present = true;
        } else if (mount_name == volume || at == mount_path) {
          return invalid(where, " mounts ", mount_name.dump(), " at ", at.dump(),
                         ", where hiber-inject mounts \"", volume, "\" at \"", mount_path,
                         "\": change the pod's mount");
        }
      }
    }
    if (!present) missing.push_back(v.mount);
  }
  append_all(patch, path + "/volumeMounts", exists, missing);
  return Status();
}

Status set_environment(const json& container, const std::string& path, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& ours, json& patch) {
  const std::string where = "container \"" + name + "\"";
  HIBER_RETURN_IF_ERROR(check_array(container, "env", where));
  const bool exists = has_array(container, "env");
  std::vector<json> missing;
  for (const auto& [variable, value] : ours) {
    // The last entry of a name is the one a container sees.
    std::optional<size_t> index;
    if (exists) {
      const json& env = container["env"];
      for (size_t i = 0; i < env.size(); ++i) {
        if (!env[i].is_object()) return invalid(where, " has an env entry that is not an object");
        if (env[i].value("name", json()) == variable) index = i;
      }
    }
    if (!index) {
      missing.push_back({{"name", variable}, {"value", value}});
      continue;
    }
    const json& entry = container["env"][*index];
    const bool from_source = entry.contains("valueFrom");
    std::string wanted = value;
    if (variable == "LD_PRELOAD") {
      if (from_source) {
        return invalid(where,
                       " takes LD_PRELOAD from valueFrom, which hiber-inject cannot extend "
                       "with the shim: give it as a value");
      }
      const json current = entry.value("value", json(""));
      if (!current.is_string()) return invalid(where, "'s LD_PRELOAD is not a string");
      wanted = merged_preload(value, current.get<std::string>());
    }
    if (!from_source && entry.value("value", json("")) == wanted) continue;
    patch.push_back({{"op", "replace"},
                     {"path", path + "/env/" + std::to_string(*index)},
                     {"value", {{"name", variable}, {"value", wanted}}}});
  }
  append_all(patch, path + "/env", exists, missing);
  return Status();
}

// Removes nvidia.com/gpu from one container's limits and requests.
Status remove_gpus(const json& container, const std::string& path, const std::string& name,
                   json& patch, std::vector<std::string>& warnings) {
  auto resources = container.find("resources");
  if (resources == container.end() || resources->is_null()) return Status();
  if (!resources->is_object())
    return invalid("container \"", name, "\".resources is not an object");
  bool removed = false;
  for (const char* field : {"limits", "requests"}) {
    auto list = resources->find(field);
    if (list == resources->end() || !list->is_object() || !list->contains(kGpuResource)) continue;
    patch.push_back({{"op", "remove"},
                     {"path", path + "/resources/" + field + "/" + escape_pointer(kGpuResource)}});
    removed = true;
  }
  if (removed) {
    warnings.push_back("hiber-inject removed the nvidia.com/gpu request of container \"" + name +
                       "\": only hiberd holds this node's GPUs");
  }
  return Status();
}

// A label's value; none when the pod lacks it.
Result<std::optional<std::string>> label(const json& pod, const char* name) {
  auto metadata = pod.find("metadata");
  if (metadata == pod.end() || metadata->is_null()) return std::optional<std::string>();
  if (!metadata->is_object()) return invalid("the pod's metadata is not an object");
  auto labels = metadata->find("labels");
  if (labels == metadata->end() || labels->is_null()) return std::optional<std::string>();
  if (!labels->is_object()) return invalid("the pod's metadata.labels is not an object");
  auto value = labels->find(name);
  if (value == labels->end()) return std::optional<std::string>();
  if (!value->is_string()) return invalid("the pod's label ", name, " is not a string");
  return std::optional<std::string>(value->get<std::string>());
}

bool dns_subdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return std::isalnum(static_cast<unsigned char>(name.front())) &&
         std::isalnum(static_cast<unsigned char>(name.back()));
}

bool secret_key(std::string_view key) {
  if (key.empty() || key.size() > 253 || key == "." || key == "..") return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

bool absolute_path(std::string_view path) {
  return !path.empty() && path.front() == '/' && path.find(':') == std::string_view::npos &&
         path.find("/../") == std::string_view::npos && !path.ends_with("/..");
}

}  // namespace

std::string escape_pointer(std::string_view token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

Status check_config(const InjectConfig& c) {
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--shim_host_path", c.shim_host_path},
        {"--shim_mount_path", c.shim_mount_path},
        {"--run_dir_host_path", c.run_dir_host_path},
        {"--run_dir_mount_path", c.run_dir_mount_path}}) {
    if (!absolute_path(path)) {
      return invalid(flag, " \"", path, "\": expected an absolute path without \"..\" or ':'");
    }
  }
  for (const std::string& mount : {c.shim_mount_path, c.run_dir_mount_path}) {
    for (const char* secret : {kTokenMountPath, kWorkerTokenMountPath}) {
      if (mount == secret) return invalid("the mount path ", mount, " is where a token is mounted");
    }
  }
  if (c.shim_mount_path == c.run_dir_mount_path) {
    return invalid("--shim_mount_path and --run_dir_mount_path are both ", c.shim_mount_path);
  }
  for (const auto& [flag, name] :
       {std::pair<const char*, const std::string&>{"--token_secret", c.token_secret},
        {"--worker_token_secret", c.worker_token_secret}}) {
    if (!dns_subdomain(name)) {
      return invalid(flag, " \"", name,
                     "\": a Secret's name is 1 to 253 of [a-z0-9.-], starting "
                     "and ending with a letter or digit");
    }
  }
  for (const auto& [flag, key] :
       {std::pair<const char*, const std::string&>{"--token_secret_key", c.token_secret_key},
        {"--worker_token_secret_key", c.worker_token_secret_key}}) {
    if (!secret_key(key)) return invalid(flag, " \"", key, "\": a Secret's key is [-._a-zA-Z0-9]+");
  }
  if (c.shim_libraries.empty()) return invalid("--shim_libraries is empty");
  for (const std::string& library : c.shim_libraries) {
    if (library.empty() || library.find_first_of("/: \t") != std::string::npos) {
      return invalid("--shim_libraries: \"", library,
                     "\" is not a file name (no '/', ':' or blank)");
    }
  }
  if (c.router_worker_address.empty()) return invalid("--router_worker_address is empty");
  return Status();
}

Result<PodPatch> patch_pod(const json& pod, const InjectConfig& config) {
  PodPatch out;
  out.patch = json::array();
  if (!pod.is_object()) return invalid("the object is not a Pod: not a JSON object");
  HIBER_ASSIGN_OR_RETURN(const std::optional<std::string> inject, label(pod, kInjectLabel));
  if (inject != "true") return out;
  out.opted_in = true;

  HIBER_ASSIGN_OR_RETURN(const std::optional<std::string> function, label(pod, kFunctionLabel));
  if (!function) {
    return invalid("the pod has the label ", kInjectLabel, "=true but no ", kFunctionLabel,
                   " label naming its function");
  }
  out.function_id = *function;
  if (Status valid = router::check_function_name(out.function_id); !valid.ok()) {
    return invalid("the pod's label ", kFunctionLabel, "=\"", out.function_id,
                   "\" is not a function name: ", valid.message());
  }

  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return invalid("the pod has no spec");
  auto containers = spec->find("containers");
  if (containers == spec->end() || !containers->is_array() || containers->empty()) {
    return invalid("the pod's spec.containers is not a non-empty list");
  }
  HIBER_RETURN_IF_ERROR(check_array(*spec, "initContainers", "spec"));

  const std::vector<Volume> ours = volumes(config);
  const auto env = environment(config, out.function_id);
  HIBER_RETURN_IF_ERROR(add_volumes(*spec, ours, out.patch));
  // Init containers keep their GPU-free view but get no shim: they run before the function,
  // usually programs (shells, copy tools) with no use for it.
  for (const char* list : {"containers", "initContainers"}) {
    if (!has_array(*spec, list)) continue;
    const json& items = (*spec)[list];
    for (size_t i = 0; i < items.size(); ++i) {
      const json& container = items[i];
      const std::string name = container_name(container, i);
      if (!container.is_object()) return invalid("spec.", list, " #", i, " is not an object");
      const std::string path = "/spec/" + std::string(list) + "/" + std::to_string(i);
      if (std::string_view(list) == "containers") {
        HIBER_RETURN_IF_ERROR(add_mounts(container, path, name, ours, out.patch));
        HIBER_RETURN_IF_ERROR(set_environment(container, path, name, env, out.patch));
      }
      HIBER_RETURN_IF_ERROR(remove_gpus(container, path, name, out.patch, out.warnings));
    }
  }
  return out;
}

}  // namespace hiber::inject
