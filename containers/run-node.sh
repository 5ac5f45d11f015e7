#!/usr/bin/env bash
# Runs a Hiber node under podman on the embedded simulated GPUs (8 H100s on one NVSwitch), from
# the images containers/build.sh builds (docs/deploy.md, "Running a node with podman"):
#
#   NAME-hiberd    hiber/hiberd, --device=sim, no network: functions and the router reach it
#                  through its sockets in the volume NAME-run (/run/hiber)
#   NAME-router    hiber/router, HTTP on 127.0.0.1:PORT; attached workers connect to its socket
#                  in the volume NAME-attach (/run/hiber-router)
#   NAME-mlp-a, NAME-mlp-b
#                  hiber/mlp-function: the demo's inference function (mlp_server, a CUDA program)
#                  with models of 64 and 16 MiB; its image holds no shim: the shim folder is the
#                  volume NAME-shim (filled from hiber/function-base) mounted at /opt/hiber/shim,
#                  with LD_PRELOAD, HIBER_RUN_DIR and the token file set
#   NAME-torch     hiber/pytorch-function (built on the Debian base here: no torch, no shim)
#
# Every function container has no network and runs as uid 10001; its worker attaches to the
# router (registration "external": true). The tokens are podman secrets: NAME-auth-token (the
# functions' token for hiberd), NAME-worker-token (the workers' token for the router) and
# NAME-operator-token (the router's repository API: this script registers the functions with it).
# Then each function is invoked and its answer checked; GPUs 0-3 are drained and resumed (their
# models leave them), hiber-load replays MINUTES of the README demo's trace (sim/data/azure_demo.csv) at SPEEDUPx against the two CUDA functions from
# inside the router's container; the first requests are sent again and must answer the same.
#
# Usage: containers/run-node.sh [--tag=TAG] [--name=NAME] [--port=PORT] [--minutes=M]
#                               [--speedup=S] [--keep | --down]
#   --keep   leave the node running at the end (stop it with --down); otherwise everything is
#            stopped and removed on exit, also after a failure or Ctrl-C
#   --down   stop and remove the node's containers, volumes and secrets, and exit
# Defaults: TAG the project version, NAME hiber-node, PORT 8080, M 10, S 30.
# Exits 0 when every answer checked out, 1 otherwise (with the containers' log tails), 3 when
# podman cannot run a container here (the reason on one line).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/containers/containers.conf}

tag=$(sed -n 's/^project(hiber .*VERSION \([0-9.]*\)).*/\1/p' CMakeLists.txt)
name=hiber-node
port=8080
minutes=10
speedup=30
mode=run
for arg in "$@"; do
  case "$arg" in
    --tag=*) tag=${arg#*=} ;;
    --name=*) name=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    --minutes=*) minutes=${arg#*=} ;;
    --speedup=*) speedup=${arg#*=} ;;
    --keep) mode=keep ;;
    --down) mode=down ;;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-node.sh: unknown argument '$arg' (--help lists them)" >&2; exit 2 ;;
  esac
done

functions=(mlp-a mlp-b torch)
containers=()
for f in "${functions[@]}"; do containers+=("$name-$f"); done
containers+=("$name-router" "$name-hiberd")  # in the order they stop
volumes=("$name-run" "$name-attach" "$name-router" "$name-shim")
secrets=("$name-auth-token" "$name-worker-token" "$name-operator-token")

down() {
  podman rm --force --time 10 --ignore "${containers[@]}" >/dev/null 2>&1 || true
  podman volume rm --force "${volumes[@]}" >/dev/null 2>&1 || true
  podman secret rm "${secrets[@]}" >/dev/null 2>&1 || true
}
if [ "$mode" = down ]; then
  down
  echo "run-node.sh: $name stopped and removed"
  exit 0
fi

fail() {
  echo "run-node.sh: $*" >&2
  exit 1
}
show_logs() {
  echo "== the containers' last log lines:" >&2
  for c in "${containers[@]}"; do
    podman container exists "$c" 2>/dev/null || continue
    echo "-- $c" >&2
    podman logs --tail 15 "$c" >&2 2>&1 || true
  done
}
run_tmp=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  case "$status" in 0 | 3 | 130 | 143) ;; *) show_logs ;; esac
  if [ "$mode" = run ] || [ "$status" != 0 ]; then down; fi
  rm -rf "$run_tmp"
  exit "$status"
}

# Can podman run a container at all here? (docs/deploy.md says why it may not.)
for image in hiberd router function-base mlp-function pytorch-function; do
  podman image exists "localhost/hiber/$image:$tag" ||
    fail "image localhost/hiber/$image:$tag is missing: run containers/build.sh first"
done
if ! why=$(podman run --rm --network=none --entrypoint /bin/true "localhost/hiber/hiberd:$tag" 2>&1); then
  echo "run-node.sh: podman cannot run containers here: $(tail -n 1 <<<"$why")" >&2
  exit 3
fi

down  # what a previous run may have left
run_tmp=$(mktemp -d)  # the first answers, to compare the last ones with
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The secrets: 32 random bytes as hex, as hiberd makes its own. This script keeps the operator
# token, to register the functions.
for s in "${secrets[@]}"; do
  token=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  if [ "$s" = "$name-operator-token" ]; then operator_token=$token; fi
  printf '%s' "$token" | podman secret create "$s" - >/dev/null
done
for v in "${volumes[@]}"; do podman volume create "$v" >/dev/null; done
# The shim folder, from hiber/function-base, into a volume any function container can mount.
podman run --rm --network=none --user 0 --entrypoint /bin/cp -v "$name-shim:/shim" \
  "localhost/hiber/function-base:$tag" -a /opt/hiber/shim/. /shim/

# ---- hiberd ----
# hiberd's I/O is io_uring, which podman's default seccomp profile refuses (ENOSYS):
# containers/seccomp-hiberd.json is that profile (containers-common 0.50) with io_uring_setup,
# io_uring_enter and io_uring_register allowed.
podman run -d --name "$name-hiberd" --network=none \
  --security-opt "seccomp=$PWD/containers/seccomp-hiberd.json" \
  -v "$name-run:/run/hiber:U" \
  --secret "$name-auth-token,target=hiber-auth-token,uid=10000,gid=10000,mode=0400" \
  "localhost/hiber/hiberd:$tag" --device=sim --sim_throttle --run_dir=/run/hiber \
  --auth_token_file=/run/secrets/hiber-auth-token --allowed_uids=0,10000,10001 \
  --sim_kernel_plugins=/usr/lib/hiber/libhiber_shim_programs_plugin.so >/dev/null
tries=0
until podman exec "$name-hiberd" hiberctl --run_dir=/run/hiber ping >/dev/null 2>&1; do
  [ "$(podman inspect -f '{{.State.Running}}' "$name-hiberd")" = true ] || fail "hiberd exited"
  tries=$((tries + 1))
  [ "$tries" -lt 300 ] || fail "hiberd does not answer on its control socket"
  sleep 0.2
done

# ---- the router ----
podman run -d --name "$name-router" -p "127.0.0.1:$port:8080" \
  -v "$name-run:/run/hiber" -v "$name-attach:/run/hiber-router:U" \
  -v "$name-router:/var/lib/hiber-router:U" \
  --secret "$name-worker-token,target=hiber-worker-token,uid=10000,gid=10000,mode=0400" \
  --secret "$name-operator-token,target=hiber-operator-token,uid=10000,gid=10000,mode=0400" \
  "localhost/hiber/router:$tag" --run_dir=/run/hiber --state_dir=/var/lib/hiber-router \
  --listen=0.0.0.0:8080 --worker_attach_socket=/run/hiber-router/attach.sock \
  --worker_token_file=/run/secrets/hiber-worker-token \
  --operator_token_file=/run/secrets/hiber-operator-token >/dev/null
url="http://127.0.0.1:$port"
tries=0
until curl -fsS -o /dev/null "$url/v2/health/ready" 2>/dev/null; do
  [ "$(podman inspect -f '{{.State.Running}}' "$name-router")" = true ] || fail "the router exited"
  tries=$((tries + 1))
  [ "$tries" -lt 300 ] || fail "the router does not answer on $url"
  sleep 0.2
done
echo "== hiberd and hiber-router run in containers $name-hiberd and $name-router; $url"

# ---- the functions: registered as external, their workers in their own containers ----
register() {  # FN JSON
  curl -fsS -X POST -H 'Content-Type: application/json' --data "$2" \
    -H "Authorization: Bearer $operator_token" \
    "$url/v2/repository/models/$1/load" >/dev/null || fail "registering $1 failed"
}
shim=/opt/hiber/shim
preload="$shim/libhibercuda.so $shim/libhibercublas.so $shim/libhibercublasLt.so"
preload+=" $shim/libhibercudnn.so $shim/libhibernvml.so"
function_container() {  # FN IMAGE [ARG...]: a worker that attaches to the router
  local fn=$1 image=$2
  shift 2
  podman run -d --name "$name-$fn" --network=none --restart=on-failure \
    -v "$name-attach:/run/hiber-router:ro" \
    --secret "$name-worker-token,target=hiber-worker-token,uid=10001,gid=10001,mode=0400" \
    -e HIBER_WORKER_SOCKET=/run/hiber-router/attach.sock \
    -e HIBER_WORKER_TOKEN_FILE=/run/secrets/hiber-worker-token -e "HIBER_FUNCTION_ID=$fn" \
    "${extra[@]}" "localhost/hiber/$image:$tag" "$@" >/dev/null
}
# The shim, injected: its folder, LD_PRELOAD, the node's run dir and the token.
extra=(-v "$name-shim:$shim:ro" -v "$name-run:/run/hiber:ro" -e "LD_PRELOAD=$preload"
       -e HIBER_RUN_DIR=/run/hiber -e HIBER_AUTH_TOKEN_FILE=/run/secrets/hiber-auth-token
       --secret "$name-auth-token,target=hiber-auth-token,uid=10001,gid=10001,mode=0400")
# name seed MiB SLO_ms: mlp_server's model table (seed) of MiB, as in scripts/demo.sh.
mlp=("mlp-a 100 64 300" "mlp-b 101 16 100")
for m in "${mlp[@]}"; do
  read -r fn seed mib slo <<<"$m"
  register "$fn" "{\"external\": true, \"shim\": true, \"slo_ms\": $slo, \"idle_timeout_s\": 600}"
  function_container "$fn" mlp-function "$seed" "$mib"
done
extra=()
register torch '{"external": true, "slo_ms": 1000, "idle_timeout_s": 600}'
function_container torch pytorch-function
echo "== functions mlp-a, mlp-b (mlp_server, CUDA through the injected shim) and torch (the"
echo "   PyTorch template's handler) run in their own containers and attach to the router"

# ---- the answers, checked against the formulas computed here ----
# mlp_server's table entry i of model `seed`: (seed * 2654435761 + i * 40503) mod 65536, printed
# as C's %a (tests/shim/programs/tiny_mlp_model.h).
expected_entry() {
  python3 -c '
import sys
seed, i = int(sys.argv[1]), int(sys.argv[2])
v = float((seed * 2654435761 + i * 40503) % 65536)
m, e = v.hex().split("p")
print("0x0p+0" if v == 0 else m.rstrip("0").rstrip(".") + "p" + e)' "$1" "$2"
}
invoke() {  # FN CONTENT_TYPE BODY: the answer's body; waits up to 2 minutes for the worker
  local out deadline=$((SECONDS + 120))
  until out=$(curl -fsS -m 30 -H "Content-Type: $2" --data-binary "$3" "$url/v2/models/$1/infer" 2>&1); do
    [ "$SECONDS" -lt "$deadline" ] || fail "invoking $1 failed: $out"
    sleep 0.5
  done
  echo "$out"
}
check_mlp() {  # FN SEED MiB TAG: input 7 on the table's last entry
  local last=$(($3 * 262144 - 1)) answer expected
  answer=$(invoke "$1" application/octet-stream "7 $last")
  expected=$(expected_entry "$2" "$last")
  [ "$(cut -d' ' -f1,2 <<<"$answer")" = "result 7" ] || fail "$1 answered '$answer'"
  [ "$(cut -d' ' -f11 <<<"$answer")" = "$expected" ] ||
    fail "$1: table entry $last is $(cut -d' ' -f11 <<<"$answer"), not $expected"
  echo "$answer" >"$run_tmp/$4-$1"
  printf '   %-6s "7 %s" -> %s...\n' "$1" "$last" "${answer:0:48}"
}
check_torch() {  # y = W x + b, W[i][j] = (i - j) / 4, b[i] = i / 2 (containers/pytorch-function)
  local answer
  answer=$(invoke torch application/json \
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}')
  python3 -c '
import json, sys
y = json.loads(sys.argv[1])["outputs"][0]["data"]
x = [1, 2, 3, 4]
want = [sum((i - j) / 4 * x[j] for j in range(4)) + i / 2 for i in range(3)]
sys.exit(0 if len(y) == 3 and all(abs(a - b) < 1e-5 for a, b in zip(y, want)) else 1)' "$answer" ||
    fail "torch answered '$answer' to x = [1, 2, 3, 4]"
  printf '   %-6s x = [1, 2, 3, 4] -> y = %s\n' torch \
    "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["outputs"][0]["data"])' "$answer")"
}
echo "   each invoked once, the answers checked:"
for m in "${mlp[@]}"; do
  read -r fn seed mib _ <<<"$m"
  check_mlp "$fn" "$seed" "$mib" first
done
check_torch
echo
echo "== GPUs 0-3 drained and resumed, as for maintenance: the models there leave the GPUs;"
echo "   their host copies stay"
for g in 0 1 2 3; do
  podman exec "$name-hiberd" hiberctl --run_dir=/run/hiber drain --gpu="$g" >/dev/null
  podman exec "$name-hiberd" hiberctl --run_dir=/run/hiber drain --gpu="$g" --resume >/dev/null
done

echo
echo "== $minutes minutes of the demo's Azure Functions trace at ${speedup}x over HTTP (hiber-load,"
echo "   in $name-router) against mlp-a and mlp-b:"
load_status=0
podman exec "$name-router" hiber-load --router=http://127.0.0.1:8080 \
  --trace=/usr/share/hiber/azure_demo.csv --functions=mlp-a,mlp-b --minutes="$minutes" \
  --speedup="$speedup" --connections=16 --body_template='{k} {n}' --minloglevel=1 ||
  load_status=$?

echo
echo "== the first requests again: the same answers"
for m in "${mlp[@]}"; do
  read -r fn seed mib _ <<<"$m"
  check_mlp "$fn" "$seed" "$mib" again
  cmp -s "$run_tmp/first-$fn" "$run_tmp/again-$fn" ||
    fail "$fn answered '$(cat "$run_tmp/again-$fn")', before '$(cat "$run_tmp/first-$fn")'"
done
check_torch
[ "$load_status" = 0 ] || fail "hiber-load: some requests failed (exit status $load_status)"
echo
echo "run-node.sh: every answer checked out"
if [ "$mode" = keep ]; then
  echo "The node keeps running: $url (containers/run-node.sh --down --name=$name stops it)"
fi
