#!/usr/bin/env bash
# Reports where Hiber's C++ departs from .clang-format (clang-format-14 --dry-run) and
# .clang-tidy (clang-tidy-14, with Clang's -Wthread-safety for the GUARDED_BY annotations of
# common/thread_annotations.h). It changes no file. See docs/contributing.md.
#
# Usage: scripts/lint.sh [--format | --tidy] [--since REV] [FILE...]
#   --format, --tidy  run only that half (default: both)
#   --since REV       only the files changed since REV (for example origin/main)
#   FILE...           only these files (default: every tracked C++ and CUDA source)
# clang-tidy reads build/release/compile_commands.json: run `cmake --preset release` first.
# JOBS sets how many clang-tidy processes run at once (default: nproc).
# Exit status: 0 when nothing was reported, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

format=1 tidy=1 since="" files=()
while (($#)); do
  case "$1" in
    --format) tidy=0 ;;
    --tidy) format=0 ;;
    --since) since=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) files+=("$1") ;;
  esac
  shift
done

sources=('*.cc' '*.h' '*.cu' '*.cuh')
if ((${#files[@]} == 0)); then
  if [[ -n $since ]]; then
    mapfile -t files < <(git diff --name-only --diff-filter=d "$since" -- "${sources[@]}")
  else
    mapfile -t files < <(git ls-files -- "${sources[@]}")
  fi
fi
if ((${#files[@]} == 0)); then
  echo "lint: no files to check"
  exit 0
fi

status=0
if ((format)); then
  echo "== clang-format-14 (${#files[@]} files)"
  bad=0
  for f in "${files[@]}"; do
    n=$(clang-format-14 --dry-run "$f" 2>&1 | grep -c 'warning:' || true)
    if ((n > 0)); then
      echo "$f: $n lines to reformat (clang-format-14 $f | diff $f -)"
      bad=$((bad + 1))
    fi
  done
  echo "clang-format: $bad of ${#files[@]} files differ"
  ((bad == 0)) || status=1
fi

if ((tidy)); then
  db=build/release/compile_commands.json
  if [[ ! -f $db ]]; then
    echo "lint: $db is missing; run cmake --preset release" >&2
    exit 1
  fi
  # Only translation units have compile commands; headers are checked through them.
  mapfile -t units < <(printf '%s\n' "${files[@]}" | grep -E '\.cc$' |
                       while read -r f; do grep -q "\"file\": \"$PWD/$f\"" "$db" && echo "$f"; done)
  echo "== clang-tidy-14 (${#units[@]} translation units)"
  if ((${#units[@]} > 0)); then
    log=$(mktemp)
    printf '%s\n' "${units[@]}" |
      xargs -P "${JOBS:-$(nproc)}" -I{} clang-tidy-14 -p build/release --quiet \
        --extra-arg=-Wthread-safety {} >"$log" 2>/dev/null || true
    grep -E '(warning|error):' "$log" | sort -u || true
    n=$(grep -cE '(warning|error):' "$log" || true)
    echo "clang-tidy: $n findings"
    ((n == 0)) || status=1
    rm -f "$log"
  fi
fi
exit $status
