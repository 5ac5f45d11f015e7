#!/usr/bin/env bash
# Hiber's main job on a machine without a GPU: hiberd serving the simulated 4-GPU node of the
# Torpor paper (embedded default config, copies slowed to its PCIe and NVLink bandwidths), and a
# client that connects over the wire and reports the devices, the topology, the round-trip time
# and a checked data round trip. Then unmodified CUDA programs, compiled by nvcc, run through
# the client shim (libhibercuda.so) with their results checked on the host. Then late binding:
# six inference functions (mlp_server, an ordinary CUDA program) are registered and started, and
# requests sent the way the node router sends them (hiberctl register, arrive, start, done) run
# on whichever GPU hiberd picks, their models swapped in from host memory or another GPU. Last,
# hiberctl shows the node's status.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset release >/dev/null
targets=(hiberd hiber-probe hiberctl)
# The shim and the CUDA programs need the CUDA toolkit at build time (not a GPU).
have_shim=0
if grep -q 'hibercuda' build/release/build.ninja 2>/dev/null; then
  have_shim=1
  targets+=(hibercuda hibercublas hibercublasLt hibercudnn hibernvml hiber-coverage hiber_shim_programs
            hiber_shim_programs_plugin)
fi
cmake --build --preset release --target "${targets[@]}"

bin=build/release
# The shim, then the replacement cuBLAS, cuBLASLt and cuDNN (programs linked with -lcublas etc.).
preload="$PWD/$bin/client_shim/libhibercuda.so"
for library in libhibercublas.so libhibercublasLt.so libhibercudnn.so libhibernvml.so; do
  preload+=" $PWD/$bin/client_shim/$library"
done
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
      LD_PRELOAD="$preload" "$bin/tests/shim/programs/$program"
  done
  echo
  echo "== unmodified cuBLAS/cuDNN programs (linked -lcublas -lcublasLt -lcudnn) run through the"
  echo "   replacement libraries; hiber-coverage lists what each imports and whether it is remoted:"
  for program in library_gemm library_cnn library_transformer; do
    # Exit 1: the program imports a stub (library_gemm calls cublasSsyrk on purpose, to show
    # that an unsupported call fails loudly).
    "$bin/tools/hiber-coverage" --summary "$bin/tests/shim/programs/$program" ||
      echo "  (hiber-coverage: $program imports a name Hiber only stubs; that call fails loudly)"
    HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="$program" \
      LD_PRELOAD="$preload" "$bin/tests/shim/programs/$program"
  done
  echo
  echo "== late binding: six functions registered; their requests go where hiberd places them"
  ctl() { "$bin/tools/hiberctl" --run_dir="$run_dir" "$@"; }
  pids=()
  for i in 0 1 2 3 4 5; do
    # The deadline is generous: this shell's polling and hiberctl processes add tens of ms.
    ctl register "fn-$i" --slo_ms=1000 >/dev/null
    mkfifo "$run_dir/fn-$i.in"
    HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="fn-$i" LD_PRELOAD="$preload" \
      "$bin/tests/shim/programs/mlp_server" "$((7 + i))" 64 <"$run_dir/fn-$i.in" \
      >"$run_dir/fn-$i.out" 2>"$run_dir/fn-$i.err" &
    pids+=($!)
    exec {fd}>"$run_dir/fn-$i.in"
    fds[i]=$fd
  done
  for i in 0 1 2 3 4 5; do
    until grep -q ready "$run_dir/fn-$i.out" 2>/dev/null; do sleep 0.1; done
  done
  # One request: arrive, start (hiberd names the GPU), the function answers, done.
  request() {
    local n=$1 i=$2 id gpu source source_gpu rule queued answers
    id=$(ctl arrive "fn-$i")
    read -r gpu source source_gpu rule queued < <(ctl start "$id")
    answers=$(grep -c result "$run_dir/fn-$i.out" || true)
    echo "$n $((n * 1000))" >&"${fds[i]}"
    until [ "$(grep -c result "$run_dir/fn-$i.out")" -gt "$answers" ]; do sleep 0.01; done
    ctl done "$id"
    [ "$source" = peer ] && source="peer GPU $source_gpu"
    printf '  request %2d of fn-%d: GPU %d, model %-10s (%s), answer %s ...\n' "$n" "$i" "$gpu" \
      "$source" "$rule" "$(tail -1 "$run_dir/fn-$i.out" | cut -d' ' -f3-4)"
  }
  for n in $(seq 0 8); do request "$n" $(( (n * 5) % 6 )); done
  echo "  (GPUs 0 and 1 drained and resumed: the models there leave; their host copies stay)"
  for g in 0 1; do ctl drain --gpu=$g >/dev/null; ctl drain --gpu=$g --resume >/dev/null; done
  for n in $(seq 9 17); do request "$n" $(( (n * 5) % 6 )); done
  for i in 0 1 2 3 4 5; do echo quit >&"${fds[i]}"; done
  wait "${pids[@]}"
else
  echo "(CUDA toolkit not found at build time: the shim and its CUDA programs were not built)"
fi
echo
echo "== hiberctl status:"
"$bin/tools/hiberctl" --run_dir="$run_dir" status
