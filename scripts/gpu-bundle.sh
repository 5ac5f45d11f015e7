#!/usr/bin/env bash
# Carries a release build (what `ctest -L gpu`, bench/ and scripts/gpu-acceptance.sh run) to a lent GPU machine (the device tool moves at most 64 MiB, and that
# machine has none of Hiber's Debian libraries).
#
#   scripts/gpu-bundle.sh pack   [-B BUILD_DIR]  # here: .gpu/release (stripped, no objects) and
#                                                # .gpu/lib (every non-glibc library it links)
#   source scripts/gpu-bundle.sh unpack          # there: build/release from .gpu/release, the
#                                                # build's absolute paths valid again, and
#                                                # LD_LIBRARY_PATH naming only the libraries that
#                                                # machine lacks (its own newer ones win)
#
# .gpu/ is ignored by git (.gitignore); name it in the device tool's `carry`.
set -uo pipefail

bundle_pack() {
  local build=build/release
  if [[ ${1:-} == -B ]]; then build=$2; fi
  [[ -f $build/CTestTestfile.cmake ]] || { echo "gpu-bundle: no build at $build" >&2; return 2; }
  rm -rf .gpu
  mkdir -p .gpu/lib
  # Everything but compiler outputs that nothing runs: objects, archives, dependency files.
  cp -a "$build" .gpu/release
  # The GPU machine runs `ctest -L gpu`, the benchmarks and hiberd: not the CPU-only suites
  # (of tests/integration only kernel_isolation_test, whose CUDA test is gpu-labelled), nor the
  # container images (containers/build.sh's stage), which would take the bundle past 64 MiB.
  rm -rf .gpu/release/gpu-acceptance .gpu/release/tests/{unit,sim,router,containers} \
    .gpu/release/containers-stage .gpu/release/containers
  find .gpu/release/tests/integration -mindepth 1 -maxdepth 1 ! -name kernel_isolation_test \
    ! -name CTestTestfile.cmake -exec rm -rf {} +
  find .gpu/release -type f \( -name '*.o' -o -name '*.a' -o -name '*.d' -o -name '.ninja_*' \) -delete
  # The absolute path the build was configured in: CTestTestfile.cmake and RUNPATHs name it.
  (cd "$build/../.." && pwd) >.gpu/source_dir
  (cd "$build" && pwd) >.gpu/build_dir
  local f
  while IFS= read -r f; do
    if file -b "$f" | grep -q '^ELF'; then
      strip --strip-debug "$f" 2>/dev/null || true
      ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
    fi
  done < <(find .gpu/release -type f -perm -u+x -o -type f -name '*.so*') | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    grep -vE '^/usr/local/cuda' | xargs -r cp -L -t .gpu/lib
  du -sh .gpu/release .gpu/lib
}

bundle_unpack() {
  [[ -d .gpu/release ]] || { echo "gpu-bundle: no .gpu/release (carry .gpu)" >&2; return 2; }
  local source_dir build_dir here lib
  source_dir=$(cat .gpu/source_dir)
  build_dir=$(cat .gpu/build_dir)
  here=$(pwd)
  if [[ $here != "$source_dir" ]]; then
    mkdir -p "$(dirname "$source_dir")"
    ln -sfn "$here" "$source_dir"
  fi
  rm -rf "$build_dir"
  mkdir -p "$(dirname "$build_dir")"
  cp -a .gpu/release "$build_dir"
  # Only what this machine lacks: its own (newer) libz or libcrypto must stay in a PyTorch process.
  mkdir -p /tmp/hiber-lib
  for lib in .gpu/lib/*; do
    ldconfig -p | grep -q "^\s*$(basename "$lib") " || cp -L "$lib" /tmp/hiber-lib/
  done
  export LD_LIBRARY_PATH="/tmp/hiber-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu-bundle: build at $build_dir; carried libraries used: $(find /tmp/hiber-lib -mindepth 1 -printf '%f\n' | sort | paste -sd ' ' -)" >&2
}

case "${1:-}" in
  pack) shift; bundle_pack "$@" ;;
  unpack) bundle_unpack ;;
  *) echo "usage: scripts/gpu-bundle.sh pack [-B BUILD_DIR] | source scripts/gpu-bundle.sh unpack" >&2 ;;
esac
