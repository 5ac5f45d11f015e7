#!/usr/bin/env bash
# Builds the libFuzzer harnesses (the fuzz preset: clang-14, ASan + UBSan) and runs each long,
# one after another, from its seed corpus (tests/fuzz/corpus/<harness>). New inputs go to a
# scratch corpus outside the repository; crashes, leaks and timeouts are saved there too.
#
# Usage: scripts/fuzz.sh [RUNS|Ns] [HARNESS...]
#   RUNS   executions per harness (default 10000000); "600s" runs each for 600 seconds instead
#   HARNESS  handshake call_batch control_request fatbin node_config (default: all)
# Environment:
#   FUZZ_JOBS     parallel fuzzing jobs per harness (libFuzzer -jobs/-workers; default 1);
#                 RUNS and the time then apply to each job
#   FUZZ_WORKDIR  scratch corpora and findings (default ${TMPDIR:-/tmp}/hiber-fuzz)
#   FUZZ_ARGS     more libFuzzer flags
# Exits non-zero if any harness found something; prints executions and findings per harness.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."

all=(handshake call_batch control_request fatbin node_config)
budget=${1:-10000000}
shift || true
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
jobs=${FUZZ_JOBS:-1}
workdir=${FUZZ_WORKDIR:-${TMPDIR:-/tmp}/hiber-fuzz}

if ! command -v clang++-14 >/dev/null; then
  echo "fuzz: clang++-14 is missing; run scripts/install-deps.sh (clang-14, libfuzzer-14-dev)" >&2
  exit 1
fi
if [[ $budget =~ ^([0-9]+)s$ ]]; then
  limit=(-max_total_time="${BASH_REMATCH[1]}")
elif [[ $budget =~ ^[0-9]+$ ]]; then
  limit=(-runs="$budget")
else
  echo "fuzz: '$budget' is neither a number of runs nor a time like 600s" >&2
  exit 2
fi
# FUZZ_ARGS holds several flags separated by spaces.
read -ra fuzz_args <<<"${FUZZ_ARGS:-}"
for h in "${harnesses[@]}"; do
  [[ -d tests/fuzz/corpus/$h ]] || { echo "fuzz: no harness '$h' (one of: ${all[*]})" >&2; exit 2; }
done

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

failed=0
summary=()
for h in "${harnesses[@]}"; do
  scratch="$workdir/$h/corpus"
  findings="$workdir/$h/findings"
  log="$workdir/$h/fuzz.log"
  mkdir -p "$scratch" "$findings"
  rm -f "$workdir/$h"/fuzz-*.log
  echo "== fuzz_$h: ${limit[*]}, $jobs job(s); corpus $scratch; log $log"
  parallel=()
  if ((jobs > 1)); then parallel=(-jobs="$jobs" -workers="$jobs"); fi
  rc=0
  (cd "$workdir/$h" &&
    "$OLDPWD/build/fuzz/tests/fuzz/fuzz_$h" "${limit[@]}" "${parallel[@]}" -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$findings/" "${fuzz_args[@]}" \
      "$scratch" "$OLDPWD/tests/fuzz/corpus/$h") >"$log" 2>&1 || rc=$?
  # With -jobs each job's stats are in its own fuzz-N.log (and -runs applies per job).
  logs=("$workdir/$h"/fuzz-*.log)
  ((${#logs[@]})) || logs=("$log")
  execs=$(awk '/stat::number_of_executed_units/ {s += $NF} END {print s + 0}' "${logs[@]}")
  found=$(find "$findings" -type f | wc -l)
  summary+=("$(printf '%-16s %12s executions  %s finding(s)  exit %s' "$h" "$execs" "$found" "$rc")")
  if ((rc != 0 || found > 0)); then
    failed=1
    echo "fuzz_$h: FOUND something (exit $rc); inputs in $findings; see $log" >&2
  fi
done
echo "== summary (${limit[*]})"
printf '%s\n' "${summary[@]}"
exit "$failed"
