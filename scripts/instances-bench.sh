#!/usr/bin/env bash
# How one hot GPU function scales with its instances (docs/perf.md, "instances"): starts hiberd
# with the simulated 8-GPU node (nvswitch-8gpu) and hiber-router in front of it, and registers
# the test worker (tests/unit/router_test_worker.cc) as hot-1, hot-2, hot-4 and hot-8, each with
# "shim": true, "concurrency": 1 and max_instances 1, 2, 4 and 8. Every request holds its GPU
# lease for --hold_ms (the worker's handler sleeps, as a kernel of that length would keep the
# GPU: requestArrived, requestStart, the handler, requestDone), so one instance serves at most
# 1000/hold_ms requests per second and N instances, each on a GPU of its own, N times that.
# For each N: a warm-up run that makes the router start the N workers, then wrk with 2N
# connections. Prints each N's invocations/s, its ratio to N times one instance's (the goal:
# >= 0.9 up to the GPU count), and how many instances and GPUs served it.
#
#   scripts/instances-bench.sh [-B BUILD_DIR] [--no-build] [-d SECONDS] [-m HOLD_MS]
#
#   -B BUILD_DIR   a Release build tree (default build/release; configured if it has no cache)
#   --no-build     use the binaries as they are
#   -d SECONDS     each measured run's length (default 10)
#   -m HOLD_MS     how long each request holds its GPU (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/release
do_build=1
seconds=10
hold_ms=50
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -d) seconds=$2; shift 2 ;;
    -m) hold_ms=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *)
      echo "usage: $0 [-B BUILD_DIR] [--no-build] [-d SECONDS] [-m HOLD_MS]" >&2
      exit 2
      ;;
  esac
done

if [[ $do_build == 1 ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$build" -j2 --target hiberd hiber-router hiber_router_test_worker hibercuda \

fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ $build_type != Release ]]; then
  echo "warning: $build is a '$build_type' build; figures from it mean nothing" >&2
fi

hiberd_bin=$build/server/hiberd
router_bin=$build/router/hiber-router
worker_bin=$(realpath -m "$build/tests/unit/hiber_router_test_worker")
shim_bin=$build/client_shim/libhibercuda.so  # hiber-router preloads ../client_shim's libraries
for f in "$hiberd_bin" "$router_bin" "$worker_bin" "$shim_bin"; do
  [[ -x $f ]] || { echo "missing $f (build the targets, or drop --no-build)" >&2; exit 1; }
done
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/hiber-instances-bench-XXXXXX)  # mode 0700, as hiberd's run dir must be
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
"$hiberd_bin" --device=sim --node_config=nvswitch-8gpu --run_dir="$run_dir" \
  2>"$work/hiberd.log" &
pids+=($!)
wait_for "[[ -S $run_dir/control.sock ]]" hiberd "${pids[-1]}" "$work/hiberd.log"

root_flag=()
if [[ $(id -u) == 0 ]]; then root_flag=(--allow_root); fi
"$router_bin" --listen=127.0.0.1:0 --port_file="$work/port" --run_dir="$run_dir" \
  --state_dir="$work/state" --worker_programs="$worker_bin" "${root_flag[@]}" \
  2>"$work/router.log" &
pids+=($!)
wait_for "[[ -s $work/port ]]" hiber-router "${pids[-1]}" "$work/router.log"
url=http://127.0.0.1:$(cat "$work/port")
wait_for "curl -sf $url/v2/health/ready >/dev/null" "hiber-router (ready)" "${pids[-1]}" \
  "$work/router.log"

content_type=application/x-test-hold
# register NAME INSTANCES
register() {
  local registration="{\"command\": [\"$worker_bin\"], \"shim\": true, \"slo_ms\": 60000,"
  registration+=" \"concurrency\": 1, \"max_instances\": $2, \"idle_timeout_s\": 600}"
  curl -sf -X POST -H 'Content-Type: application/json' -d "$registration" \
    -H "Authorization: Bearer $(cat "$work/state/operator-token")" \
    "$url/v2/repository/models/$1/load" >/dev/null ||
    { echo "registering $1 failed:" >&2; tail -20 "$work/router.log" >&2; exit 1; }
}
# wrk_run LABEL FUNCTION CONNECTIONS SECONDS
wrk_run() {
  HIBER_FUNCTION=$2 HIBER_BODY=$hold_ms HIBER_CONTENT_TYPE=$content_type HIBER_LABEL=$1 \
    wrk -t2 -c"$3" -d"$4s" --timeout 30s -s bench/router_invoke.lua "$url" >>"$work/results"
}
# value LABEL NAME: a RESULT line's value.
value() {
  sed -n "s/^RESULT label=$1 name=$2 value=\([0-9.e+-]*\) .*/\1/p" "$work/results" | tail -1
}
# A request that does not go through hiberd would make the figures mean nothing.
register probe 1
curl -sf -D - -o /dev/null -X POST -H "Content-Type: $content_type" --data-binary 1 \
  "$url/v2/models/probe/infer" | grep -qi '^X-Hiber-Gpu:' ||
  { echo "probe's answer has no X-Hiber-Gpu: it did not go through hiberd" >&2; exit 1; }

echo "== machine: $(nproc) CPUs; load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== each request holds its GPU ${hold_ms} ms; wrk -t2 -c(2N) -d${seconds}s per N, after a" \
  "3 s warm-up that starts the N workers"
printf "%-10s %12s %12s %12s %10s %8s %10s\n" instances "requests/s" "ideal/s" "vs N x one" \
  "p50_ms" "workers" "GPUs"
one=""
for n in 1 2 4 8; do
  register "hot-$n" "$n"
  wrk_run "warm_$n" "hot-$n" $((2 * n)) 3
  wrk_run "hot_$n" "hot-$n" $((2 * n)) "$seconds"
  rate=$(value "hot_$n" router_rate)
  p50=$(value "hot_$n" router_p50)
  [[ -n $one ]] || one=$rate
  workers=$(curl -sf "$url/v2/status" | python3 -c \
    "import json, sys; print([f['instances'] for f in json.load(sys.stdin)['functions'] if f['name'] == 'hot-$n'][0])")
  # The GPUs N requests at once ran on, from their answers' X-Hiber-Gpu.
  curls=()
  for ((i = 0; i < n; i++)); do
    curl -sf -D "$work/headers-$n-$i" -o /dev/null -X POST -H "Content-Type: $content_type" \
      --data-binary "$hold_ms" "$url/v2/models/hot-$n/infer" &
    curls+=($!)
  done
  wait "${curls[@]}"
  gpus=$(cat "$work"/headers-"$n"-* | tr -d '\r' | sed -n 's/^[Xx]-[Hh]iber-[Gg]pu: //p' | sort -u | wc -l)
  awk -v n="$n" -v rate="$rate" -v one="$one" -v hold="$hold_ms" -v p50="$p50" \
    -v workers="$workers" -v gpus="$gpus" 'BEGIN {
    printf "%-10d %12.1f %12.1f %12.3f %10.1f %8s %10s\n", n, rate, n * 1000 / hold,
      rate / (n * one), p50 / 1000, workers, gpus }'
done
errors=0
for n in 1 2 4 8; do errors=$((errors + $(value "hot_$n" router_errors | cut -d. -f1))); done
if ((errors > 0)); then
  echo "warning: $errors failed invocations (wrk errors); the figures include them"
fi
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
