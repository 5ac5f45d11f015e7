#!/usr/bin/env bash
# Runs hiber-sim over seeds 1..N (two at a time, niced) with the given flags and prints one line
# per seed and a summary: mean, sd, min and max of the SLO-compliant share, the lowest model
# class (compliant functions of that class, worst seed), and the rejected requests.
#   scripts/seeds.sh [-n N] [hiber-sim flags...]   e.g. scripts/seeds.sh -n 10 --queue=fifo
set -euo pipefail
n=10
if [[ "${1:-}" == "-n" ]]; then n="$2"; shift 2; fi
sim="${HIBER_SIM:-build/release/sim/hiber-sim}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
run() { nice "$sim" --functions=560 --node_config=torpor-4gpu --seed="$1" "${@:2}" >"$tmp/$1" 2>&1; }
for ((s = 1; s <= n; s += 2)); do
  run "$s" "$@" &
  if ((s + 1 <= n)); then run $((s + 1)) "$@" & fi
  wait
done
for ((s = 1; s <= n; ++s)); do
  grep -q "SLO-compliant" "$tmp/$s" || { echo "seed $s failed:"; tail -5 "$tmp/$s"; exit 1; }
done
python3 - "$tmp" "$n" <<'PY'
import re, statistics, sys
tmp, n = sys.argv[1], int(sys.argv[2])
shares, worst, rejected = [], {}, []
for s in range(1, n + 1):
    text = open(f"{tmp}/{s}").read()
    c, f = map(int, re.search(r"SLO-compliant: (\d+) of (\d+)", text).groups())
    shares.append(100.0 * c / f)
    rej = int(re.search(r" rejected (\d+)", text).group(1))
    rejected.append(rej)
    by = re.findall(r" (\w+) (\d+)/(\d+)", text.split("compliant by model:")[1].splitlines()[0])
    for name, a, b in by:
        worst[name] = min(worst.get(name, 10**9), int(a))
    print(f"seed {s}: {shares[-1]:.1f}% ({c}/{f}), rejected {rej},",
          " ".join(f"{name} {a}/{b}" for name, a, b in by))
sd = statistics.stdev(shares) if n > 1 else 0.0
low = min(worst, key=worst.get)
print(f"mean {statistics.mean(shares):.1f} sd {sd:.1f} min {min(shares):.1f} max {max(shares):.1f}"
      f" | lowest class {low} (worst seed {worst[low]}) | rejected mean {statistics.mean(rejected):.0f}")
PY
