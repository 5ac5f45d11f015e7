// The router's function registry: each function's registration (docs/router.md, "Registration")
// parsed and checked, and kept on disk as one JSON file per function, so that a restarted router
// serves every function it served before.
//
// Thread safety: none; the router uses it from its one I/O thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "router/function_name.h"
#include "router/inference_request.h"
#include "wire/control_types.h"

namespace hiber::router {

struct FunctionSpec {
  std::string name;
  std::vector<std::string> command;  // argv; command[0] is the program; empty when external
  // Its workers are started by someone else (a container runtime) and attach to the router
  // (docs/router.md, "Attached workers"): the router never starts, restarts or stops them.
  bool external = false;
  std::map<std::string, std::string> env;
  bool shim = false;  // preload Hiber's client libraries
  double slo_ms = 1000;
  double percentile = 0.98;
  uint64_t quota_mib = 0;  // 0: hiberd's default
  uint32_t concurrency = 1;
  uint32_t max_instances = 1;
  bool stateful = false;
  std::chrono::seconds idle_timeout{60};
  double exec_ms_hint = 0;
  std::optional<bool> heavy;
  // The tensors it takes and gives (the model metadata); empty: not declared, and JSON requests
  // are then checked against the protocol alone.
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;

  // The registration hiberd gets for it.
  wire::FunctionRegistration registration() const;
  nlohmann::json to_json() const;
};

// Parses a registration body. kInvalidValue, naming the field, for anything malformed.
Result<FunctionSpec> parse_function_spec(std::string_view name, std::string_view json_body);

// A function unloaded through the repository API stays in the repository, not ready, until a
// load (with or without a body) loads it again: its file moves to <state_dir>/functions/unloaded.
class Registry {
 public:
  // Reads every registration under <state_dir>/functions and functions/unloaded (creating the
  // folders). A file that cannot be read is an error: the router must not start with part of
  // its registry missing.
  static Result<Registry> open(const std::string& state_dir);

  const std::map<std::string, FunctionSpec>& functions() const { return functions_; }
  const std::map<std::string, FunctionSpec>& unloaded() const { return unloaded_; }
  // A loaded function's spec, or none.
  const FunctionSpec* find(const std::string& name) const;
  // An unloaded function's spec, or none.
  const FunctionSpec* find_unloaded(const std::string& name) const;

  // Writes the file (atomically: a temporary file renamed over it), then keeps the spec as
  // loaded; an unloaded copy of it is removed.
  Status put(FunctionSpec spec);
  // Moves a loaded function to the unloaded ones. kNotFound when `name` is not loaded.
  Status unload(const std::string& name);

 private:
  explicit Registry(std::string folder) : folder_(std::move(folder)) {}
  std::string path_of(const std::string& name) const;
  std::string unloaded_path_of(const std::string& name) const;

  std::string folder_;
  std::map<std::string, FunctionSpec> functions_;
  std::map<std::string, FunctionSpec> unloaded_;
};

}  // namespace hiber::router
