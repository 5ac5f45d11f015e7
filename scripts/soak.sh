#!/usr/bin/env bash
# A soak run of a whole simulated node: 200 functions through hiber-router, bursty arrivals,
# worker and hiberd SIGKILLs, hostile clients (scripts/soak.py says what exactly, and what it
# reports; docs/reliability.md records a run). Not part of CI: it runs for --minutes (10).
#
#   scripts/soak.sh [--minutes=10] [--functions=200] [--rate=10] [--report=FILE] ...
#
# Builds the release targets it needs first. Exits 0 when no request was lost or answered
# wrongly and every failure fell inside a kill window.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release --target hiberd hiber-router hiber_test_client hibercuda \
  hibercublas hibercublasLt hibercudnn hibernvml hiber_shim_programs hiber_shim_programs_plugin
exec python3 scripts/soak.py --bin="$PWD/build/release" "$@"
