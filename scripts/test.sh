#!/usr/bin/env bash
# Builds and runs Hiber's whole test suite:
#   1. Debug with AddressSanitizer + UndefinedBehaviorSanitizer: every test (unit, integration,
#      and gpu, which skip with a one-line reason where there is no GPU);
#   2. ThreadSanitizer: the threaded parts (wire, device, server) again, unit and integration;
#   3. the libFuzzer harnesses (clang-14, tests/fuzz), each for a fixed number of runs from its
#      seed corpus (scripts/fuzz.sh runs them long);
#   4. release: the node under podman (label containers, tests/containers), which builds the
#      base roots and images from scratch in a podman storage of its own, removed at the end
#      (nothing of an earlier run is reused), and skips with one line where podman cannot run
#      containers (docs/deploy.md).
# Any failure, sanitizer report or leak fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp

echo "== ASan + UBSan build"
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"

echo "== ThreadSanitizer build"
cmake --preset tsan
cmake --build --preset tsan -j "$jobs"
ctest --preset tsan -j "$jobs" -L 'unit|integration'

echo "== libFuzzer harnesses (fixed runs from the seed corpora)"
if ! command -v clang++-14 >/dev/null; then
  echo "test.sh: clang++-14 is missing; scripts/install-deps.sh installs clang-14 and libfuzzer-14-dev" >&2
  exit 1
fi
cmake --preset fuzz
cmake --build --preset fuzz -j "$jobs"
ctest --preset fuzz -j "$jobs"

echo "== The node under podman (release build; label containers)"
containers/build.sh --build_only
ctest --preset release -L containers
