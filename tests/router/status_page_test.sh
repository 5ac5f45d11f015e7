#!/bin/bash
# Loads hiber-router's status page (GET /) in headless Chromium and checks what it draws
# (docs/router.md, "Status page"). Two ways to run it:
#
#   against a router that runs:
#     status_page_test.sh --url=http://127.0.0.1:PORT [checks]
#   against a fixture server (status_fixture_server.py) serving the embedded page and a fixed
#   /v2/status; every number the JSON holds is then checked (status_dom_check.py --expect-json):
#     status_page_test.sh --page_dump=PATH/hiber_status_page_dump --fixture=FILE.json [checks]
#     status_page_test.sh --page_dump=... --fixture_unreachable --expect-unreachable
#     status_page_test.sh --page_dump=... --fixture=FILE.json --fixture_fail_after=1 \
#                         --expect-unreachable
#
# [checks] are status_dom_check.py's (--expect-function=fn-1, --expect-resident=n0/0:fn-1,
# --expect-swap=fn-1:nvlink, --expect-function-field=fn-1:requests=3, ...; see its --help).
# Other options: --chromium=PATH (default $CHROMIUM or /usr/bin/chromium), --budget_ms=N
# (Chromium's virtual time, default 3000: three polls), --keep (keep the temporary folder).
# Exit status 0 when every check holds.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
url="" fixture="" page_dump="" page="" unreachable=0 fail_after="" keep=0 budget_ms=3000
chromium=${CHROMIUM:-/usr/bin/chromium}
checks=()

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "status_page_test: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --url=*) url=${arg#*=} ;;
    --fixture=*) fixture=${arg#*=} ;;
    --fixture_unreachable) unreachable=1 ;;
    --fixture_fail_after=*) fail_after=${arg#*=} ;;
    --page_dump=*) page_dump=${arg#*=} ;;
    --page=*) page=${arg#*=} ;;
    --chromium=*) chromium=${arg#*=} ;;
    --budget_ms=*) budget_ms=${arg#*=} ;;
    --keep) keep=1 ;;
    --expect-*) checks+=("$arg") ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

[[ -x "$chromium" ]] || die "Chromium not found at '$chromium': install it (scripts/install-deps.sh" \
                            "does) or name it with --chromium=PATH or \$CHROMIUM"
command -v python3 >/dev/null || die "python3 not found"
if [[ -n "$url" ]]; then
  [[ -z "$fixture$page_dump$page" && $unreachable == 0 ]] ||
    die "--url checks a running router: no --fixture*, --page or --page_dump with it"
else
  [[ -n "$fixture" || $unreachable == 1 ]] || die "give --url, --fixture or --fixture_unreachable"
  [[ -n "$page_dump$page" ]] || die "fixture mode needs --page_dump=PROGRAM or --page=FILE"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hiber-status-page.XXXXXX") || die "mktemp failed"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  if [[ $keep == 1 ]]; then echo "status_page_test: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

if [[ -z "$url" ]]; then
  if [[ -n "$page_dump" ]]; then
    "$page_dump" > "$tmp/page.html" || die "$page_dump failed"
  else
    cp "$page" "$tmp/page.html" || die "cannot read $page"
  fi
  server_args=(--page="$tmp/page.html" --port_file="$tmp/port")
  if [[ -n "$fixture" ]]; then
    server_args+=(--status="$fixture")
    checks+=(--expect-json="$fixture")
  fi
  if [[ $unreachable == 1 ]]; then server_args+=(--unreachable); fi
  if [[ -n "$fail_after" ]]; then server_args+=(--fail_after="$fail_after"); fi
  python3 "$here/status_fixture_server.py" "${server_args[@]}" 2>"$tmp/server.log" &
  server_pid=$!
  # Wait for the server to listen: it writes the port file once bound.
  while [[ ! -s "$tmp/port" ]]; do
    kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log" >&2; die "fixture server exited"; }
    sleep 0.05
  done
  url="http://127.0.0.1:$(cat "$tmp/port")/"
fi

# A profile and HOME of its own: Chromium writes both, and runs under ctest in parallel.
mkdir -p "$tmp/home" "$tmp/profile"
HOME="$tmp/home" "$chromium" --headless=new --no-sandbox --disable-gpu --no-first-run \
  --user-data-dir="$tmp/profile" --virtual-time-budget="$budget_ms" --window-size=1400,900 \
  --dump-dom "$url" >"$tmp/dom.html" 2>"$tmp/chromium.log"
status=$?
if [[ $status != 0 || ! -s "$tmp/dom.html" ]]; then
  tail -20 "$tmp/chromium.log" >&2
  die "chromium exited with status $status and $(wc -c <"$tmp/dom.html") bytes of DOM for $url"
fi

echo "status_page_test: $url rendered, $(wc -c <"$tmp/dom.html") bytes of DOM"
if ! python3 "$here/status_dom_check.py" --dom="$tmp/dom.html" "${checks[@]}"; then
  keep=1
  die "checks failed; the DOM is $tmp/dom.html"
fi
