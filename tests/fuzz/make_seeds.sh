#!/usr/bin/env bash
# Remakes the fuzz harnesses' seed corpora (tests/fuzz/corpus/<harness>/) from real encoders:
#   handshake, call_batch, control_request: hiber_fuzz_seeds (the wire encoders; built by the
#     fuzz preset);
#   node_config: the configs in configs/nodes;
#   fatbin: nvcc on tests/fuzz/seed_kernels.cu (plain, LZ4 and Zstandard fatbins, a PTX-only
#     fatbin, a cubin and PTX text). Needs the CUDA toolkit (HIBER_CUDA_ROOT, default
#     /usr/local/cuda); without it the fatbin seeds are left as they are.
# Usage: tests/fuzz/make_seeds.sh   (from anywhere; builds the fuzz preset's seed writer first)
set -euo pipefail
cd "$(dirname "$0")/../.."
corpus=tests/fuzz/corpus

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target hiber_fuzz_seeds >/dev/null
# Inputs that once found a bug (regression-*) are kept: CI replays them every run.
for h in handshake call_batch control_request; do
  if [[ -d $corpus/$h ]]; then find "$corpus/$h" -type f ! -name 'regression-*' -delete; fi
done
build/fuzz/tests/fuzz/hiber_fuzz_seeds "$corpus"

rm -rf "$corpus/node_config" && mkdir -p "$corpus/node_config"
cp configs/nodes/*.json "$corpus/node_config/"

nvcc="${HIBER_CUDA_ROOT:-/usr/local/cuda}/bin/nvcc"
if [[ ! -x $nvcc ]]; then
  echo "make_seeds: no nvcc at $nvcc; fatbin seeds left as they are" >&2
  exit 0
fi
out="$corpus/fatbin"
rm -rf "$out" && mkdir -p "$out"
src=tests/fuzz/seed_kernels.cu
arch=(-gencode 'arch=compute_80,code=sm_80' -gencode 'arch=compute_80,code=compute_80')
"$nvcc" --fatbin "${arch[@]}" -Xfatbin=-compress=false "$src" -o "$out/plain.fatbin"
"$nvcc" --fatbin "${arch[@]}" -Xfatbin=-compress-all "$src" -o "$out/zstd.fatbin"
"$nvcc" --fatbin "${arch[@]}" -Xfatbin=-compress-all -Xfatbin=-compress-mode=speed "$src" \
  -o "$out/lz4.fatbin"
"$nvcc" --fatbin -gencode arch=compute_80,code=compute_80 -Xfatbin=-compress=false "$src" \
  -o "$out/ptx_only.fatbin"
"$nvcc" --cubin -arch=sm_80 "$src" -o "$out/kernels.cubin"
"$nvcc" --ptx -arch=compute_80 "$src" -o "$out/kernels.ptx"
ls -l "$corpus"/*
