// What build this is, for metrics (hiber_build_info) and --version-like reports: the project's
// version and the git commit it was configured from ("unknown" outside a git checkout).
#pragma once

#include <string>

namespace hiber {

const std::string& build_version();
const std::string& build_commit();

}  // namespace hiber
