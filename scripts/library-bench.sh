#!/usr/bin/env bash
# Remoted library calls' client-side cost (bench/library_call_bench.cc, docs/perf.md "Remoted
# libraries"): starts hiberd with the simulated GPU and shim_bench's kernel plugin (for the
# launch baseline) in a temporary run dir, and runs library_call_bench with the shim and the
# cuBLAS, cuBLASLt and cuDNN replacements preloaded. Extra arguments go to the benchmark.
#
#   scripts/library-bench.sh [-B BUILD_DIR] [-- BENCHMARK_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/release
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-B BUILD_DIR] [-- BENCHMARK_ARGS...]" >&2; exit 2 ;;
  esac
done
hiberd_bin=$build/server/hiberd
bench=$build/bench/library_call_bench
plugin=$build/bench/libhiber_shim_bench_kernels.so
preload="$build/client_shim/libhibercuda.so $build/client_shim/libhibercublas.so"
preload+=" $build/client_shim/libhibercublasLt.so $build/client_shim/libhibercudnn.so"
for f in "$hiberd_bin" "$bench" "$plugin" $preload; do
  [[ -e $f ]] || { echo "missing $f (build hiberd, hibercuda, hibercublas, hibercublasLt," \
    "hibercudnn, library_call_bench_program and hiber_shim_bench_kernels)" >&2; exit 1; }
done
run_dir=$(mktemp -d /tmp/hiber-library-bench-XXXXXX)  # mode 0700, as hiberd's run dir must be
"$hiberd_bin" --device=sim --run_dir="$run_dir" --sim_kernel_plugins="$plugin" \
  2>"$run_dir/hiberd.log" &
hiberd=$!
trap 'kill -TERM $hiberd 2>/dev/null || true; wait $hiberd 2>/dev/null || true; rm -rf "$run_dir"' EXIT
for _ in $(seq 200); do
  [[ -S $run_dir/hiberd.sock ]] && break
  kill -0 "$hiberd" 2>/dev/null || { cat "$run_dir/hiberd.log" >&2; exit 1; }
  sleep 0.05
done
echo "# machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
HIBER_RUN_DIR=$run_dir LD_PRELOAD="$preload" "$bench" "$@"
