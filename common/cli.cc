#include "common/cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/build_info.h"

// Defined by gflags itself.
DECLARE_bool(help);
DECLARE_bool(helpshort);

namespace hiber {

void init_program(int* argc, char*** argv, const char* usage, const char* flags_file) {
  gflags::SetUsageMessage(usage);
  // One project version, printed the same by every program (--version).
  gflags::SetVersionString(build_version() + " (commit " + build_commit() + ")");
  FLAGS_logtostderr = true;
  gflags::ParseCommandLineNonHelpFlags(argc, argv, /*remove_flags=*/true);
  if (FLAGS_help || FLAGS_helpshort) {
    std::printf("%s\n\nFlags:\n", usage);
    std::vector<gflags::CommandLineFlagInfo> flags;
    gflags::GetAllFlags(&flags);
    const std::string ours(flags_file);
    for (const auto& flag : flags) {
      if (flag.filename == ours) std::printf("%s", gflags::DescribeOneFlag(flag).c_str());
    }
    std::printf("\nLogging: --v=N for verbose logs; --helpfull lists every flag.\n");
    std::exit(0);
  }
  gflags::HandleCommandLineHelpFlags();  // --helpfull, --version and friends
  google::InitGoogleLogging((*argv)[0]);
}

}  // namespace hiber
