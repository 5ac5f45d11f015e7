#!/usr/bin/env bash
# Runs the README's "Running" examples as written, against the build under test: the lines are
# read from README.md itself (the sh block under "## Running"), so the README cannot drift from
# what runs. `build/release/` in a line is the build folder under test; a sanitizer build
# preloads its runtime before the shim, as the shim tests do. Each line must exit 0.
#
#   readme_running_test.sh BUILD_DIR [SANITIZER_RUNTIME]
#
# Lines that do not run here, each with its reason printed:
#   - `hiberd --device=cuda`: needs a GPU and its driver (none on this machine: skipped);
#   - `./scripts/evaluate.sh`: every experiment of the paper, hours on 2 cores, and it rewrites
#     docs/evaluation.md (the experiments have their own tests under tests/sim);
#   - `./my_cuda_program` is the reader's program: tests/shim/programs/vector_add stands in for
#     it (when the CUDA toolkit built it). On simulated GPUs a kernel runs only with a host
#     implementation (the README says so): the sim hiberd gets the stand-in's, the test programs'
#     plugin (--sim_kernel_plugins), as demo.sh does.
# `hiberd --device=sim` runs in the background (it serves until stopped) in a run directory of
# the test's own, and every later line finds it through $HIBER_RUN_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: readme_running_test.sh BUILD_DIR [SANITIZER_RUNTIME]}" && pwd)
runtime=${2:-}

work=$(mktemp -d /tmp/hiber-readme-XXXXXX)
export HIBER_RUN_DIR="$work/run"
mkdir -p "$HIBER_RUN_DIR"
cleanup() {
  local pids
  pids=$(jobs -p)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086 # one word per process id
    kill $pids 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The sh block of the "## Running" section.
mapfile -t lines < <(awk '
  /^## / { in_section = ($0 == "## Running") }
  in_section && /^```sh$/ { in_block = 1; next }
  in_block && /^```$/ { exit }
  in_block && NF { print }
' "$root/README.md")
if [ "${#lines[@]}" -lt 5 ]; then
  echo "readme_running_test: found ${#lines[@]} lines in README.md's Running block" >&2
  exit 1
fi

program="$build/tests/shim/programs/vector_add"
plugin="$build/tests/shim/libhiber_shim_programs_plugin.so"
shim_preload="$build/client_shim/libhibercuda.so"
if [ -n "$runtime" ]; then shim_preload="$runtime:$shim_preload"; fi

cd "$root"
ran=0
for line in "${lines[@]}"; do
  command=${line%%#*}  # comments are the README's explanations
  command=${command%"${command##*[![:space:]]}"}
  [[ -n "$command" ]] || continue
  case "$command" in
    *--device=cuda*)
      echo "readme_running_test: skipped (needs a GPU): $command"
      continue ;;
    *scripts/evaluate.sh*)
      echo "readme_running_test: skipped (hours on 2 cores; rewrites docs/evaluation.md): $command"
      continue ;;
  esac
  command=${command//build\/release\//$build/}
  if [[ "$command" == *./my_cuda_program* ]]; then
    if [ ! -x "$program" ]; then
      echo "readme_running_test: skipped (no nvcc-built stand-in for ./my_cuda_program): $command"
      continue
    fi
    command=${command//.\/my_cuda_program/$program}
    command=${command//LD_PRELOAD=$build\/client_shim\/libhibercuda.so/LD_PRELOAD=$shim_preload}
  fi
  echo "readme_running_test: + $command"
  if [[ "$command" == *"/server/hiberd --device=sim"* ]]; then
    if [ -f "$plugin" ]; then command+=" --sim_kernel_plugins=$plugin"; fi
    # Serves until stopped: in the background, ready once its control socket answers.
    bash -c "$command" > "$work/hiberd.log" 2>&1 &
    for _ in $(seq 1 300); do
      if "$build/tools/hiberctl" ping > /dev/null 2>&1; then break; fi
      sleep 0.1
    done
    if ! "$build/tools/hiberctl" ping; then
      echo "readme_running_test: hiberd did not start:" >&2
      cat "$work/hiberd.log" >&2
      exit 1
    fi
  elif [[ "$command" == *"&" ]]; then
    bash -c "${command%&}" &
  elif ! bash -c "$command"; then
    echo "readme_running_test: FAILED: $line" >&2
    echo "hiberd's log:" >&2
    cat "$work/hiberd.log" >&2 || true
    exit 1
  fi
  ran=$((ran + 1))
done
echo "readme_running_test: ${ran} README lines ran"
