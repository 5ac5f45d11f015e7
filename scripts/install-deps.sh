#!/usr/bin/env bash
# Installs everything Hiber needs to build and test on Debian 12, from Debian's archive only.
# Idempotent: packages already present are left alone. Runs apt-get through sudo when not root.
# The CUDA toolkit is not a Debian package and is not installed here: where it is found
# (/usr/local/cuda, or cmake -DHIBER_CUDA_ROOT=...) the shim and the CUDA test programs are
# built; elsewhere they are skipped (README, "Building by hand").
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  clang-14 libfuzzer-14-dev       # the fuzz preset: libFuzzer harnesses (tests/fuzz, scripts/fuzz.sh)
  capnproto libcapnp-dev          # wire schemas and config files (JSON through capnp-json)
  liburing-dev                    # hiberd socket and control I/O
  libgflags-dev libgoogle-glog-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  gnuplot-nox                     # hiber-sim's plots (scripts/evaluate.sh; pngcairo terminal)
  libzstd-dev liblz4-dev          # compressed fatbins (nvcc 12.8+ uses zstd, older nvcc lz4)
  libssl-dev                      # SHA-256 (libcrypto) for hiberd's module cache; TLS (libssl) for hiber-inject
  openssl                         # hiber-inject's test makes a self-signed certificate (openssl req)
  libelf-dev                      # hiber-coverage reads ELF dynamic symbols (elfutils libelf)
  procps psmisc                   # pgrep/kill in the demo and integration scripts
  libboost-dev                    # Boost.Beast and Asio: hiber-router's HTTP server and clients
  nlohmann-json3-dev              # JSON bodies of the invocation API and the router's registry
  prometheus-cpp-dev              # /metrics on hiber-router and hiberd
  chromium                        # the status page's test renders it headless
  wrk                             # bench/: the router's invocation rate and latency
  python3                         # the Python function SDK and its tests
  python3-kubernetes python3-yaml # containers/k8s/validate.py: the manifests against the API's models
  podman runc                     # containers/: the images and the node under podman (runc:
                                  # crun refuses hybrid cgroup hierarchies, docs/deploy.md)
  mmdebstrap                      # containers/build.sh: the images' Debian base roots
  patchelf                        # containers/build.sh: the shim folder finds its own libraries
  curl                            # containers/run-node.sh and its test talk HTTP to the router
  git                             # containers/build.sh labels the images with the commit
  shellcheck                      # tests/scripts: the project's shell scripts are checked
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
