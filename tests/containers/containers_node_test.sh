#!/usr/bin/env bash
# containers_node_test: a Hiber node under podman (containers/run-node.sh) answers correctly.
#
# Hermetic: podman runs on a storage of its own under this run's temporary folder (images,
# containers, volumes, secrets and podman's own state), so nothing an earlier run or another
# user of podman left can hide a failure; it is removed at the end. Builds the Debian base roots
# (mmdebstrap, about 2.5 minutes) and the images from $HIBER_BUILD_DIR with containers/build.sh
# under the tag "test", checks what the images promise
# (non-root users, OCI labels, no shim inside the function image), starts the node with
# run-node.sh --keep and a short trace replay, then invokes the functions with inputs of its own
# and compares each answer with the formula computed here: mlp_server's table entry
# (seed * 2654435761 + i * 40503) mod 65536 (tests/shim/programs/tiny_mlp_model.h) and the
# PyTorch template's y = W x + b (containers/pytorch-function/handler.py's docstring).
# Exits 77 with one line where podman cannot run a container or the shim was not built.
set -euo pipefail
# A command that fails under set -e says where, so a failed run is never silent.
trap 'echo "containers_node_test: line $LINENO failed (exit $?)" >&2' ERR
root=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${HIBER_BUILD_DIR:-$root/build/release}
tag="test"
name=hiber-test-$$

skip() { echo "containers_node_test: skipped: $*"; exit 77; }
fail() { echo "containers_node_test: FAILED: $*" >&2; exit 1; }

for tool in podman mmdebstrap patchelf curl python3; do
  command -v "$tool" >/dev/null || skip "$tool is missing (scripts/install-deps.sh installs it)"
done
[ -f "$build_dir/client_shim/libhibercuda.so" ] ||
  skip "no shim in $build_dir (the CUDA toolkit was absent at build time): no CUDA function to run"
work=$(mktemp -d "${TMPDIR:-/tmp}/hiber-containers-test.XXXXXX")
# podman's storage and state, this run's own: storage.conf names the image store and its run
# state; a copy of containers/containers.conf adds podman's temporary state (tmp_dir). Volumes
# and secrets live under the image store.
cat >"$work/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$work/podman/storage"
runroot = "$work/podman/run"
CONF
sed "/^\[engine\]/a tmp_dir = \"$work/podman/tmp\"" "$root/containers/containers.conf" \
  >"$work/containers.conf"
export CONTAINERS_STORAGE_CONF=$work/storage.conf CONTAINERS_CONF=$work/containers.conf
# Everything this run made goes with its folder: containers first (they hold mounts), then the
# images, then the folder, mounts and all.
own_storage=0
remove_storage() {
  if [ "$own_storage" = 1 ]; then
    podman rm --all --force --time 5 >/dev/null 2>&1 || true
    podman rmi --all --force >/dev/null 2>&1 || true
    findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount -l 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap remove_storage EXIT
store=$(podman info --format '{{.Store.GraphRoot}}' 2>&1) || skip "podman cannot start here: $store"
# Never touch a storage that is not this run's (remove_storage removes everything in it).
[ "$store" = "$work/podman/storage" ] ||
  fail "podman uses $store, not this run's storage: CONTAINERS_STORAGE_CONF was ignored"
own_storage=1
[ -z "$(podman images --quiet)" ] || fail "this run's podman storage is not empty"

# Can podman run a container here? Tried on a throwaway root holding /bin/true, glibc and
# libstdc++ and nothing else: later, the "any image" the shim is injected into.
mkdir -p "$work/root/bin" "$work/shim"
cp /bin/true "$work/root/bin/true"
libs=$(ldd /bin/true | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
# Read once: awk leaving a pipe early would kill ldconfig with SIGPIPE, failing under pipefail.
ld_cache=$(ldconfig -p)
for lib in libstdc++.so.6 libgcc_s.so.1 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
  libs+=" $(awk -v l="$lib" '$1 == l && /x86-64/ && !found {print $NF; found = 1}' <<<"$ld_cache")"
done
for lib in $libs; do
  mkdir -p "$work/root$(dirname "$lib")"
  cp -L "$lib" "$work/root$lib"
done
if ! why=$(podman run --rm --network=none --rootfs "$work/root" /bin/true 2>&1); then
  skip "podman cannot run containers here: $(tail -n 1 <<<"$why")"
fi

# The images, from this build's binaries, and their base roots from Debian's archive.
images=(hiberd router function-base mlp-function pytorch-function)
"$root/containers/build.sh" --build_dir="$build_dir" --tag="$tag" >"$work/build.log" 2>&1 ||
  { tail -n 20 "$work/build.log" >&2; fail "containers/build.sh failed"; }

# What the images promise.
revision_of() { podman image inspect -f '{{index .Labels "org.opencontainers.image.revision"}}' "$1"; }
for image in "${images[@]}"; do
  ref=localhost/hiber/$image:$tag
  user=$(podman image inspect -f '{{.Config.User}}' "$ref")
  if [ -z "$user" ] || [ "${user%%:*}" = 0 ] || [ "${user%%:*}" = root ]; then
    fail "$ref runs as '${user:-root}', not as a non-root user"
  fi
  revision=$(revision_of "$ref")
  [[ "$revision" =~ ^[0-9a-f]{40}(-dirty)?$ ]] || fail "$ref: revision label '$revision'"
  created=$(podman image inspect -f '{{index .Labels "org.opencontainers.image.created"}}' "$ref")
  [[ "$created" =~ ^20[0-9]{2}-[0-9]{2}-[0-9]{2}T ]] || fail "$ref: created label '$created'"
done
podman run --rm --network=none --entrypoint /bin/sh "localhost/hiber/mlp-function:$tag" -c \
  'test ! -e /opt/hiber/shim && ! ls /usr/lib/x86_64-linux-gnu | grep -q "hiber\|cudart"' ||
  fail "hiber/mlp-function holds a shim or a CUDA runtime: the shim must come from outside"

# The shim folder works in an image that has none of its libraries: every library mlp_server
# and the preloaded shim need resolves, those not glibc's or libstdc++'s from the shim folder.
shim=/opt/hiber/shim
podman run --rm --network=none --user 0 --entrypoint /bin/cp -v "$work/shim:/out" \
  "localhost/hiber/function-base:$tag" -a "$shim/." /out/
libraries=$(podman run --rm --network=none -v "$work/shim:$shim:ro" \
  -v "$build_dir/tests/shim/programs/mlp_server:/usr/bin/mlp_server:ro" \
  -e "LD_PRELOAD=$shim/libhibercuda.so $shim/libhibercublas.so $shim/libhibercublasLt.so $shim/libhibercudnn.so $shim/libhibernvml.so" \
  --rootfs "$work/root" /lib64/ld-linux-x86-64.so.2 --list /usr/bin/mlp_server 2>&1) ||
  fail "mlp_server with the shim does not load in a bare image: $libraries"
for lib in libglog.so.1 libcapnp-0.9.2.so libcrypto.so.3 libzstd.so.1; do
  grep -q "$lib => $shim/deps/$lib" <<<"$libraries" ||
    fail "$lib does not come from the shim folder: $libraries"
done

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
trap '"$root/containers/run-node.sh" --down --name="$name" >/dev/null; remove_storage' EXIT
"$root/containers/run-node.sh" --tag="$tag" --name="$name" --port="$port" --minutes=1 \
  --speedup=60 --keep >"$work/node.log" 2>&1 ||
  { cat "$work/node.log" >&2; fail "run-node.sh failed"; }
grep -q '^run-node.sh: every answer checked out' "$work/node.log" ||
  { cat "$work/node.log" >&2; fail "run-node.sh did not check its answers"; }

infer() {  # FN CONTENT_TYPE BODY
  curl -fsS -m 60 -H "Content-Type: $2" --data-binary "$3" "$url/v2/models/$1/infer"
}
# mlp-a: seed 100, 64 MiB; mlp-b: seed 101, 16 MiB (run-node.sh). An answer is "result <input>
# <8 outputs> <table entry as %a> ..."; the entry is the model's, read on the simulated GPU.
check_entry() {  # FN SEED ENTRY INPUT
  local answer
  answer=$(infer "$1" application/octet-stream "$4 $3") || fail "$1: request '$4 $3' failed"
  python3 - "$answer" "$2" "$3" "$4" <<'PY' || fail "$1 answered '$answer' to '$4 $3' (seed $2)"
import sys
answer, seed, entry, x = sys.argv[1].split(), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
want = float((seed * 2654435761 + entry * 40503) % 65536)
assert answer[0] == "result" and answer[1] == x, answer[:2]
assert float.fromhex(answer[10]) == want, (answer[10], want)
PY
}
for entry in 0 1 4095 123457 16777215; do check_entry mlp-a 100 "$entry" 3; done
for entry in 0 65535 4194303; do check_entry mlp-b 101 "$entry" 11; done
for x in "1 2 3 4" "0 0 0 0" "-1.5 2.25 0.5 -4"; do
  read -ra xs <<<"$x"
  body=$(python3 -c 'import json, sys; print(json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [float(v) for v in sys.argv[1:]]}]}))' "${xs[@]}")
  answer=$(infer torch application/json "$body") || fail "torch: request x = [$x] failed"
  python3 - "$answer" "${xs[@]}" <<'PY' || fail "torch answered '$answer' to x = [$x]"
import json, sys
y = json.loads(sys.argv[1])["outputs"][0]["data"]
x = [float(v) for v in sys.argv[2:]]
want = [sum((i - j) / 4 * x[j] for j in range(4)) + i / 2 for i in range(3)]
assert len(y) == 3 and all(abs(a - b) < 1e-5 for a, b in zip(y, want)), (y, want)
PY
done
# A malformed request is the client's mistake (400 from the router, which checks it against the
# protocol), not a crash: the worker then still answers.
status=$(curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
  --data-binary '{"inputs": []}' "$url/v2/models/torch/infer")
[ "$status" = 400 ] || fail "torch answered $status to a request without inputs, not 400"
check_entry mlp-a 100 7 5
echo "containers_node_test: passed (images: $(revision_of "localhost/hiber/hiberd:$tag"))"
