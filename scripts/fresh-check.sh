#!/usr/bin/env bash
# Runs the README's two commands, as written, in a fresh clone inside a throwaway Debian 12
# system, and reports the time of each: what a new user on a new machine gets.
#
#   1. mmdebstrap --variant=minbase bookworm: a root with apt and nothing else (git and
#      ca-certificates added, to clone and fetch as a user would), the host's apt sources
#      (bookworm, -updates, -security) and resolv.conf; /proc, /sys, /dev and a /run of its
#      own mounted, /usr/local/cuda mounted read-only (the CUDA toolkit is no Debian package:
#      README, "The CUDA toolkit").
#   2. git clone of this repository's HEAD (committed work only: uncommitted changes are not
#      in it) into /work/hiber there.
#   3. ./scripts/install-deps.sh && ./scripts/demo.sh, then
#      ./scripts/install-deps.sh && ./scripts/test.sh, each as root in the fresh root, timed.
#   4. Where podman cannot run containers inside the root (containers_node_test skips there),
#      it says so and runs that test on the host, from the fresh root's clone and build.
#
# Not part of CI: it takes about as long as CI twice (two full builds and the whole suite).
# Usage: scripts/fresh-check.sh [--only=demo|test] [--keep] [--dir=DIR]
#   --only  run only one of the two commands (install-deps runs before either)
#   --keep  leave the root (DIR/root) and its logs for a look afterwards
#   --dir   where the root and the logs go (default: a new folder under /var/tmp)
# Needs root (chroot and mounts), mmdebstrap and git. Exits 0 when both commands passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

only="" keep=0 dir=""
for arg in "$@"; do
  case "$arg" in
    --only=demo | --only=test) only=${arg#*=} ;;
    --keep) keep=1 ;;
    --dir=*) dir=${arg#*=} ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-check: unknown argument '$arg' (--help lists them)" >&2; exit 2 ;;
  esac
done
fail() { echo "fresh-check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (chroot and mounts)"
for tool in mmdebstrap git chroot findmnt; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/install-deps.sh installs mmdebstrap)"
done
# On disk, not /tmp: the build folders take several GiB.
dir=${dir:-$(mktemp -d /var/tmp/hiber-fresh.XXXXXX)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
fresh=$dir/root
[ ! -e "$fresh" ] || fail "$fresh exists: give another --dir"

# shellcheck disable=SC2317  # run by the EXIT trap, which shellcheck does not follow
cleanup() {
  local status=$?
  findmnt -rn -o TARGET | grep "^$fresh/" | sort -r | xargs -r umount -l 2>/dev/null || true
  # Never remove a tree that still has the host's /dev or /sys mounted in it.
  if findmnt -rn -o TARGET | grep -q "^$fresh/"; then
    echo "fresh-check: mounts remain under $fresh; not removing it" >&2
  elif [ "$keep" = 0 ]; then
    rm -rf "$fresh"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
start=$SECONDS
echo "fresh-check: a Debian 12 minbase root in $fresh"
# shellcheck disable=SC2016  # "$1" in a hook is the root, expanded by mmdebstrap's shell
mmdebstrap --variant=minbase --include=ca-certificates,git \
  --setup-hook='rm -f "$1"/etc/apt/sources.list' \
  --setup-hook='mkdir -p "$1"/etc/apt/sources.list.d && cp /etc/apt/sources.list.d/*.sources "$1"/etc/apt/sources.list.d/' \
  bookworm "$fresh" >"$dir/mmdebstrap.log" 2>&1 || fail "mmdebstrap failed; its log: $dir/mmdebstrap.log"
cp /etc/resolv.conf "$fresh/etc/resolv.conf"
mount -t proc proc "$fresh/proc"
mount --rbind /sys "$fresh/sys"
mount --make-rslave "$fresh/sys"
mount --rbind /dev "$fresh/dev"
mount --make-rslave "$fresh/dev"
mount -t tmpfs tmpfs "$fresh/run"
if [ -d /usr/local/cuda ]; then
  mkdir -p "$fresh/usr/local/cuda"
  mount --bind -o ro "$(readlink -f /usr/local/cuda)" "$fresh/usr/local/cuda"
  mount -o remount,bind,ro "$fresh/usr/local/cuda"
else
  echo "fresh-check: no /usr/local/cuda here: the fresh root builds without the CUDA toolkit"
fi
commit=$(git -C "$root" rev-parse HEAD)
git clone --quiet "$root" "$fresh/work/hiber"
if ! git -C "$root" diff --quiet HEAD; then
  echo "fresh-check: note: $root has uncommitted changes; the clone holds $commit only"
fi
echo "fresh-check: root and clone of $commit ready in $(elapsed $((SECONDS - start)))"

# shellcheck disable=SC2317  # run through step's "$@", which shellcheck does not follow
# in_fresh COMMAND: runs COMMAND in the clone, as root in the fresh root, with a login's clean
# environment (no PATH entries, caches or variables of this machine).
in_fresh() {
  chroot "$fresh" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /work/hiber && $1" </dev/null
}
# The containers test on the host, from the fresh root's clone and build.
# shellcheck disable=SC2317  # as above
containers_on_host() {
  HIBER_BUILD_DIR=$fresh/work/hiber/build/release \
    "$fresh/work/hiber/tests/containers/containers_node_test.sh"
}
status=0
results=()
step() {  # NAME WHAT COMMAND...: runs COMMAND, its output in DIR/NAME.log, and times it
  local name=$1 what=$2 t0=$SECONDS rc=0
  shift 2
  echo "fresh-check: $what"
  "$@" >"$dir/$name.log" 2>&1 || rc=$?
  local took
  took=$(elapsed $((SECONDS - t0)))
  if [ "$rc" = 0 ]; then
    results+=("$name: passed in $took ($what)")
  else
    results+=("$name: FAILED (exit $rc) after $took ($what); the log: $dir/$name.log")
    tail -n 30 "$dir/$name.log" >&2
    status=1
  fi
  echo "fresh-check: ${results[-1]}"
}
demo='./scripts/install-deps.sh && ./scripts/demo.sh'
test='./scripts/install-deps.sh && ./scripts/test.sh'
if [ "$only" != test ]; then step demo "$demo" in_fresh "$demo"; fi
if [ "$only" != demo ]; then
  step test "$test" in_fresh "$test"
  # The containers step needs podman to run containers inside the root, which a chroot may not
  # allow; then the test skipped there (ctest says "***Skipped") and runs here instead.
  if grep -qE 'containers_node_test \.+\*\*\*Skipped|containers_node_test: skipped' "$dir/test.log"; then
    echo "fresh-check: podman could not run containers inside the fresh root" \
      "($(grep -m1 -oE 'containers_node_test: skipped.*' "$dir/test.log" || echo 'skipped'))"
    step containers-host "containers_node_test on the host, from the fresh root's build" \
      containers_on_host
  elif grep -qE 'containers_node_test \.+ +Passed' "$dir/test.log"; then
    results+=("containers: containers_node_test passed inside the fresh root")
  fi
fi

echo
echo "fresh-check of $commit on $(sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p' /etc/os-release), $(nproc) cores, $(date -u +%Y-%m-%d):"
for r in "${results[@]}"; do echo "  $r"; done
echo "  in all $(elapsed $((SECONDS - start))); logs in $dir"
exit "$status"
