#!/usr/bin/env bash
# Issue 16's acceptance on a GPU machine, in one command, from a build copied there:
#
#   scripts/gpu-acceptance.sh [-B BUILD_DIR] [--dry-run] [--no-append] [--iters N] [--steps abce]
#
#   (a) ctest -L gpu: the gpu-labelled tests (CUDA backend, shim programs native vs through
#       hiberd --device=cuda, the library_* programs included);
#   (b) hiber-coverage on the installed torch's lib/libtorch_cuda.so: what PyTorch imports that
#       Hiber only stubs or lacks (recorded, never a failure of this script);
#   (c) PyTorch (torch 2.11+cu130, no network): ResNet-50, ResNet-152 and a BERT-base-sized
#       encoder (scripts/torch_acceptance.py), each natively and then through the shim
#       (LD_PRELOAD of libhibercuda.so and the replacement libraries) against a
#       hiberd --device=cuda this script starts and stops; outputs compared bit for bit under
#       deterministic settings, warm latency per inference both ways and the ratio; every Hiber
#       stub a shim run hits ("<library>: <name> is not supported by Hiber" on its stderr) and
#       every call refused as not supported is listed by name (torch_acceptance.py stubs), and
#       fails the run: unlike (b)'s imports, these were called; then ResNet-50 through the shim
#       once more against a hiberd --isolation=shared, its warm latency against context mode's;
#   (d) the results, with the device name and the date, inserted at the top of
#       docs/gpu-runs.md (newest first; --no-append only prints them);
#   (e) a small GPT-style decoder (scripts/llm_acceptance.py): eager, the decode step as a CUDA
#       graph, expandable segments, the cudaMallocAsync backend, cuDNN attention and
#       torch.compile(mode="reduce-overhead"), each natively twice and through hiberd: tokens
#       identical, logits within native's run-to-run tolerance, no stub hit, tokens/s both ways;
#       the whole step within 180 s.
#
# --steps names the steps to run (default abce; the device tool's 10-minute calls take (a)+(b),
# then (c)). Each step runs under `timeout`, at most 600 s, and the whole run stops starting new steps at
# 40 minutes (HIBER_ACCEPTANCE_BUDGET_S, default 2400): what did not run is reported as skipped.
# Without a GPU it says so in one line and exits 3 before running anything; --dry-run prints
# what would run and checks the files it needs, on any machine.
# Exit status: 0 when every step that ran passed (stubs imported in (b) do not count; stubs hit
# in (c) do), 1 otherwise,
# 2 for wrong usage or a missing build, 3 without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

build=build/release
dry_run=0
append=1
iters=20
steps=abce
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --no-append) append=0; shift ;;
    --iters) iters=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-B BUILD_DIR] [--dry-run] [--no-append] [--iters N] [--steps abce]" >&2; exit 2 ;;
  esac
done

say() { echo "gpu-acceptance: $*" >&2; }

[[ -d $build ]] || { say "no build at $build (copy build/release here, or name one with -B)"; exit 2; }
build=$(cd "$build" && pwd)  # absolute: LD_PRELOAD and hiberd's paths must not depend on the cwd

start_s=$(date +%s)
budget_s=${HIBER_ACCEPTANCE_BUDGET_S:-2400}
# The timeout of the next step: at most CAP seconds (600), and no more than is left of the
# budget; 0 when too little is left to start one.
step_timeout() {
  local cap=${1:-600} left
  left=$((start_s + budget_s - $(date +%s)))
  if ((left < 30)); then echo 0; elif ((left < cap)); then echo "$left"; else echo "$cap"; fi
}

hiberd_bin=$build/server/hiberd
coverage_bin=$build/tools/hiber-coverage
shim_dir=$build/client_shim
preload=$shim_dir/libhibercuda.so
for library in libhibercublas.so libhibercublasLt.so libhibercudnn.so libhibernvml.so; do
  if [[ -e $shim_dir/$library ]]; then preload="$preload:$shim_dir/$library"; fi
done
missing=()
for f in "$build/CTestTestfile.cmake" "$hiberd_bin" "$coverage_bin" "$shim_dir/libhibercuda.so" \
         "$shim_dir/libhibercublas.so" "$shim_dir/libhibercublasLt.so" \
         "$shim_dir/libhibercudnn.so" scripts/torch_acceptance.py scripts/llm_acceptance.py; do
  [[ -e $f ]] || missing+=("$f")
done
if ((${#missing[@]} > 0)); then
  say "missing from the build: ${missing[*]} (build it: cmake --preset release && cmake --build --preset release)"
  exit 2
fi

work=$build/gpu-acceptance
out=$work/torch
report=$work/report.md

if ((dry_run)); then
  cat <<EOF
gpu-acceptance (dry run): build $build; every file it needs is there. It would run:
  (a) timeout 600 ctest --test-dir $build -L gpu --output-on-failure
      then timeout 120 $build/bench/context_bench --device=cuda --iterations=200 (recorded only)
  (b) timeout 300 $coverage_bin <torch>/lib/libtorch_cuda.so   (stubs recorded, not a failure)
  (c) hiberd --device=cuda --run_dir=<tmp> --cuda_library_path=<torch's nvidia/*/lib>:/usr/local/cuda/lib64
      then, for each of $(python3 scripts/torch_acceptance.py models | tr '\n' ' ')
        timeout 300 python3 scripts/torch_acceptance.py run --mode=native --model=M --out=$out --iters=$iters
        timeout 600 LD_PRELOAD=$preload HIBER_RUN_DIR=<tmp> python3 scripts/torch_acceptance.py run --mode=shim ...
        python3 scripts/torch_acceptance.py stubs --model=M --out=$out <its log>   (a stub hit fails the run)
      then a hiberd --isolation=shared and timeout 300 ... run --mode=shim-shared --model=resnet50
      and python3 scripts/torch_acceptance.py compare --out=$out
  (e) for each of $(python3 scripts/llm_acceptance.py variants | tr '\n' ' ')
        python3 scripts/llm_acceptance.py run --variant=V --mode=native (and native2), then
        LD_PRELOAD=$preload ... --mode=shim against a hiberd of its own; then compare (180 s in all)
  (d) the report ($report) $( ((append)) && echo "inserted at the top of docs/gpu-runs.md" || echo "printed only")
  budget: ${budget_s} s in all, each step at most 600 s
EOF
  exit 0
fi

# ---- A GPU? ----
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name=$(timeout 60 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
             head -1 | sed 's/, / (driver /; s/$/)/')
fi
if [[ -z $gpu_name ]]; then
  say "no GPU: nvidia-smi is missing or lists no GPU on $(hostname); nothing was run"
  exit 3
fi

rm -rf "$work"
mkdir -p "$out"
date_now=$(date -u '+%Y-%m-%d %H:%M UTC')
failed=0
{
  echo "## Issue 16 acceptance, $gpu_name ($date_now)"
  echo
  echo "\`scripts/gpu-acceptance.sh\` on $(hostname), build \`$build\` ($(git rev-parse --short HEAD 2>/dev/null || echo 'no git'))."
  echo
} >"$report"

# ---- (a) the gpu-labelled tests ----
t=$(step_timeout 600)
if [[ $steps != *a* ]]; then
  :
elif ((t == 0)); then
  echo "- (a) \`ctest -L gpu\`: skipped, out of time" >>"$report"
else
  say "(a) ctest -L gpu (timeout ${t}s)"
  timeout "$t" ctest --test-dir "$build" -L gpu --output-on-failure >"$work/ctest.log" 2>&1
  rc=$?
  summary=$(grep -E 'tests passed|tests failed' "$work/ctest.log" | tail -1)
  failures=$(sed -n '/The following tests FAILED/,$p' "$work/ctest.log" | grep -E '^\s+[0-9]+ - ' |
             sed 's/^\s*//' | paste -sd ';' -)
  if ((rc == 124)); then
    echo "- (a) \`ctest -L gpu\`: TIMED OUT after ${t}s" >>"$report"
    failed=1
  elif ((rc != 0)); then
    echo "- (a) \`ctest -L gpu\`: FAILED, $summary: $failures" >>"$report"
    failed=1
  else
    echo "- (a) \`ctest -L gpu\`: $summary" >>"$report"
  fi
  tail -40 "$work/ctest.log" >&2
  # What a context per instance costs on this GPU (docs/perf.md, "contexts"): recorded only.
  if [[ -x $build/bench/context_bench ]]; then
    if timeout 120 "$build/bench/context_bench" --device=cuda --iterations=200 \
      >"$work/context_bench.log" 2>&1; then
      figures=$(sed -n 's/^RESULT .*name=\([a-z_0-9]*\) value=\([0-9.]*\) unit=\([a-z]*\)$/\1 \2 \3/p' \
                "$work/context_bench.log" | paste -sd ';' -)
      echo "- (a) \`context_bench --device=cuda\`: $figures" >>"$report"
    else
      echo "- (a) \`context_bench --device=cuda\`: failed: $(tail -1 "$work/context_bench.log")" \
        >>"$report"
    fi
  fi
fi

# ---- torch ----
torch_dir=$(timeout 120 python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>"$work/torch-import.log")
if [[ -z $torch_dir ]]; then
  say "PyTorch is not importable with $(command -v python3): $(tail -1 "$work/torch-import.log")"
  echo "- (b), (c): skipped, PyTorch is not importable ($(tail -1 "$work/torch-import.log"))" >>"$report"
  failed=1
else
  torch_version=$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>/dev/null)
  echo "- torch: $torch_version at \`$torch_dir\`" >>"$report"

  # ---- (b) coverage of libtorch_cuda.so ----
  t=$(step_timeout 300)
  if [[ $steps != *b* ]]; then
    :
  elif ((t == 0)); then
    echo "- (b) hiber-coverage: skipped, out of time" >>"$report"
  else
    say "(b) hiber-coverage $torch_dir/lib/libtorch_cuda.so"
    timeout "$t" "$coverage_bin" "$torch_dir/lib/libtorch_cuda.so" >"$work/coverage.txt" 2>&1
    rc=$?
    gaps=$(grep -E '\s(stub|missing)$' "$work/coverage.txt")
    {
      echo "- (b) hiber-coverage (exit $rc; 1 means stubs or missing symbols, recorded below):" \
           "$(grep '^summary:' "$work/coverage.txt" || tail -1 "$work/coverage.txt")"
      if [[ -n $gaps ]]; then
        echo
        echo "  <details><summary>$(echo "$gaps" | wc -l) symbols PyTorch imports that Hiber stubs or lacks</summary>"
        echo
        echo '  ```'
        while IFS= read -r line; do echo "  $line"; done <<<"$gaps"
        echo '  ```'
        echo "  </details>"
        echo
      fi
    } >>"$report"
  fi

  # ---- (c) PyTorch natively and through the shim ----
  # hiberd runs the libraries PyTorch itself loads (its nvidia-* wheels), so both sides use the
  # same cuBLAS and cuDNN builds; the toolkit's come after.
  lib_dirs=$(python3 - "$torch_dir" <<'EOF'
import glob, os, sys
site = os.path.dirname(sys.argv[1])
dirs = []
for name in ("libcublas.so.13", "libcublasLt.so.13", "libcudnn.so.9"):
    for path in sorted(glob.glob(os.path.join(site, "nvidia", "**", name), recursive=True)):
        if os.path.dirname(path) not in dirs:
            dirs.append(os.path.dirname(path))
print(":".join(dirs))
EOF
)
  run_dir=$(mktemp -d /tmp/hiber-acceptance-XXXXXX)
  hiberd_log=$work/hiberd.log
  hiberd=""
  stop_hiberd() {
    if [[ -n $hiberd ]]; then
      kill -TERM "$hiberd" 2>/dev/null
      for _ in $(seq 100); do kill -0 "$hiberd" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$hiberd" 2>/dev/null
      wait "$hiberd" 2>/dev/null
      hiberd=""
    fi
  }
  trap 'stop_hiberd; rm -rf "$run_dir"' EXIT
  # start_hiberd [FLAGS...]: hiberd --device=cuda with FLAGS added.
  start_hiberd() {
    LD_LIBRARY_PATH="$lib_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$hiberd_bin" --device=cuda \
      --run_dir="$run_dir" --cuda_library_path="${lib_dirs:+$lib_dirs:}/usr/local/cuda/lib64" \
      "$@" >>"$hiberd_log" 2>&1 &
    hiberd=$!
    for _ in $(seq 1200); do  # up to 120 s: hiberd measures the link once at start
      [[ -S $run_dir/hiberd.sock ]] && return 0
      kill -0 "$hiberd" 2>/dev/null || break
      sleep 0.1
    done
    say "hiberd --device=cuda did not start; its log:"
    tail -50 "$hiberd_log" >&2
    stop_hiberd
    return 1
  }

  export CUBLAS_WORKSPACE_CONFIG=:4096:8  # before CUDA starts, in both runs
  models=$(python3 scripts/torch_acceptance.py models)
  [[ $steps == *c* ]] || models=""
  # Every native run first: hiberd takes the GPU's memory into its pools while it runs.
  for model in $models; do
    t=$(step_timeout 300)
    if ((t == 0)); then say "out of time before $model"; break; fi
    say "(c) $model natively (timeout ${t}s)"
    timeout "$t" python3 scripts/torch_acceptance.py run --mode=native --model="$model" \
      --out="$out" --iters="$iters" >>"$work/torch-native.log" 2>&1 ||
      say "$model natively failed (exit $?): $(tail -1 "$work/torch-native.log")"
  done
  for model in $models; do
    t=$(step_timeout 600)
    if ((t == 0)); then say "out of time before $model through the shim"; break; fi
    if [[ -z $hiberd ]] && ! start_hiberd; then
      echo "- (c) hiberd --device=cuda did not start (log: \`$hiberd_log\`): $(tail -1 "$hiberd_log")" >>"$report"
      failed=1
      break
    fi
    say "(c) $model through the shim (timeout ${t}s)"
    shim_log="$work/torch-shim-$model.log"
    timeout "$t" env HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="torch-$model" LD_PRELOAD="$preload" \
      python3 scripts/torch_acceptance.py run --mode=shim --model="$model" --out="$out" \
      --iters="$iters" >"$shim_log" 2>&1 ||
      say "$model through the shim failed (exit $?): $(tail -1 "$shim_log")"
    cat "$shim_log" >>"$work/torch-shim.log"
    # Every stub the run hit (the shim logs "<library>: <name> is not supported by Hiber" once per
    # name) and every call refused as not supported, into $out/$model.stubs.json for `compare`'s
    # "Hiber stubs hit" column, and into the report by name.
    if ! stubs=$(python3 scripts/torch_acceptance.py stubs --model="$model" --out="$out" "$shim_log"); then
      say "$model through the shim hit Hiber stubs or refusals:"
      printf '%s\n' "$stubs" >&2
      {
        echo "- (c) $model through the shim hit what Hiber does not support (docs/pytorch-coverage.md):"
        printf '%s\n' "$stubs" | sed 's/^/  - /'
      } >>"$report"
      failed=1
    fi
    if ! kill -0 "$hiberd" 2>/dev/null; then
      say "hiberd died during $model; its log:"
      tail -50 "$hiberd_log" >&2
      echo "- (c) hiberd died during $model: $(tail -1 "$hiberd_log")" >>"$report"
      hiberd=""
      failed=1
    fi
  done
  stop_hiberd
  # A warm inference in --isolation=shared against the runs above (context mode, the default):
  # ResNet-50 once more, against a hiberd of its own (issue 29's measure).
  t=$(step_timeout 300)
  if [[ $steps == *c* ]] && ((t > 0)) && [[ -s $out/resnet50.shim.json ]]; then
    if start_hiberd --isolation=shared; then
      say "(c) resnet50 through the shim, hiberd --isolation=shared (timeout ${t}s)"
      timeout "$t" env HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="torch-resnet50" \
        LD_PRELOAD="$preload" python3 scripts/torch_acceptance.py run --mode=shim-shared \
        --model=resnet50 --out="$out" --iters="$iters" >>"$work/torch-shim.log" 2>&1 ||
        say "resnet50 with --isolation=shared failed (exit $?): $(tail -1 "$work/torch-shim.log")"
      stop_hiberd
    fi
  fi

  if [[ $steps == *c* ]]; then {
    echo "- (c) PyTorch, batch 8, fp32, deterministic settings, median of $iters warm inferences" \
         "(hiberd's libraries: $(grep -ho 'lib[a-zA-Z]*\.so\.[0-9]* loaded from [^ ]*' "$hiberd_log" 2>/dev/null | sort -u | paste -sd ';' - || true)):"
    echo
    timeout 120 python3 scripts/torch_acceptance.py compare --out="$out" 2>&1 || failed=1
    echo
  } >>"$report"; fi

  # ---- (e) a small GPT decoder natively and through the shim (issue 31) ----
  # Every variant natively twice (the run-to-run tolerance), then through a hiberd of its own;
  # the whole step within 180 s (HIBER_LLM_STEP_S).
  if [[ $steps == *e* ]]; then
    llm_end=$(($(date +%s) + ${HIBER_LLM_STEP_S:-180}))
    llm_timeout() {  # at most $1 s, never past the step's end or the run's budget
      local t left
      t=$(step_timeout "$1")
      left=$((llm_end - $(date +%s)))
      ((left < t)) && t=$left
      ((t < 5)) && t=0
      echo "$t"
    }
    variants=$(python3 scripts/llm_acceptance.py variants)
    for variant in $variants; do
      for mode in native native2; do
        t=$(llm_timeout 60)
        if ((t == 0)); then say "(e) out of time before $variant $mode"; break 2; fi
        timeout "$t" python3 scripts/llm_acceptance.py run --variant="$variant" --mode="$mode" \
          --out="$out/llm" >>"$work/llm-native.log" 2>&1 ||
          say "(e) $variant $mode failed (exit $?): $(tail -1 "$work/llm-native.log")"
      done
    done
    for variant in $variants; do
      t=$(llm_timeout 90)
      if ((t == 0)); then say "(e) out of time before $variant through the shim"; break; fi
      if [[ -z $hiberd ]] && ! start_hiberd; then
        echo "- (e) hiberd --device=cuda did not start: $(tail -1 "$hiberd_log")" >>"$report"
        failed=1
        break
      fi
      llm_log=$work/llm-shim-$variant.log
      timeout "$t" env HIBER_RUN_DIR="$run_dir" HIBER_FUNCTION_ID="llm-$variant" \
        LD_PRELOAD="$preload" python3 scripts/llm_acceptance.py run --variant="$variant" \
        --mode=shim --out="$out/llm" >"$llm_log" 2>&1 ||
        say "(e) $variant through the shim failed (exit $?): $(tail -1 "$llm_log")"
      if ! stubs=$(python3 scripts/torch_acceptance.py stubs --model="llm-$variant" --out="$out" \
                   "$llm_log"); then
        {
          echo "- (e) $variant through the shim hit what Hiber does not support:"
          printf '%s\n' "$stubs" | sed 's/^/  - /'
        } >>"$report"
        failed=1
      fi
    done
    stop_hiberd
    {
      echo "- (e) a GPT-style decoder (8 layers, width 512, fp16, greedy, 64 tokens;" \
           "scripts/llm_acceptance.py), natively and through hiberd:"
      echo
      timeout 60 python3 scripts/llm_acceptance.py compare --out="$out/llm" 2>&1 || failed=1
      echo
    } >>"$report"
  fi
fi

echo "Exit status: $( ((failed)) && echo 'FAILED' || echo 'passed'). Logs: \`$work\`." >>"$report"
echo >>"$report"
cat "$report"

# ---- (d) into docs/gpu-runs.md, newest first: before the first run's heading ----
if ((append)); then
  python3 - "$report" docs/gpu-runs.md <<'EOF'
import sys
report, runs = open(sys.argv[1]).read(), sys.argv[2]
text = open(runs).read()
at = text.find("\n## ")
text = text + "\n" + report if at < 0 else text[:at + 1] + report + "\n" + text[at + 1:]
open(runs, "w").write(text)
EOF
  say "results inserted at the top of docs/gpu-runs.md"
fi
exit "$failed"
