// Secret tokens kept in files: hiberd's auth and control tokens and the router's worker token.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace hiber {

// Reads the token at `path`, or creates it (32 random bytes as hex, mode 0600) if the file does
// not exist. kNotPermitted if the file is readable by others than its owner: a token anybody can
// read protects nothing.
Result<std::string> load_or_create_token(const std::string& path);

// `bytes` random bytes from the kernel's CSPRNG (getrandom), as lower-case hex: tokens and ids
// nobody can guess (the router's asynchronous invocation ids).
Result<std::string> random_hex(size_t bytes);

// Compares a presented token `a` with the secret `b` in time that depends only on b's length.
bool tokens_equal(std::string_view a, std::string_view b);

}  // namespace hiber
