#!/usr/bin/env bash
# Builds Hiber's container images from Debian 12 packages and a build folder (docs/deploy.md,
# "Building the images"):
#   localhost/hiber/base, base-python   mmdebstrap --variant=minbase bookworm roots holding only
#                                        the runtime libraries Hiber's binaries need (and python3)
#   localhost/hiber/hiberd              hiberd, hiberctl, configs/nodes
#   localhost/hiber/router              hiber-router, hiber-load, hiberctl, hiber-inject (the
#                                        admission webhook, docs/deploy.md)
#   localhost/hiber/function-base       the shim folder (/opt/hiber/shim), the C++ and Python
#                                        SDKs, python3, the worker entrypoint
#   localhost/hiber/mlp-function        the demo's inference function (mlp_server, a CUDA
#                                        program) on hiber/base: no shim inside, it is injected
#   localhost/hiber/pytorch-function    containers/pytorch-function, built FROM hiber/base-python
#                                        here (no registry is reachable; the default base is
#                                        PyTorch's CUDA 13 image)
#
# Usage: containers/build.sh [--build_dir=DIR] [--tag=TAG] [--rebuild_base] [--build_only]
#   --build_dir   the build folder the binaries come from (default build/release, built here
#                 first with the release preset; another folder is used as it is)
#   --tag         the images' tag (default: the project version, e.g. 0.1.0)
#   --rebuild_base  run mmdebstrap again even if the base images exist
# A base image is reused only when its label org.hiber.base-key matches the hash of what makes
# it (the package list and the mmdebstrap command), not by its tag alone.
#   --build_only  only build the binaries the images need (release preset), no image
# Every image carries the OCI labels org.opencontainers.image.version, .revision (git commit)
# and .created (build date). Prints each image's size at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/containers/containers.conf}

build_dir=""
tag=""
rebuild_base=0
build_only=0
for arg in "$@"; do
  case "$arg" in
    --build_dir=*) build_dir=${arg#*=} ;;
    --tag=*) tag=${arg#*=} ;;
    --rebuild_base) rebuild_base=1 ;;
    --build_only) build_only=1 ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument '$arg' (--help lists them)" >&2; exit 2 ;;
  esac
done

fail() { echo "build.sh: $*" >&2; exit 1; }

version=$(sed -n 's/^project(hiber .*VERSION \([0-9.]*\)).*/\1/p' CMakeLists.txt)
tag=${tag:-$version}
# The base roots depend on the package list alone: one pair per project version, whatever --tag.
base_tag=$version
revision=$(git rev-parse HEAD)
git diff --quiet HEAD 2>/dev/null || revision+="-dirty"
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
labels=(--label "org.opencontainers.image.version=$version"
        --label "org.opencontainers.image.revision=$revision"
        --label "org.opencontainers.image.created=$created"
        --label "org.opencontainers.image.source=hiber")

if [ -z "$build_dir" ]; then
  build_dir=build/release
  cmake --preset release >/dev/null
  targets=(hiberd hiberctl hiber-router hiber-load hiber-echo-worker hiber-inject)
  # The shim and mlp_server need the CUDA toolkit at build time (not a GPU).
  if grep -q 'hibercuda' build/release/build.ninja; then
    targets+=(hibercuda hibercuda_driver hibercublas hibercublasLt hibercudnn hibernvml
              hiber_shim_programs hiber_shim_programs_plugin)
  fi
  cmake --build --preset release --target "${targets[@]}"
fi
[ "$build_only" = 1 ] && exit 0
for tool in podman mmdebstrap patchelf git; do
  command -v "$tool" >/dev/null || fail "$tool is missing; scripts/install-deps.sh installs it"
done
build_dir=$(cd "$build_dir" && pwd) || fail "no build folder $build_dir"

# ---- Staging: each image's files, at the paths they take in the image ----
stage=$build_dir/containers-stage
rm -rf "$stage"
mkdir -p "$stage"
# put SRC DEST: copies a file, failing with the way to build it when it is missing.
put() {
  [ -f "$1" ] || fail "$1 is missing: build it (cmake --build --preset release --target $(basename "$1")), or give --build_dir"
  mkdir -p "$(dirname "$2")"
  cp -L "$1" "$2"
}
b=$build_dir
put "$b/server/hiberd" "$stage/hiberd/usr/bin/hiberd"
put "$b/tools/hiberctl" "$stage/hiberd/usr/bin/hiberctl"
# The host implementations of the demo programs' kernels, for --device=sim
# (--sim_kernel_plugins; containers/run-node.sh), when they were built.
plugin=$b/tests/shim/libhiber_shim_programs_plugin.so
if [ -f "$plugin" ]; then put "$plugin" "$stage/hiberd/usr/lib/hiber/$(basename "$plugin")"; fi
mkdir -p "$stage/hiberd/etc/hiber"
cp -r configs/nodes "$stage/hiberd/etc/hiber/nodes"
put "$b/router/hiber-router" "$stage/router/usr/bin/hiber-router"
put "$b/tools/hiber-load" "$stage/router/usr/bin/hiber-load"
put "$b/tools/hiberctl" "$stage/router/usr/bin/hiberctl"
put "$b/containers/webhook/hiber-inject" "$stage/router/usr/bin/hiber-inject"
# The README demo's trace, for hiber-load inside the router's image.
put sim/data/azure_demo.csv "$stage/router/usr/share/hiber/azure_demo.csv"

# The function base: the SDKs, the worker entrypoint, the no-op worker, and the shim folder.
fb=$stage/function-base
sdk=$fb/opt/hiber/sdk
for f in router/function_sdk.h router/function_sdk.cc router/function_sdk_kserve.cc \
  router/worker_protocol.h router/worker_protocol.cc common/status.h common/status.cc; do
  put "$f" "$sdk/cpp/$f"
done
put router/python/hiber_function.py "$sdk/python/hiber_function.py"
put router/python/echo_worker.py "$sdk/python/echo_worker.py"
put containers/function-base/hiber-function "$fb/usr/bin/hiber-function"
put "$b/router/hiber-echo-worker" "$fb/usr/bin/hiber-echo-worker"
have_shim=0
if [ -f "$b/client_shim/libhibercuda.so" ]; then
  have_shim=1
  shim=$fb/opt/hiber/shim
  for library in libhibercuda.so libhibercublas.so libhibercublasLt.so libhibercudnn.so \
    libhibernvml.so; do
    put "$b/client_shim/$library" "$shim/$library"
  done
  put "$b/client_shim/driver/libcuda.so.1" "$shim/driver/libcuda.so.1"
  # The shim's own dependencies, except glibc, libstdc++ and libgcc_s, which the function's
  # image provides (a second copy of them in one process would clash). Each library finds the
  # others through its RUNPATH, so the function's LD_LIBRARY_PATH stays its own.
  mkdir -p "$shim/deps"
  for lib in $(ldd "$shim/libhibercuda.so" "$shim/driver/libcuda.so.1" | awk '$3 ~ /^\// {print $3}' |
    sort -u); do
    case "$(basename "$lib")" in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | \
        libstdc++.so.* | libgcc_s.so.*) ;;
      *) cp -L "$lib" "$shim/deps/" ;;
    esac
  done
  # shellcheck disable=SC2016  # $ORIGIN is the dynamic loader's, not the shell's
  for f in "$shim"/*.so "$shim/driver/libcuda.so.1"; do patchelf --set-rpath '$ORIGIN/deps:$ORIGIN/../deps' "$f"; done
  # shellcheck disable=SC2016  # as above
  for f in "$shim"/deps/*; do patchelf --set-rpath '$ORIGIN' "$f"; done
  put "$b/tests/shim/programs/mlp_server" "$stage/mlp-function/usr/bin/mlp_server"
else
  echo "build.sh: the CUDA toolkit was absent at build time: no shim, so hiber/function-base" \
    "has none and hiber/mlp-function is not built"
fi
put containers/pytorch-function/handler.py "$stage/pytorch-function/handler.py"

# ---- The base roots: Debian 12 minbase and the runtime libraries, from ldd and dpkg -S ----
runtime_packages=(
  libgoogle-glog0v6 libgflags2.2 libunwind8    # logging and flags
  libcapnp-0.9.2                               # wire schemas, config files
  liburing2                                    # hiberd's socket and control I/O
  libzstd1 liblz4-1                            # compressed fatbins
  libssl3                                      # SHA-256 (libcrypto)
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1  # /metrics
  # The root is merged when mmdebstrap is done: usr-is-merged stands for usrmerge, which
  # brings perl (47 MB), purged below.
  usr-is-merged
)
base_image() {  # NAME EXTRA_PACKAGES...
  local name=$1
  shift
  # What makes the root: the packages and this function's text (the mmdebstrap command).
  local key
  key=$({ declare -p runtime_packages; declare -f base_image; echo "$name $*"; } | sha256sum |
    cut -c1-32)
  local ref=localhost/hiber/$name:$base_tag
  if [ "$rebuild_base" = 0 ] &&
    [ "$(podman image inspect -f '{{index .Labels "org.hiber.base-key"}}' "$ref" 2>/dev/null)" = "$key" ]; then
    echo "build.sh: hiber/$name:$base_tag exists with key $key (--rebuild_base builds it again)"
    return
  fi
  local include
  include=$(IFS=,; echo "${runtime_packages[*]} $*" | tr ' ' ',' | sed 's/,,*/,/g; s/,$//')
  echo "build.sh: mmdebstrap --variant=minbase bookworm with $include"
  # No documentation, no package lists; users hiber (10000: hiberd, the router) and function
  # (10001: function workers), so that the images run as non-root.
  # shellcheck disable=SC2016  # "$1" in a hook is the root, expanded by mmdebstrap's shell
  mmdebstrap --variant=minbase --include="$include" --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='echo "hiber:x:10000:10000:hiber:/nonexistent:/usr/sbin/nologin" >>"$1/etc/passwd"' \
    --customize-hook='echo "hiber:x:10000:" >>"$1/etc/group"' \
    --customize-hook='echo "function:x:10001:10001:function:/nonexistent:/usr/sbin/nologin" >>"$1/etc/passwd"' \
    --customize-hook='echo "function:x:10001:" >>"$1/etc/group"' \
    --customize-hook='chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36 perl-modules-5.36 >/dev/null' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    bookworm "$build_dir/containers-$name.tar" >"$build_dir/containers-$name.log" 2>&1 ||
    fail "mmdebstrap failed; its log: $build_dir/containers-$name.log"
  podman import --change 'CMD ["/bin/bash"]' \
    --change "LABEL org.opencontainers.image.version=$version" \
    --change "LABEL org.opencontainers.image.revision=$revision" \
    --change "LABEL org.opencontainers.image.created=$created" \
    --change "LABEL org.hiber.base-key=$key" \
    "$build_dir/containers-$name.tar" "$ref" >/dev/null
  rm -f "$build_dir/containers-$name.tar"
}
base_image base
base_image base-python python3

# ---- The images, from the Containerfiles under containers/ ----
image() {  # NAME CONTAINERFILE CONTEXT [build args...]
  local name=$1 file=$2 context=$3
  shift 3
  echo "build.sh: hiber/$name"
  local old
  old=$(podman image inspect -f '{{.Id}}' "localhost/hiber/$name:$tag" 2>/dev/null || true)
  podman build --quiet "${labels[@]}" --build-arg "BASE_TAG=$base_tag" "$@" -f "$file" \
    -t "localhost/hiber/$name:$tag" "$context" >/dev/null
  if [ -n "$old" ]; then replaced+=("$old"); fi
}
replaced=()  # the images these replace, removed at the end
image hiberd containers/hiberd/Containerfile "$stage/hiberd"
image router containers/router/Containerfile "$stage/router"
image function-base containers/function-base/Containerfile "$stage/function-base"
if [ "$have_shim" = 1 ]; then
  image mlp-function containers/mlp-function/Containerfile "$stage/mlp-function"
fi
image pytorch-function containers/pytorch-function/Containerfile "$stage/pytorch-function" \
  --build-arg "BASE=localhost/hiber/base-python:$base_tag" \
  --build-arg "SDK_IMAGE=localhost/hiber/function-base:$tag"
# Those now untagged (one that was rebuilt identically keeps its tag), unless a container
# still uses them; and the untagged stage the PyTorch template's multi-stage build commits (it
# carries this run's labels).
for id in "${replaced[@]}"; do
  if [ -z "$(podman image inspect -f '{{join .RepoTags ","}}' "$id" 2>/dev/null)" ]; then
    podman rmi "$id" >/dev/null 2>&1 || true
  fi
done
podman images --filter dangling=true --filter "label=org.opencontainers.image.created=$created" \
  --quiet | xargs -r podman rmi >/dev/null 2>&1 || true

echo
echo "images (tag $tag, revision $revision):"
for ref in "localhost/hiber/base*:$base_tag" "localhost/hiber/*:$tag"; do
  podman images --filter "reference=$ref" --format '{{.Repository}}:{{.Tag}}  {{.Size}}'
done | sort -u
