#!/usr/bin/env bash
# Hiber's main job on a machine without a GPU: a whole node on the embedded simulated GPUs (8
# H100s on one NVSwitch, copies slowed to their PCIe and NVLink bandwidths).
#
#  1. hiberd (--device=sim, with its Prometheus /metrics) and hiber-router in front of it, on
#     free ports; hiber-probe connects over the wire and checks a data round trip, and a few
#     unmodified CUDA programs (nvcc, and one linked -lcublas -lcublasLt) run through the shim.
#  2. A dozen inference functions are registered with the router: mlp_server, an ordinary CUDA
#     program, with models of 1 MiB to 256 MiB and SLOs of 20 ms to 2 s. Each is invoked once
#     (its worker starts and loads its model); the answers are checked.
#  3. GPUs 0-3 are drained and resumed (maintenance): the models on them leave, their host
#     copies stay. Then ten minutes of an Azure Functions trace (sim/data/azure_demo.csv) are
#     replayed over HTTP at 30x by hiber-load, which reports per function the requests, SLO
#     compliance, p50 and p99, where each request's model came from (resident, another GPU
#     over NVLink or PCIe, host memory) and how many instances answered (the busiest function
#     may have up to four workers, each on a GPU of its own, when its requests queue).
#  4. The first requests are sent again: the answers must not have changed though the models
#     moved between GPUs. hiberctl top shows the node, and the status page and metrics URLs
#     stay on screen while the node runs (until Enter or Ctrl-C when stdin is a terminal; a
#     script or CI gets a clean exit at once).
#
# Without the CUDA toolkit at build time there is no shim and no CUDA program: the functions are
# then the no-op C++ SDK worker (hiber-echo-worker), so the router still runs end to end, but no
# request reaches a GPU. HIBER_DEMO_SHIM=0 forces that fallback. Exits 0 when everything
# answered and checked out, 1 otherwise (with the logs' tails).
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset release >/dev/null
targets=(hiberd hiber-router hiber-load hiberctl hiber-echo-worker hiber-probe)
# The shim and the CUDA programs need the CUDA toolkit at build time (not a GPU).
have_shim=0
if [ "${HIBER_DEMO_SHIM:-1}" != 0 ] && grep -q 'hibercuda' build/release/build.ninja 2>/dev/null; then
  have_shim=1
  targets+=(hibercuda hibercublas hibercublasLt hibercudnn hibernvml hiber-coverage hiber_shim_programs
            hiber_shim_programs_plugin)
fi
cmake --build --preset release --target "${targets[@]}"

bin=$PWD/build/release
ctl="$bin/tools/hiberctl"
run_dir=$(mktemp -d /tmp/hiber-demo-XXXXXX)
hiberd=""
router=""

# SIGTERM, then SIGKILL if `pid` is still there after `seconds`; reaps it.
stop() {
  local pid=$1 seconds=$2
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq $((seconds * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

show_logs() {
  echo "== the logs' last lines (all of them in $run_dir):" >&2
  for log in "$run_dir"/hiberd.log "$run_dir"/router.log "$run_dir"/router/workers/*.log \
    "$run_dir"/programs.log; do
    [ -s "$log" ] || continue
    # A worker's log that says only "ready ..." says nothing new.
    case "$log" in */workers/*) grep -qv '^ready ' "$log" || continue ;; esac
    echo "-- $log" >&2
    tail -n 15 "$log" >&2
  done
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  # A failure shows the logs; an interruption (130, 143) is no failure.
  case "$status" in 0 | 130 | 143) ;; *) show_logs ;; esac
  # The router first: it stops the workers, whose sessions end, so hiberd stops at once.
  stop "$router" 15
  stop "$hiberd" 15
  case "$status" in 0 | 130 | 143) rm -rf "$run_dir" ;; esac
  exit "$status"
}
done_showing=0  # once everything is on screen, Ctrl-C is the ordinary way out
trap cleanup EXIT
trap '[ "$done_showing" = 1 ] && exit 0; exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "demo: $*" >&2
  exit 1
}

# `file` once it holds a line (a port), or fails when `pid` exits or after 30 s.
wait_for_file() {
  local file=$1 pid=$2 what=$3
  for _ in $(seq 300); do
    [ -s "$file" ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "$what exited"
    sleep 0.1
  done
  fail "$what did not start"
}

# hiberd: the embedded default node, simulated; Prometheus metrics on a free port.
hiberd_flags=(--device=sim --sim_throttle --run_dir="$run_dir" --metrics_listen=127.0.0.1:0
              --metrics_port_file="$run_dir/hiberd-metrics.port")
if [ "$have_shim" = 1 ]; then
  hiberd_flags+=(--sim_kernel_plugins="$bin/tests/shim/libhiber_shim_programs_plugin.so")
fi
# Each in a session of its own, so that a Ctrl-C reaches only this script, which stops them in
# order (the router, then hiberd).
setsid "$bin/server/hiberd" "${hiberd_flags[@]}" 2>"$run_dir/hiberd.log" &
hiberd=$!
wait_for_file "$run_dir/hiberd-metrics.port" "$hiberd" hiberd
tries=0
until "$ctl" --run_dir="$run_dir" ping >/dev/null 2>&1; do
  kill -0 "$hiberd" 2>/dev/null || fail "hiberd exited"
  tries=$((tries + 1))
  [ "$tries" -lt 300 ] || fail "hiberd does not answer on its control socket"
  sleep 0.1
done
hiberd_metrics="http://127.0.0.1:$(cat "$run_dir/hiberd-metrics.port")/metrics"

# The router starts only the programs listed here (--worker_programs); the repository API needs
# the operator token it writes to its state folder, which hiberctl reads (--router_token_file).
programs=$bin/router/hiber-echo-worker
if [ "$have_shim" = 1 ]; then programs+=",$bin/tests/shim/programs/mlp_server"; fi
router_flags=(--run_dir="$run_dir" --state_dir="$run_dir/router" --listen=127.0.0.1:0
              --port_file="$run_dir/router.port" --worker_programs="$programs")
if [ "$(id -u)" = 0 ]; then router_flags+=(--allow_root); fi  # its workers run as root too
setsid "$bin/router/hiber-router" "${router_flags[@]}" 2>"$run_dir/router.log" &
router=$!
wait_for_file "$run_dir/router.port" "$router" hiber-router
url="http://127.0.0.1:$(cat "$run_dir/router.port")"
rctl() { "$ctl" --router="$url" --router_token_file="$run_dir/router/operator-token" "$@"; }

echo "== hiberd serves the simulated node; hiber-router listens on $url"
"$bin/tools/hiber-probe" --run_dir="$run_dir"

if [ "$have_shim" = 1 ]; then
  preload="$bin/client_shim/libhibercuda.so"
  for library in libhibercublas.so libhibercublasLt.so libhibercudnn.so libhibernvml.so; do
    preload+=" $bin/client_shim/$library"
  done
  echo
  echo "== unmodified CUDA programs (nvcc -cudart shared; the last linked -lcublas -lcublasLt)"
  echo "   run through the preloaded shim, their results checked on the host:"
  nm -D --undefined-only "$bin/tests/shim/programs/tiny_mlp" | grep -c '@libcudart.so.13' |
    xargs -I{} echo "tiny_mlp imports {} symbols @libcudart.so.13; libhibercuda.so answers them"
  echo "library_transformer's imports, as hiber-coverage reads them:" \
    "$("$bin/tools/hiber-coverage" --summary "$bin/tests/shim/programs/library_transformer" |
      sed 's/^summary: //')"
  for program in vector_add tiny_mlp library_transformer; do
    # Their stderr holds the errors they provoke on purpose; it goes to the log.
    HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="$program" LD_PRELOAD="$preload" \
      "$bin/tests/shim/programs/$program" 2>>"$run_dir/programs.log" |
      awk '/: OK/ || (/->/ && !shown++)'  # the verdict (and tiny_mlp's first answer)
  done
fi

# The functions: name, model MiB (mlp_server's table; its MLP adds a few KiB), SLO ms, and the
# most instances (workers, each on a GPU of its own) the router may start. Trace row r drives
# function r, so the two busiest rows go to the two largest models, and the busiest may scale
# out when its requests queue.
functions=(
  "fn-256m 256 2000 4" "fn-192m 192 1500 1" "fn-128m 128 1000 1" "fn-96m 96 500 1"
  "fn-64m 64 300 1" "fn-48m 48 250 1" "fn-32m 32 200 1" "fn-16m 16 100 1"
  "fn-8m 8 80 1" "fn-4m 4 50 1" "fn-2m 2 30 1" "fn-1m 1 20 1"
)
shim=$([ "$have_shim" = 1 ] && echo true || echo false)
names=()
seeds=()
entries=()
echo
if [ "$have_shim" = 1 ]; then
  echo "== ${#functions[@]} inference functions registered with the router (mlp_server, a CUDA"
  echo "   program, under the shim): models of 1 to 256 MiB, SLOs of 20 ms to 2 s"
else
  echo "== the CUDA toolkit was absent at build time (or HIBER_DEMO_SHIM=0): no shim and no"
  echo "   CUDA program. ${#functions[@]} functions are the no-op C++ SDK worker"
  echo "   (hiber-echo-worker, shim: false): the router runs end to end, but no request reaches"
  echo "   a GPU, so the table below shows no model sources."
fi
i=0
for f in "${functions[@]}"; do
  read -r name mib slo instances <<<"$f"
  seed=$((100 + i))
  if [ "$have_shim" = 1 ]; then
    command="$bin/tests/shim/programs/mlp_server $seed $mib"
  else
    command="$bin/router/hiber-echo-worker"
  fi
  # idle_timeout_s: no scale-to-zero during the demo.
  rctl load "$name" --command="$command" --shim="$shim" --slo_ms="$slo" --idle_timeout_s=600 \
    --max_instances="$instances" >/dev/null
  names+=("$name")
  seeds+=("$seed")
  entries+=($((mib * 262144 - 1)))  # the table's last float: the far end of the model
  i=$((i + 1))
done

# Entry i of model `seed`'s table as mlp_server prints it (C's %a), computed here independently
# (tests/shim/programs/tiny_mlp_model.h: (seed * 2654435761 + i * 40503) mod 65536).
expected_entry() {
  python3 -c '
import sys
seed, i = int(sys.argv[1]), int(sys.argv[2])
v = float((seed * 2654435761 + i * 40503) % 65536)
if v == 0:
    print("0x0p+0")
else:
    mantissa, exponent = v.hex().split("p")
    print(mantissa.rstrip("0").rstrip(".") + "p" + exponent)' "$1" "$2"
}

# One request per function, all at once: `tag` names the files; the request line is input 7,
# the table's last entry (an echo worker answers it back unchanged).
invoke_all() {
  local tag=$1 pids=() n
  for n in "${!names[@]}"; do
    rctl invoke "${names[n]}" --content_type=application/octet-stream \
      --data="7 ${entries[n]}" >"$run_dir/$tag-$n.out" 2>"$run_dir/$tag-$n.err" &
    pids+=($!)
  done
  for n in "${!pids[@]}"; do
    wait "${pids[n]}" || { cat "$run_dir/$tag-$n.err" >&2; fail "invoking ${names[n]} failed"; }
  done
}
header() { sed -n "s/^$1: //p" "$2"; }
# "GPU 3 (host)": where request `tag`-`n` ran and where its model came from.
placement() {
  local err="$run_dir/$1-$2.err" source link
  source=$(header X-Hiber-Source "$err")
  link=$(header X-Hiber-Link "$err")
  [ -n "$source" ] || { echo "no GPU"; return; }
  if [ "$source" = peer ]; then source="peer, $link"; fi
  echo "GPU $(header X-Hiber-Gpu "$err") ($source)"
}
check_answer() {
  local tag=$1 n=$2 answer expected
  answer=$(cat "$run_dir/$tag-$n.out")
  if [ "$have_shim" = 0 ]; then
    [ "$answer" = "7 ${entries[n]}" ] || fail "${names[n]} answered '$answer' to '7 ${entries[n]}'"
    return
  fi
  expected=$(expected_entry "${seeds[n]}" "${entries[n]}")
  [ "$(cut -d' ' -f1,2 <<<"$answer")" = "result 7" ] || fail "${names[n]} answered '$answer'"
  [ "$(cut -d' ' -f11 <<<"$answer")" = "$expected" ] ||
    fail "${names[n]}: table entry ${entries[n]} is $(cut -d' ' -f11 <<<"$answer"), not $expected"
}

echo "   each invoked once (its worker starts and loads its model), the answers checked:"
invoke_all first
printf '   %-8s %5s %7s  %-20s %s\n' function MiB SLO_ms "ran on" "answer to \"7 <last table entry>\""
for n in "${!names[@]}"; do
  check_answer first "$n"
  read -r _ mib slo _ <<<"${functions[n]}"
  answer=$(cat "$run_dir/first-$n.out")
  if [ ${#answer} -gt 44 ]; then answer="${answer:0:41}..."; fi
  printf '   %-8s %5s %7s  %-20s %s\n' "${names[n]}" "$mib" "$slo" "$(placement first "$n")" "$answer"
done
if [ "$have_shim" = 1 ]; then
  echo "   (each answer's last number, the table's last entry, matches the seed's formula)"
  echo
  echo "== GPUs 0-3 drained and resumed, as for maintenance: the models there leave the GPUs;"
  echo "   their host copies stay"
  for g in 0 1 2 3; do
    "$ctl" --run_dir="$run_dir" drain --gpu="$g" >/dev/null
    "$ctl" --run_dir="$run_dir" drain --gpu="$g" --resume >/dev/null
  done
fi

echo
echo "== 10 minutes of an Azure Functions trace replayed at 30x over HTTP (hiber-load):"
list=$(IFS=,; echo "${names[*]}")
load_status=0
# Each request: input {k} (its number among its function's), table entry {n} (its number).
"$bin/tools/hiber-load" --router="$url" --trace=sim/data/azure_demo.csv --functions="$list" \
  --minutes=10 --speedup=30 --connections=64 --body_template='{k} {n}' \
  --minloglevel=1 || load_status=$?

echo
echo "== the first requests again: the same answers, wherever the models went meanwhile"
invoke_all again
for n in "${!names[@]}"; do
  check_answer again "$n"
  cmp -s "$run_dir/first-$n.out" "$run_dir/again-$n.out" ||
    fail "${names[n]} answered '$(cat "$run_dir/again-$n.out")', before '$(cat "$run_dir/first-$n.out")'"
done
# Three of them, those that moved to another GPU first.
shown=()
for n in "${!names[@]}"; do
  if [ "$(placement first "$n")" != "$(placement again "$n")" ]; then shown+=("$n"); fi
done
for n in "${!names[@]}"; do
  if [ "$(placement first "$n")" = "$(placement again "$n")" ]; then shown+=("$n"); fi
done
for n in "${shown[@]:0:3}"; do
  printf '   %-8s before: %-20s now: %-20s the same answer\n' "${names[n]}" \
    "$(placement first "$n")" "$(placement again "$n")"
done
echo "   (and so did the other $((${#names[@]} - 3)))"
if [ "$have_shim" = 1 ]; then
  echo "   (the integration tests check the MLP's outputs against the host computation)"
fi

echo
echo "== hiberctl --router=$url top --iterations=1"
rctl top --iterations=1
echo
echo "== hiberd's metrics: swaps onto the GPUs and the bytes they moved, by link"
curl -fsS "$hiberd_metrics" | grep -E '^hiber_swap(s|_bytes)_total' || true

echo
echo "Status page:     $url/"
echo "Router metrics:  $url/metrics"
echo "hiberd metrics:  $hiberd_metrics"
if [ "$load_status" != 0 ]; then
  fail "hiber-load: some requests failed (exit status $load_status)"
fi
if [ -t 0 ]; then
  done_showing=1
  echo "The node keeps running for 5 minutes: press Enter or Ctrl-C to stop it now."
  read -r -t 300 || true
fi
