#!/usr/bin/env bash
# shell_scripts_test: every tracked shell script of the project passes shellcheck (each remaining
# warning is disabled in the script with a comment saying why), and none ends a function or a
# loop with a test that may be false: under `set -e`, `[ -n "$x" ] && y` as a function's last
# command makes the function fail when the test is false, which ended containers/build.sh
# silently after its first image on a machine without old images (issue 35). Such statements
# are written as `if [ ... ]; then ...; fi`; a test followed by return, break, continue or exit
# is allowed, and so is one whose failure is handled (a line ending in || or &&, continued).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
command -v shellcheck >/dev/null ||
  { echo "shell_scripts_test: shellcheck is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }

# The shell scripts: tracked files whose first line names sh or bash.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t candidates < <(git ls-files)
else
  mapfile -t candidates < <(find . -path ./build -prune -o -type f -print | sed 's|^\./||')
fi
scripts=()
for f in "${candidates[@]}"; do
  [ -f "$f" ] || continue
  if head -n 1 "$f" | grep -qE '^#!.*[/ ](ba)?sh( |$)'; then scripts+=("$f"); fi
done
((${#scripts[@]} >= 10)) || { echo "shell_scripts_test: found only ${#scripts[@]} scripts" >&2; exit 1; }

status=0
shellcheck --severity=style "${scripts[@]}" || status=1
# A test and && as a statement of its own (not continued, not a jump).
if grep -nE '^\s*\[\[? .*\]\]? && ' "${scripts[@]}" |
  grep -vE '(\|\||&&|\\)\s*$' | grep -vE '\]\]? && (return|break|continue|exit)\b'; then
  echo "shell_scripts_test: the lines above end with a test that may be false under set -e;" \
    "write them as if [ ... ]; then ...; fi" >&2
  status=1
fi
if ((status == 0)); then echo "shell_scripts_test: ${#scripts[@]} scripts clean"; fi
exit "$status"
