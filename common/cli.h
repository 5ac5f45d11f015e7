// Command-line handling shared by Hiber's programs: gflags parsing, with --help printing the
// program's own flags (not glog's and gflags' dozens) and exiting 0. --helpfull shows them all.
#pragma once

namespace hiber {

// Parses flags, removing them from argv, and initialises logging (to stderr by default).
// `usage` is the text --help prints above the flags; `flags_file` is the source file whose
// flags --help lists (pass __FILE__ from main's file).
void init_program(int* argc, char*** argv, const char* usage, const char* flags_file);

}  // namespace hiber
