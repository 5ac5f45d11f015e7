#!/usr/bin/env bash
# hiber-router's added latency and throughput (docs/perf.md "router"): starts hiberd with the
# simulated GPU and hiber-router in front of it, and registers N copies of the no-op worker
# (router/hiber-echo-worker) twice: gpu-0..gpu-N-1 with "shim": true (each invocation goes through
# hiberd: requestBegin, requestDone; the worker's session opens through the
# preloaded libhibercuda.so) and cpu-0..cpu-N-1 with "shim": false (the router alone). Then, in
# one run:
#   - the direct control round trip the router makes per invocation, the baseline
#     (bench/control_roundtrip_bench against the same hiberd, 1, 2 and N clients: begin, what the
#     router makes, and invoke, the three calls of a hiberd before protocol 1.13; and ping);
#   - latency in rounds: the direct round trip with one client, then wrk against the router
#     (bench/router_invoke.lua) with one connection (-t1 -c1) on gpu-0 and on cpu-0;
#   - throughput with keep-alive connections (wrk -tT -cC) spread over the N functions of each
#     kind, and over gpu-0 alone (hiberd runs one request of a function at a time).
# Prints each figure, the router's added p50/p99 (the median over the rounds of the router's
# minus the direct round trip's, one client each), the GPU function's latency as a multiple of
# the CPU function's (the median over the rounds of their ratio) and invocations/s.
#
#   scripts/router-bench.sh [-B BUILD_DIR] [--no-build] [-d SECONDS] [-r ROUNDS] [-n FUNCTIONS]
#                           [-t THREADS] [-c CONNECTIONS] [--cpu_load=N] [--cpu_load_kind=KIND]
#
#   -B BUILD_DIR   a Release build tree (default build/release; configured if it has no cache)
#   --no-build     use the binaries as they are
#   -d SECONDS     each throughput run's length (default 10)
#   -r ROUNDS      latency rounds (default 5), each 4,000 direct round trips and 2 s of wrk on
#                  gpu-0 and on cpu-0; the figures are the medians over the rounds
#   -n FUNCTIONS   functions of each kind for the throughput runs (default 8)
#   -t THREADS, -c CONNECTIONS   wrk's threads and connections for the throughput runs
#                  (default 2 and 16)
#   --cpu_load=N   N load processes run during the measurements (default 0; scripts/cpu-load.sh)
#   --cpu_load_kind=KIND   spin (busy all the time) or wake (2 ms busy, 1 ms asleep; default)
# Environment: HIBERD_FLAGS, ROUTER_FLAGS add flags to hiberd and hiber-router; BODY is the
# request body (default "ping").
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/release
do_build=1
seconds=10
rounds=5
round_seconds=2
functions=8
threads=2
connections=16
cpu_load=0
cpu_load_kind=wake
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -d) seconds=$2; shift 2 ;;
    -n) functions=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -c) connections=$2; shift 2 ;;
    --cpu_load=*) cpu_load=${1#*=}; shift ;;
    --cpu_load_kind=*) cpu_load_kind=${1#*=}; shift ;;
    *)
      echo "usage: $0 [-B BUILD_DIR] [--no-build] [-d SECONDS] [-r ROUNDS] [-n FUNCTIONS]" \
        "[-t THREADS] [-c CONNECTIONS] [--cpu_load=N] [--cpu_load_kind=spin|wake]" >&2
      exit 2
      ;;
  esac
done
[[ $cpu_load =~ ^[0-9]+$ ]] || { echo "--cpu_load takes a count, not '$cpu_load'" >&2; exit 2; }
# shellcheck source=scripts/cpu-load.sh
source scripts/cpu-load.sh

if [[ $do_build == 1 ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$build" -j2 --target hiberd hiber-router hiber-echo-worker control_roundtrip_bench \
    hibercuda
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ $build_type != Release ]]; then
  echo "warning: $build is a '$build_type' build; figures from it mean nothing" >&2
fi

hiberd_bin=$build/server/hiberd
router_bin=$build/router/hiber-router
echo_bin=$(realpath -m "$build/router/hiber-echo-worker")
roundtrip_bin=$build/bench/control_roundtrip_bench
shim_bin=$build/client_shim/libhibercuda.so  # hiber-router preloads ../client_shim's libraries
for f in "$hiberd_bin" "$router_bin" "$echo_bin" "$roundtrip_bin" "$shim_bin"; do
  [[ -x $f ]] || { echo "missing $f (build the targets, or drop --no-build)" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl is not installed" >&2; exit 1; }
command -v bc >/dev/null || { echo "bc is not installed" >&2; exit 1; }

work=$(mktemp -d /tmp/hiber-router-bench-XXXXXX)  # mode 0700, as hiberd's run dir must be
pids=()
cleanup() {
  stop_cpu_load
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

root_flag=()
if [[ $(id -u) == 0 ]]; then root_flag=(--allow_root); fi
# shellcheck disable=SC2086  # ROUTER_FLAGS is a list of flags
"$router_bin" --listen=127.0.0.1:0 --port_file="$work/port" --run_dir="$run_dir" \
  --state_dir="$work/state" --worker_programs="$echo_bin" "${root_flag[@]}" ${ROUTER_FLAGS:-} \
  2>"$work/router.log" &
pids+=($!)
wait_for "[[ -s $work/port ]]" hiber-router "${pids[-1]}" "$work/router.log"
url=http://127.0.0.1:$(cat "$work/port")
wait_for "curl -sf $url/v2/health/ready >/dev/null" "hiber-router (ready)" "${pids[-1]}" \
  "$work/router.log"

body=${BODY:-ping}
# register NAME SHIM: registers the echo worker as NAME, and invokes it once (untimed: the
# worker starts on demand).
register() {
  local registration="{\"command\": [\"$echo_bin\"], \"shim\": $2, \"slo_ms\": 1000,"
  registration+=" \"concurrency\": 1, \"max_instances\": 1}"
  curl -sf -X POST -H 'Content-Type: application/json' -d "$registration" \
    -H "Authorization: Bearer $(cat "$work/state/operator-token")" \
    "$url/v2/repository/models/$1/load" >/dev/null ||
    { echo "registering $1 failed:" >&2; tail -20 "$work/router.log" >&2; exit 1; }
  curl -sf -X POST -H 'Content-Type: application/octet-stream' --data-binary "$body" \
    "$url/v2/models/$1/infer" >/dev/null ||
    { echo "the first invocation of $1 failed:" >&2; tail -20 "$work/router.log" >&2; exit 1; }
}
gpu_functions="" cpu_functions=""
for ((i = 0; i < functions; i++)); do
  register "gpu-$i" true
  register "cpu-$i" false
  gpu_functions+="${gpu_functions:+,}gpu-$i"
  cpu_functions+="${cpu_functions:+,}cpu-$i"
done
# A shim worker whose session hiberd does not know would make the GPU runs mean nothing.
curl -sf -D - -o /dev/null -X POST --data-binary "$body" "$url/v2/models/gpu-0/infer" |
  grep -qi '^X-Hiber-Gpu:' ||
  { echo "gpu-0's answer has no X-Hiber-Gpu: it did not go through hiberd" >&2; exit 1; }

# cpu_jiffies: the machine's busy time so far, in clock ticks (all CPUs).
cpu_jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
# our_jiffies: the CPU time of hiberd, hiber-router and its workers, and of this script's
# finished children (wrk, control_roundtrip_bench), in clock ticks.
our_jiffies() {
  local total=0 pid
  for pid in "${pids[@]}" $(pgrep -f "^$echo_bin" || true); do
    [[ -r /proc/$pid/stat ]] || continue
    total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
  done
  local children
  children=$(times | tail -1)  # "XmY.YYYs XmY.YYYs": user and system time of waited children
  awk -v ours="$total" -v c="$children" -v hz="$(getconf CLK_TCK)" 'BEGIN {
    split(c, t, " "); s = 0
    for (i = 1; i <= 2; i++) { split(t[i], m, "m"); sub("s", "", m[2]); s += m[1] * 60 + m[2] }
    printf "%d\n", ours + s * hz }'
}
start_cpu_load "$cpu_load" "$cpu_load_kind"
machine_start=$(cpu_jiffies)
ours_start=$(our_jiffies)
start_time=$(date +%s.%N)

results=$work/results
echo "== machine: $(nproc) CPUs; load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== direct control round trip (control_roundtrip_bench, same hiberd)"
"$roundtrip_bin" --run_dir="$run_dir" --clients="1,2,$functions" --label=direct 2>&1 |
  tee -a "$results" | grep -v '^RESULT'
# wrk_run LABEL FUNCTIONS THREADS CONNECTIONS SECONDS
wrk_run() {
  HIBER_FUNCTIONS=$2 HIBER_BODY=$body HIBER_LABEL=$1 \
    wrk -t"$3" -c"$4" -d"$5s" -s bench/router_invoke.lua "$url" >>"$results"
}
# value LABEL NAME: a RESULT line's value.
value() {
  sed -n "s/^RESULT label=$1 name=$2 value=\([0-9.e+-]*\) .*/\1/p" "$results" | tail -1
}

# Latency: the baseline and the router one after the other, in short rounds, so that a change in
# what else runs on the machine hits both alike; the figures are the medians over the rounds.
echo "== latency, one client at a time: $rounds rounds of direct (4,000 round trips), then wrk" \
  "-t1 -c1 -d${round_seconds}s on gpu-0 and on cpu-0"
printf "%-6s %12s %12s %12s %12s %12s %12s\n" round direct_p50 gpu_p50 cpu_p50 direct_p99 \
  gpu_p99 cpu_p99
for ((r = 1; r <= rounds; r++)); do
  "$roundtrip_bin" --run_dir="$run_dir" --mode=begin,invoke --clients=1 --iterations=4000 \
    --warmup=200 --function_prefix="round$r-" --label="direct_r$r" >>"$results" 2>/dev/null
  wrk_run "gpu_c1_r$r" gpu-0 1 1 "$round_seconds"
  wrk_run "cpu_c1_r$r" cpu-0 1 1 "$round_seconds"
  printf "%-6s %12s %12s %12s %12s %12s %12s\n" "$r" "$(value "direct_r$r" begin_c1_p50)" \
    "$(value "gpu_c1_r$r" router_p50)" "$(value "cpu_c1_r$r" router_p50)" \
    "$(value "direct_r$r" begin_c1_p99)" "$(value "gpu_c1_r$r" router_p99)" \
    "$(value "cpu_c1_r$r" router_p99)"
done
echo "== throughput, keep-alive: wrk -t$threads -c$connections -d${seconds}s"
wrk_run gpu_many "$gpu_functions" "$threads" "$connections" "$seconds"
wrk_run cpu_many "$cpu_functions" "$threads" "$connections" "$seconds"
wrk_run gpu_one gpu-0 "$threads" "$connections" "$seconds"

# median LABEL_PREFIX NAME: the median of NAME over the rounds' LABEL_PREFIX<r> lines.
median() {
  for ((r = 1; r <= rounds; r++)); do value "$1$r" "$2"; done | sort -g |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# median_added NAME: the median over the rounds of gpu_c1's NAME minus direct's.
median_added() {
  for ((r = 1; r <= rounds; r++)); do
    echo "$(value "gpu_c1_r$r" "router_$1") - $(value "direct_r$r" "begin_c1_$1")" | bc
  done | sort -g |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# median_ratio NAME: the median over the rounds of gpu_c1's NAME over cpu_c1's.
median_ratio() {
  for ((r = 1; r <= rounds; r++)); do
    echo "scale=4; $(value "gpu_c1_r$r" "router_$1") / $(value "cpu_c1_r$r" "router_$1")" | bc
  done | sort -g |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
errors=0
for label in gpu_many cpu_many gpu_one; do
  errors=$((errors + $(value "$label" router_errors | cut -d. -f1)))
done
for ((r = 1; r <= rounds; r++)); do
  for label in gpu_c1_r$r cpu_c1_r$r; do
    errors=$((errors + $(value "$label" router_errors | cut -d. -f1)))
  done
done
stop_cpu_load
others=$(awk -v m="$(( $(cpu_jiffies) - machine_start ))" -v o="$(( $(our_jiffies) - ours_start ))" \
  -v t="$(echo "$(date +%s.%N) - $start_time" | bc)" -v hz="$(getconf CLK_TCK)" \
  'BEGIN { printf "%.2f", (m - o) / hz / t }')
echo
echo "== summary (load average after: $(cut -d' ' -f1-3 /proc/loadavg); other processes used" \
  "$others CPUs on average during the run)"
awk -v dp50="$(median direct_r begin_c1_p50)" -v dp99="$(median direct_r begin_c1_p99)" \
    -v ip50="$(median direct_r invoke_c1_p50)" -v ip99="$(median direct_r invoke_c1_p99)" \
    -v ratio="$(median_ratio p50)" \
    -v pp50="$(value direct ping_c1_p50)" \
    -v drate="$(value direct begin_c1_rate)" -v drateN="$(value direct "begin_c${functions}_rate")" \
    -v gp50="$(median gpu_c1_r router_p50)" -v gp99="$(median gpu_c1_r router_p99)" \
    -v cp50="$(median cpu_c1_r router_p50)" -v cp99="$(median cpu_c1_r router_p99)" \
    -v g1="$(median gpu_c1_r router_rate)" -v c1="$(median cpu_c1_r router_rate)" \
    -v ap50="$(median_added p50)" -v ap99="$(median_added p99)" \
    -v gN="$(value gpu_many router_rate)" -v cN="$(value cpu_many router_rate)" \
    -v gone="$(value gpu_one router_rate)" -v n="$functions" -v conns="$connections" \
    -v errors="$errors" -v rounds="$rounds" 'BEGIN {
  printf "medians over %d rounds:\n", rounds
  printf "direct requestBegin+Done (1 client):   p50 %8.1f us  p99 %8.1f us\n", dp50, dp99
  printf "direct Arrived+Start+Done (1 client):  p50 %8.1f us  p99 %8.1f us   (before 1.13)\n", ip50, ip99
  printf "router, shim:true, 1 connection:       p50 %8.1f us  p99 %8.1f us  %8.0f /s\n", gp50, gp99, g1
  printf "router, shim:false, 1 connection:      p50 %8.1f us  p99 %8.1f us  %8.0f /s\n", cp50, cp99, c1
  printf "router added, shim:true (- direct):    p50 %8.1f us  p99 %8.1f us\n", ap50, ap99
  printf "shim:true over shim:false, p50:        %8.2fx\n", ratio
  printf "one run each:\n"
  printf "direct control ping (1 client):        p50 %8.1f us\n", pp50
  printf "direct requestBegin+Done, 1 client:                                 %8.0f /s\n", drate
  printf "direct requestBegin+Done, %d clients:                                %8.0f /s\n", n, drateN
  printf "router, shim:true, %d functions, %d connections:                  %8.0f /s\n", n, conns, gN
  printf "router, shim:false, %d functions, %d connections:                 %8.0f /s\n", n, conns, cN
  printf "router, shim:true, 1 function, %d connections:                     %8.0f /s\n", conns, gone
  if (errors > 0) printf "warning: %d failed invocations (wrk errors); the figures include them\n", errors
}'
