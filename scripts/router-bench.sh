#!/usr/bin/env bash
# hiber-router's added latency (docs/perf.md "router"): starts hiberd with the simulated GPU and
# hiber-router in front of it, registers `echo` (the no-op worker router/hiber-echo-worker),
# measures the direct control round trip the router makes per invocation
# (bench/control_roundtrip_bench against the same hiberd), then wrk against the router
# (bench/router_invoke.lua): a throughput run (-t2 -c16) and a latency run (-t1 -c1). Prints
# each figure and the router's added p50/p99 (router's minus the direct round trip's, one
# client each) and invocations/s.
#
#   scripts/router-bench.sh [-B BUILD_DIR] [--no-build] [-d SECONDS]
#
#   -B BUILD_DIR   a Release build tree (default build/release; configured if it has no cache)
#   --no-build     use the binaries as they are
#   -d SECONDS     each wrk run's length (default 10)
# Environment: HIBERD_FLAGS, ROUTER_FLAGS add flags to hiberd and hiber-router; ECHO_REGISTRATION
# replaces echo's registration JSON (docs/router.md); BODY is the request body (default "ping").
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/release
do_build=1
seconds=10
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -d) seconds=$2; shift 2 ;;
    *) echo "usage: $0 [-B BUILD_DIR] [--no-build] [-d SECONDS]" >&2; exit 2 ;;
  esac
done

if [[ $do_build == 1 ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$build" -j2 --target hiberd hiber-router hiber-echo-worker control_roundtrip_bench
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ $build_type != Release ]]; then
  echo "warning: $build is a '$build_type' build; figures from it mean nothing" >&2
fi

hiberd_bin=$build/server/hiberd
router_bin=$build/router/hiber-router
echo_bin=$(realpath -m "$build/router/hiber-echo-worker")
roundtrip_bin=$build/bench/control_roundtrip_bench
for f in "$hiberd_bin" "$router_bin" "$echo_bin" "$roundtrip_bin"; do
  [[ -x $f ]] || { echo "missing $f (build the targets, or drop --no-build)" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl is not installed" >&2; exit 1; }

work=$(mktemp -d /tmp/hiber-router-bench-XXXXXX)  # mode 0700, as hiberd's run dir must be
pids=()
cleanup() {
  # The router first (it stops its workers), then hiberd.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# wait_for TEST WHAT PID LOG: polls `test` for 10 s while PID lives.
wait_for() {
  for _ in $(seq 200); do
    eval "$1" && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.05
  done
  echo "$2 did not start:" >&2
  cat "$4" >&2
  exit 1
}

run_dir=$work/run
mkdir -m 700 "$run_dir"
# shellcheck disable=SC2086  # HIBERD_FLAGS is a list of flags
"$hiberd_bin" --device=sim --run_dir="$run_dir" ${HIBERD_FLAGS:-} 2>"$work/hiberd.log" &
pids+=($!)
wait_for "[[ -S $run_dir/control.sock ]]" hiberd "${pids[-1]}" "$work/hiberd.log"

# shellcheck disable=SC2086  # ROUTER_FLAGS is a list of flags
"$router_bin" --listen=127.0.0.1:0 --port_file="$work/port" --run_dir="$run_dir" \
  --state_dir="$work/state" ${ROUTER_FLAGS:-} 2>"$work/router.log" &
pids+=($!)
wait_for "[[ -s $work/port ]]" hiber-router "${pids[-1]}" "$work/router.log"
url=http://127.0.0.1:$(cat "$work/port")
wait_for "curl -sf $url/v2/health/ready >/dev/null" "hiber-router (ready)" "${pids[-1]}" \
  "$work/router.log"

registration=${ECHO_REGISTRATION:-"{\"command\": [\"$echo_bin\"], \"shim\": false, \"slo_ms\": 1000, \"concurrency\": 1, \"max_instances\": 1}"}
curl -sf -X POST -H 'Content-Type: application/json' -d "$registration" \
  "$url/v2/repository/models/echo/load" >/dev/null ||
  { echo "registering echo failed:" >&2; tail -20 "$work/router.log" >&2; exit 1; }
# One untimed invocation: the worker starts on demand.
curl -sf -X POST -H 'Content-Type: application/octet-stream' --data-binary "${BODY:-ping}" \
  "$url/v2/models/echo/infer" >/dev/null ||
  { echo "the first echo invocation failed:" >&2; tail -20 "$work/router.log" >&2; exit 1; }

results=$work/results
echo "== direct control round trip (control_roundtrip_bench, same hiberd)"
"$roundtrip_bin" --run_dir="$run_dir" --clients=1,2 --label=direct | tee -a "$results"
echo "== wrk against hiber-router: throughput (-t2 -c16 -d${seconds}s)"
HIBER_FUNCTION=echo HIBER_BODY=${BODY:-ping} HIBER_LABEL=router_c16 \
  wrk -t2 -c16 -d"${seconds}s" -s bench/router_invoke.lua "$url" | tee -a "$results"
echo "== wrk against hiber-router: latency (-t1 -c1 -d${seconds}s)"
HIBER_FUNCTION=echo HIBER_BODY=${BODY:-ping} HIBER_LABEL=router_c1 \
  wrk -t1 -c1 -d"${seconds}s" -s bench/router_invoke.lua "$url" | tee -a "$results"

# value LABEL NAME: a RESULT line's value.
value() {
  sed -n "s/^RESULT label=$1 name=$2 value=\([0-9.e+-]*\) .*/\1/p" "$results" | tail -1
}
direct_p50=$(value direct invoke_c1_p50)
direct_p99=$(value direct invoke_c1_p99)
router_p50=$(value router_c1 router_p50)
router_p99=$(value router_c1 router_p99)
echo
echo "== summary"
awk -v dp50="$direct_p50" -v dp99="$direct_p99" -v rp50="$router_p50" -v rp99="$router_p99" \
    -v drate="$(value direct invoke_c1_rate)" -v drate2="$(value direct invoke_c2_rate)" \
    -v r1="$(value router_c1 router_rate)" -v r16="$(value router_c16 router_rate)" \
    -v e1="$(value router_c1 router_errors)" -v e16="$(value router_c16 router_errors)" 'BEGIN {
  printf "direct control round trip (1 client): p50 %8.1f us  p99 %8.1f us  %8.0f invocations/s\n", dp50, dp99, drate
  printf "direct control round trip (2 clients):                              %8.0f invocations/s\n", drate2
  printf "hiber-router, echo, 1 connection:     p50 %8.1f us  p99 %8.1f us  %8.0f invocations/s\n", rp50, rp99, r1
  printf "hiber-router, echo, 16 connections:                                 %8.0f invocations/s\n", r16
  printf "router added (1 connection - direct): p50 %8.1f us  p99 %8.1f us\n", rp50 - dp50, rp99 - dp99
  if (e1 + e16 > 0) printf "warning: %d failed invocations (wrk errors); the figures include them\n", e1 + e16
}'
