#!/usr/bin/env bash
# Hiber's main job on a machine without a GPU: hiberd serving the simulated 4-GPU node of the
# Torpor paper (embedded default config, copies slowed to its PCIe and NVLink bandwidths), and a
# client that connects over the wire and reports the devices, the topology, the round-trip time
# and a checked data round trip. Then unmodified CUDA programs, compiled by nvcc, run through
# the client shim (libhibercuda.so) with their results checked on the host, and hiberctl shows
# the node's status.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset release >/dev/null
targets=(hiberd hiber-probe hiberctl)
# The shim and the CUDA programs need the CUDA toolkit at build time (not a GPU).
have_shim=0
if grep -q 'hibercuda' build/release/build.ninja 2>/dev/null; then
  have_shim=1
  targets+=(hibercuda hiber_shim_programs hiber_shim_programs_plugin)
fi
cmake --build --preset release --target "${targets[@]}"

bin=build/release
run_dir=$(mktemp -d /tmp/hiber-demo-XXXXXX)
plugins=""
[ "$have_shim" = 1 ] && plugins="--sim_kernel_plugins=$bin/tests/shim/libhiber_shim_programs_plugin.so"
"$bin/server/hiberd" --device=sim --sim_throttle --run_dir="$run_dir" $plugins \
  2>"$run_dir/hiberd.log" &
hiberd=$!
cleanup() {
  kill -TERM "$hiberd" 2>/dev/null || true
  wait "$hiberd" 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT

for _ in $(seq 100); do
  "$bin/tools/hiberctl" --run_dir="$run_dir" ping >/dev/null 2>&1 && break
  kill -0 "$hiberd" 2>/dev/null || { cat "$run_dir/hiberd.log"; exit 1; }
  sleep 0.1
done

echo "== hiberd is serving the simulated node; a function connects over the wire:"
"$bin/tools/hiber-probe" --run_dir="$run_dir"
if [ "$have_shim" = 1 ]; then
  echo
  echo "== unmodified CUDA programs (nvcc -cudart shared) run through libhibercuda.so:"
  nm -D --undefined-only "$bin/tests/shim/programs/tiny_mlp" | grep -c '@libcudart.so.13' |
    xargs -I{} echo "tiny_mlp imports {} symbols @libcudart.so.13; the preloaded shim answers them"
  for program in vector_add saxpy_streams tiny_mlp; do
    HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="$program" \
      LD_PRELOAD="$PWD/$bin/client_shim/libhibercuda.so" "$bin/tests/shim/programs/$program"
  done
else
  echo "(CUDA toolkit not found at build time: the shim and its CUDA programs were not built)"
fi
echo
echo "== hiberctl status:"
"$bin/tools/hiberctl" --run_dir="$run_dir" status
