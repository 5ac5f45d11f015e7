#!/usr/bin/env bash
# An unmodified PyTorch function invoked through hiber-router on a GPU, in one command, from a
# build copied to the GPU machine (scripts/gpu-bundle.sh): hiberd --device=cuda, hiber-router in
# front of it, scripts/torch_worker.py registered with the shim (the Python SDK, a model on
# "cuda"), two functions so that they share the GPUs, requests over HTTP checked against an
# fp64 CPU reference (scripts/gpu-router-check.py), a GPU drained between rounds so that a
# model moves. Prints the results and the router's /v2/status; exit 0 when every answer was
# right.
#
#   scripts/gpu-router-check.sh [-B BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=build/release
if [[ ${1:-} == -B ]]; then build=$2; fi
build=$(cd "$build" && pwd) || exit 2
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu-router-check: no GPU here"; exit 3; }
python3 -c 'import torch' 2>/dev/null || { echo "gpu-router-check: no PyTorch here"; exit 3; }

work=$(mktemp -d /tmp/hiber-gpu-router-XXXXXX)
"$build/server/hiberd" --device=cuda --run_dir="$work/node" 2>"$work/hiberd.log" &
hiberd=$!
router=""
# shellcheck disable=SC2317  # run by the EXIT trap, which shellcheck does not follow
cleanup() {
  if [[ -n $router ]]; then kill -TERM "$router" 2>/dev/null && wait "$router" 2>/dev/null; fi
  kill -TERM "$hiberd" 2>/dev/null; wait "$hiberd" 2>/dev/null
}
trap cleanup EXIT
for _ in $(seq 300); do
  "$build/tools/hiberctl" --run_dir="$work/node" ping >/dev/null 2>&1 && break
  sleep 0.1
done
preload=""
for library in libhibercuda.so libhibercublas.so libhibercublasLt.so libhibercudnn.so \
               libhibernvml.so; do
  preload+="$build/client_shim/$library "
done
router_flags=(--listen=127.0.0.1:0 --port_file="$work/port" --run_dir="$work/node"
              --state_dir="$work/router" --shim_preload="$preload"
              --worker_programs="$(command -v python3)")
if [[ $(id -u) == 0 ]]; then router_flags+=(--allow_root); fi
"$build/router/hiber-router" "${router_flags[@]}" 2>"$work/router.log" &
router=$!
for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.1; done
url="http://127.0.0.1:$(cat "$work/port")"
status=0
for fn in torch-a torch-b; do
  curl -sf -X POST "$url/v2/repository/models/$fn/load" -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $(cat "$work/router/operator-token")" \
    -d "{\"command\": [\"python3\", \"$PWD/scripts/torch_worker.py\"], \"shim\": true,
         \"slo_ms\": 2000}" >/dev/null || status=1
done
for round in 1 2; do
  for fn in torch-a torch-b; do
    python3 scripts/gpu-router-check.py "$url" "$fn" 20 || status=1
  done
  # A drained GPU sends the models there elsewhere (peer or host) for round 2.
  if [[ $round == 1 ]]; then
    "$build/tools/hiberctl" --run_dir="$work/node" drain --gpu=0 >/dev/null &&
      "$build/tools/hiberctl" --run_dir="$work/node" drain --gpu=0 --resume >/dev/null
  fi
done
curl -s "$url/v2/status"; echo
[[ $status == 0 ]] || { tail -20 "$work/router.log" "$work/router/workers/"*.log; }
exit $status
