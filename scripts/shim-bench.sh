#!/usr/bin/env bash
# The CUDA shim's benchmark (bench/shim_bench.cu, docs/perf.md "shim"): starts hiberd with the
# simulated GPU and the benchmark's kernel plugin in a temporary run dir, runs shim_bench under
# libhibercuda.so with batching on (the defaults) and off (HIBER_BATCH=0), stops hiberd, and
# prints every figure and the on/off ratios. A third run, against a hiberd with a larger arena,
# measures 256 MiB copies from pinned memory that fits the arena.
#
#   scripts/shim-bench.sh [-B BUILD_DIR] [--no-build] [--cpu_load=N] [--cpu_load_kind=KIND]
#                         [-- SHIM_BENCH_ARGS...]
#
#   -B BUILD_DIR   a Release build tree (default build/release; configured if it has no cache)
#   --no-build     use the binaries as they are
#   --cpu_load=N   N load processes run while the benchmark runs (default 0; scripts/cpu-load.sh)
#   --cpu_load_kind=KIND   spin (busy all the time) or wake (2 ms busy, 1 ms asleep; default)
#   SHIM_BENCH_ARGS  passed to every run (e.g. --only=launch --launches=200000)
# Environment: HIBERD_FLAGS adds flags to every hiberd; SHIM_BENCH_OFF_ONLY (default
# launch,throughput,sync) is what the batching-off run measures; SHIM_BENCH_BIG_ARENA_MIB
# (default 640, 0 to skip) is the arena of a third run, 256 MiB copies only, where a 256 MiB
# cudaMallocHost buffer fits hiberd's arena.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/release
do_build=1
cpu_load=0
cpu_load_kind=wake
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --cpu_load=*) cpu_load=${1#*=}; shift ;;
    --cpu_load_kind=*) cpu_load_kind=${1#*=}; shift ;;
    --) shift; break ;;
    *)
      echo "usage: $0 [-B BUILD_DIR] [--no-build] [--cpu_load=N] [--cpu_load_kind=spin|wake]" \
        "[-- SHIM_BENCH_ARGS...]" >&2
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
  cmake --build "$build" -j2 --target hiberd hibercuda shim_bench_program hiber_shim_bench_kernels
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
if [[ $build_type != Release ]]; then
  echo "warning: $build is a '$build_type' build; figures from it mean nothing" >&2
fi

hiberd_bin=$build/server/hiberd
shim=$build/client_shim/libhibercuda.so
bench=$build/bench/shim_bench
plugin=$build/bench/libhiber_shim_bench_kernels.so
for f in "$hiberd_bin" "$shim" "$bench" "$plugin"; do
  [[ -e $f ]] || { echo "missing $f (build the targets, or drop --no-build)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/hiber-shim-bench-XXXXXX)  # mode 0700, as hiberd's run dir must be
hiberd=""
stop_hiberd() {
  if [[ -n $hiberd ]]; then
    kill -TERM "$hiberd" 2>/dev/null || true
    wait "$hiberd" 2>/dev/null || true
    hiberd=""
  fi
}
trap 'stop_cpu_load; stop_hiberd; rm -rf "$work"' EXIT

# start_hiberd NAME [FLAGS...]: hiberd with the simulated GPU in $work/NAME (sets run_dir).
start_hiberd() {
  run_dir=$work/$1
  shift
  mkdir -m 700 "$run_dir"
  # shellcheck disable=SC2086  # HIBERD_FLAGS is a list of flags
  "$hiberd_bin" --device=sim --run_dir="$run_dir" --sim_kernel_plugins="$plugin" \
    ${HIBERD_FLAGS:-} "$@" 2>"$run_dir/hiberd.log" &
  hiberd=$!
  for _ in $(seq 200); do
    [[ -S $run_dir/hiberd.sock ]] && return 0
    kill -0 "$hiberd" 2>/dev/null || break
    sleep 0.05
  done
  echo "hiberd did not start:" >&2
  cat "$run_dir/hiberd.log" >&2
  exit 1
}

# run_bench LABEL [SHIM_BENCH_ARGS...], with the environment given before it.
results=$work/results.txt
run_bench() {
  local label=$1
  shift
  HIBER_RUN_DIR=$run_dir LD_PRELOAD=$shim "$bench" --label="$label" "$@" | tee -a "$results"
}

echo "# machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# shim $shim; hiberd --device=sim ${HIBERD_FLAGS:-}"

start_cpu_load "$cpu_load" "$cpu_load_kind"
start_hiberd default
run_bench batch_on "$@"
HIBER_BATCH=0 run_bench batch_off --only="${SHIM_BENCH_OFF_ONLY:-launch,throughput,sync}" "$@"
stop_hiberd

# cudaMallocHost memory lives in hiberd's arena (half of it; the other half stages pageable
# copies), 32 MiB with the default --arena_mib=64. Larger pinned buffers fall back to malloc and
# are copied like pageable memory, so pinned copies of 256 MiB need a larger arena.
big_arena=${SHIM_BENCH_BIG_ARENA_MIB:-640}
if [[ $big_arena != 0 ]]; then
  echo "# hiberd --arena_mib=$big_arena: 256 MiB copies with the pinned buffer in the arena"
  start_hiberd big-arena --arena_mib="$big_arena"
  run_bench "batch_on_arena${big_arena}" "$@" --only=bandwidth --sizes_mib=256
  stop_hiberd
fi
stop_cpu_load

# Batching on against off, for every figure both runs measured.
echo
echo "# batching on vs off (ratio = on / off)"
awk '
  /^RESULT / {
    for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
    v[f["label"], f["name"]] = f["value"]; u[f["name"]] = f["unit"]
    if (!(f["name"] in seen)) { seen[f["name"]] = 1; order[++n] = f["name"] }
  }
  END {
    printf "%-36s %14s %14s %10s  %s\n", "name", "batch_on", "batch_off", "on/off", "unit"
    for (i = 1; i <= n; ++i) {
      k = order[i]
      if (!((("batch_on", k) in v) && (("batch_off", k) in v))) continue
      on = v["batch_on", k]; off = v["batch_off", k]
      printf "%-36s %14s %14s %10.3g  %s\n", k, on, off, off != 0 ? on / off : 0, u[k]
    }
  }' "$results"
