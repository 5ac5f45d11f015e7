#include "router/worker_programs.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "common/split.h"

namespace hiber::router {
namespace {

namespace fs = std::filesystem;

// The canonical path of an executable regular file, or none.
std::optional<std::string> executable(const fs::path& path) {
  std::error_code ec;
  const fs::path canonical = fs::canonical(path, ec);
  if (ec || !fs::is_regular_file(canonical, ec) || ::access(canonical.c_str(), X_OK) != 0) {
    return std::nullopt;
  }
  return canonical.string();
}

}  // namespace

Result<WorkerPrograms> WorkerPrograms::create(const std::vector<std::string>& programs) {
  WorkerPrograms out;
  for (const std::string& program : programs) {
    std::optional<std::string> path = executable(program);
    if (!path) {
      return error(ErrorCode::kInvalidValue, "--worker_programs: \"", program,
                   "\" is not an executable file");
    }
    out.programs_.push_back(std::move(*path));
  }
  return out;
}

Result<WorkerPrograms> WorkerPrograms::parse(std::string_view comma_separated) {
  std::vector<std::string> programs;
  for (std::string_view program : split_nonempty(comma_separated, ",")) {
    programs.emplace_back(program);
  }
  return create(programs);
}

Result<std::string> WorkerPrograms::resolve(std::string_view program) const {
  if (program.empty()) return error(ErrorCode::kInvalidValue, "the program is empty");
  std::optional<std::string> path;
  if (program.find('/') != std::string_view::npos) {
    path = executable(fs::path(program));
  } else {
    const char* search = std::getenv("PATH");
    const std::string_view dirs = search != nullptr ? search : "/usr/local/bin:/usr/bin:/bin";
    size_t start = 0;
    while (!path && start <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const std::string_view dir = dirs.substr(start, end - start);
      path = executable(fs::path(dir.empty() ? "." : dir) / program);
      start = end + 1;
    }
  }
  if (!path) {
    return error(ErrorCode::kFileNotFound, "no executable program \"", program, "\"");
  }
  for (const std::string& allowed : programs_) {
    if (*path == allowed) return *path;
  }
  return error(ErrorCode::kNotPermitted, "the program \"", program, "\" (", *path,
               ") is not one the operator allows (hiber-router --worker_programs",
               programs_.empty() ? " is empty: functions must be external" : "", ")");
}

Status check_worker_environment(const std::map<std::string, std::string>& env) {
  // glibc's UNSECURE_ENVVARS (sysdeps/generic/unsecvars.h; the MALLOC_ ones of older glibc
  // included), and every LD_ variable.
  static const char* const kRefused[] = {"GCONV_PATH",
                                         "GETCONF_DIR",
                                         "HOSTALIASES",
                                         "LOCALDOMAIN",
                                         "LOCPATH",
                                         "MALLOC_ARENA_MAX",
                                         "MALLOC_ARENA_TEST",
                                         "MALLOC_PERTURB_",
                                         "MALLOC_TRACE",
                                         "MALLOC_TOP_PAD_",
                                         "MALLOC_MMAP_MAX_",
                                         "MALLOC_MMAP_THRESHOLD_",
                                         "MALLOC_TRIM_THRESHOLD_",
                                         "NIS_PATH",
                                         "NLSPATH",
                                         "RESOLV_HOST_CONF",
                                         "RES_OPTIONS",
                                         "TMPDIR",
                                         "TZDIR",
                                         "GLIBC_TUNABLES"};
  for (const auto& [name, value] : env) {
    bool refused = name.rfind("LD_", 0) == 0;
    for (const char* r : kRefused) refused |= name == r;
    if (refused) {
      return error(ErrorCode::kInvalidValue, "registration field \"env\": \"", name,
                   "\" may not be set (the dynamic loader or libc reads it before the program "
                   "runs)");
    }
  }
  return Status();
}

}  // namespace hiber::router
