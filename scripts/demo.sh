#!/usr/bin/env bash
# Hiber's main job on a machine without a GPU: hiberd serving the simulated 4-GPU node of the
# Torpor paper (embedded default config, copies slowed to its PCIe and NVLink bandwidths), and a
# client that connects over the wire and reports the devices, the topology, the round-trip time
# and a checked data round trip. Then hiberctl shows the node's status.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset release >/dev/null
cmake --build --preset release --target hiberd hiber-probe hiberctl

bin=build/release
run_dir=$(mktemp -d /tmp/hiber-demo-XXXXXX)
"$bin/server/hiberd" --device=sim --sim_throttle --run_dir="$run_dir" 2>"$run_dir/hiberd.log" &
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
echo
echo "== hiberctl status:"
"$bin/tools/hiberctl" --run_dir="$run_dir" status
