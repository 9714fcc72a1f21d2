#!/usr/bin/env bash
# The stall inspector: an op that waits longer than stall_warn_ms is logged
# once, with its fingerprint and who has not arrived, however many scans
# pass over it (counted by the op's age in obcommctl, not timed).
set -euo pipefail
obcommd=$1 obcommctl=$2 trainer=$3
dir=$(mktemp -d /tmp/obcomm-stall-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$obcommd" --socket "$dir/d.sock" --stall-warn-ms 200ms 2>"$dir/log" &
pids+=($!)
for _ in $(seq 200); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done
# Local rank 0 of 2 submits; local rank 1 never joins.
"$trainer" -s "$dir/d.sock" -j stuck -r 0 -n 2 -c 1000 -i 1 -t 600000 \
    >/dev/null 2>&1 &
pids+=($!)
# Until the op is 2 s old: at least eight scans (every 50 ms) past the
# first that logged it.
age=0
for _ in $(seq 400); do
    age=$("$obcommctl" -s "$dir/d.sock" --json ops | python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"]
print(j[0]["ops"][0]["age_ms"] if j and j[0]["ops"] else 0)')
    [ "$age" -ge 2000 ] && break
    sleep 0.05
done
[ "$age" -ge 2000 ] || fail "op age $age"
n=$(grep -c 'has waited' "$dir/log" || true)
[ "$n" = 1 ] || fail "$n stall lines: $(cat "$dir/log")"
grep -q 'rank=0 warn: op 0 of job stuck (allreduce, count 1000, key 0, fingerprint [0-9a-f]\{16\}) has waited [0-9]* ms, collecting: rank 1 (node 0 local 1, not joined)$' \
    "$dir/log" || fail "stall line: $(grep 'has waited' "$dir/log")"
waited=$(sed -n 's/.*has waited \([0-9]*\) ms.*/\1/p' "$dir/log")
[ "$waited" -ge 200 ] || fail "logged after $waited ms, before the limit"
grep -q 'fingerprint 0000000000000000' "$dir/log" &&
    fail "stall line without the op's fingerprint: $(grep 'has waited' "$dir/log")"
echo "ok: one line, at $waited ms, for an op $age ms old"

# A node whose daemon never came up: the line says its link is down.
# Ports from tests/python/ports.py: outside the kernel's ephemeral range and
# locked against other tests until this script exits.
ports=$(python3 "$(dirname "$0")/python/ports.py" 2 $$)
read -r port port1 <<<"$ports"
"$obcommd" --socket "$dir/p.sock" --peers "127.0.0.1:$port,127.0.0.1:$port1" \
    --rank 0 --stall-warn-ms 200ms 2>"$dir/plog" &
pids+=($!)
for _ in $(seq 200); do [ -S "$dir/p.sock" ] && break; sleep 0.05; done
"$trainer" -s "$dir/p.sock" -j lonely -r 0 -n 1 -c 1000 -i 1 -t 600000 \
    >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 200); do
    grep -q 'has waited' "$dir/plog" && break
    sleep 0.05
done
grep -q 'rank=0 warn: op 0 of job lonely (allreduce, count 1000, key 0, fingerprint [0-9a-f]\{16\}) has waited [0-9]* ms, collecting: node 1 (rank 1); the link to node 1 is down (never up since this daemon started' \
    "$dir/plog" || fail "stall line: $(grep 'has waited' "$dir/plog")"
echo "ok: the stall line names the link that is down"
