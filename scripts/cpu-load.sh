#!/usr/bin/env bash
# Sourced (not run) by the benchmarks (scripts/shim-bench.sh, scripts/router-bench.sh): a
# reproducible CPU load during a measurement (issue 34, "Measuring under contention"; docs/perf.md
# says what each kind reproduces).
#
#   start_cpu_load N KIND   starts N load processes of KIND, each in a process group of its own
#   stop_cpu_load           stops them (also safe when none runs)
#
# KIND: "spin", a process busy all the time; "wake", a process that alternates 2 ms busy with a
# 1 ms sleep, as a node's other function processes wake and sleep, so the scheduler keeps moving
# the benchmark's threads between cores and run queues.
cpu_load_pids=()

start_cpu_load() {
  local n=$1 kind=$2 i
  case "$kind" in
    spin | wake) ;;
    *) echo "unknown --cpu_load_kind '$kind' (spin, wake)" >&2; return 2 ;;
  esac
  for ((i = 0; i < n; i++)); do
    python3 - "$kind" <<'PY' &
import sys, time
wake = sys.argv[1] == "wake"
while True:
    until = time.perf_counter() + (0.002 if wake else 3600)
    while time.perf_counter() < until:
        pass
    if wake:
        time.sleep(0.001)
PY
    cpu_load_pids+=($!)
  done
  if ((n > 0)); then echo "# cpu load: $n '$kind' processes (pids ${cpu_load_pids[*]})"; fi
}

stop_cpu_load() {
  local pid
  for pid in "${cpu_load_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  cpu_load_pids=()
}
