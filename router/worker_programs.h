// The programs an operator lets the router start as workers (--worker_programs,
// docs/router.md, "Who may call what"): a registration over HTTP names one of them as its
// command's program, with arguments of its own; anything else is refused. The router never
// runs a program a caller chose.
//
// Thread safety: immutable after create().
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace hiber::router {

class WorkerPrograms {
 public:
  // Each entry must name an existing executable file; kept as its canonical absolute path
  // (symbolic links resolved). kInvalidValue, naming the entry, otherwise. No entries: the
  // router starts no worker (functions must be external).
  static Result<WorkerPrograms> create(const std::vector<std::string>& programs);
  // "a,b,c" split at commas, empty entries dropped.
  static Result<WorkerPrograms> parse(std::string_view comma_separated);

  // The path to execute for a registration's command[0]: a path (with a '/', relative to the
  // router's working directory), or a name searched in the router's PATH as execvp would,
  // resolved to its canonical path. kFileNotFound when no such executable exists; kNotPermitted
  // when it is not one of the allowed programs.
  Result<std::string> resolve(std::string_view program) const;

  const std::vector<std::string>& programs() const { return programs_; }

 private:
  std::vector<std::string> programs_;  // canonical absolute paths
};

// A registration may not set the variables glibc ignores for set-user-ID programs (LD_* and the
// others its dynamic loader and resolver read, ld.so(8) "secure-execution mode"): with them an
// allowed program would load code the caller chose. kInvalidValue naming the first one.
Status check_worker_environment(const std::map<std::string, std::string>& env);

}  // namespace hiber::router
