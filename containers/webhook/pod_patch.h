// What hiber-inject changes in a function's Pod (docs/deploy.md, "The admission webhook"): the
// shim, run dir and token volumes mounted in every container, the environment that points the
// shim and the function SDK at them, and no `nvidia.com/gpu` request (only hiberd holds GPUs).
// Pure: a Pod in, an RFC 6902 JSON Patch out; no I/O.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace hiber::inject {

// Pods opt in with this label set to "true" and name their function with the second.
inline constexpr char kInjectLabel[] = "hiber.io/inject";
inline constexpr char kFunctionLabel[] = "hiber.io/function";
// The resource removed from every container: hiberd alone claims the node's GPUs.
inline constexpr char kGpuResource[] = "nvidia.com/gpu";

// Where things are on the node and in the pod; the defaults are hiber-inject's flags' defaults.
struct InjectConfig {
  std::string shim_host_path = "/var/lib/hiber/shim";
  std::string shim_mount_path = "/opt/hiber/shim";
  // The libraries preloaded from the shim folder, in LD_PRELOAD order (router's --shim_preload).
  std::vector<std::string> shim_libraries = {"libhibercuda.so", "libhibercublas.so",
                                             "libhibercublasLt.so", "libhibercudnn.so",
                                             "libhibernvml.so"};
  std::string run_dir_host_path = "/run/hiber";
  std::string run_dir_mount_path = "/run/hiber";
  std::string token_secret = "hiber-function-token";
  std::string token_secret_key = "auth-token";
  std::string router_worker_address = "tcp:hiber-router.hiber-system.svc:7071";
  std::string worker_token_secret = "hiber-worker-token";
  std::string worker_token_secret_key = "worker-token";
};

// kInvalidValue naming the field when a path is not absolute, a name is empty or not a valid
// Kubernetes name, and so on: hiber-inject refuses to start with it.
Status check_config(const InjectConfig& config);

// The Secrets are mounted here (one folder each, holding only their key).
inline constexpr char kTokenMountPath[] = "/var/run/secrets/hiber.io/function-token";
inline constexpr char kWorkerTokenMountPath[] = "/var/run/secrets/hiber.io/worker-token";

struct PodPatch {
  bool opted_in = false;              // the pod has hiber.io/inject: "true"
  std::string function_id;            // its hiber.io/function label, when opted in
  nlohmann::json patch;               // a JSON Patch (an array); empty when nothing changes
  std::vector<std::string> warnings;  // for the API server to show the user (GPU requests removed)
};

// The patch that injects `pod` (a Pod object as the API server sends it). Applying it again to the
// patched pod yields an empty patch. kInvalidValue with a message for the pod's owner when the
// pod opts in but cannot be injected: no or an invalid hiber.io/function label, a volume or mount
// of its own under one of hiber-inject's names or paths, an LD_PRELOAD taken from a ConfigMap or
// Secret, or a malformed spec.
Result<PodPatch> patch_pod(const nlohmann::json& pod, const InjectConfig& config);

// A JSON Pointer reference token (RFC 6901): '~' becomes "~0" and '/' becomes "~1".
std::string escape_pointer(std::string_view token);

}  // namespace hiber::inject
