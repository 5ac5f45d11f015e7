#!/usr/bin/env bash
# Regenerates docs/evaluation.md and its plots: builds hiber-sim (Release), runs every
# experiment of the Torpor paper in the simulator (CSV files under docs/evaluation/), renders the
# PNG plots with gnuplot, and writes the report with our numbers beside the paper's.
#
#   scripts/evaluate.sh                 build in build/release, run everything (a few minutes on
#                                       16 cores; the seeds table alone is 140 runs of 11 minutes)
#   scripts/evaluate.sh -B DIR          another build folder
#   scripts/evaluate.sh --no-build      use the hiber-sim already built there
#   scripts/evaluate.sh --time_scale=0.2 --seed=3    passed on to hiber-sim
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

build_dir=build/release
build=1
sim_args=()
while (($#)); do
  case "$1" in
    -B) build_dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) sim_args+=("$1"); shift ;;
  esac
done

if ! command -v gnuplot >/dev/null; then
  echo "evaluate: gnuplot is missing; run scripts/install-deps.sh" >&2
  exit 1
fi

if ((build)); then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build_dir" --target hiber-sim -j "$(nproc)"
fi
sim="$build_dir/sim/hiber-sim"

out="$root/docs/evaluation"
mkdir -p "$out"
start=$(date +%s)
# The paper's figures are of its 4x V100 node, named explicitly (the library default is H100).
"$sim" --experiment=all --node_config=torpor-4gpu --out="$out" --report="$root/docs/evaluation.md" \
  --threads="$(nproc)" "${sim_args[@]}"
echo "evaluate: experiments took $(($(date +%s) - start)) s"

cd sim/plots
for plot in fig10 fig11 fig12 fig14a fig14b caching queue; do
  gnuplot -e "dir='$out'; out='$out/$plot.png'" "$plot.gp"
  echo "evaluate: wrote docs/evaluation/$plot.png"
done
