#!/usr/bin/env bash
# obcommd's logs as journald and people see them: "<N>" priorities when
# stderr is the journal, ISO-8601 dates otherwise, rank=N, and a peers-list
# disagreement that names the differing entry once, however often the peer
# dials again (counted by the refusing node's link_errors metric).
set -euo pipefail
obcommd=$1 obcommctl=$2
dir=$(mktemp -d /tmp/obcomm-logs-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
wait_sock() {
    for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
    fail "no socket $1"
}

# stderr is "the journal" when JOURNAL_STREAM names its device and inode.
: >"$dir/j.log"
js=$(stat -c '%d:%i' "$dir/j.log")
JOURNAL_STREAM=$js "$obcommd" --socket "$dir/j.sock" 2>>"$dir/j.log" &
pids+=($!)
wait_sock "$dir/j.sock"
kill "${pids[0]}"; wait "${pids[0]}" || true
grep -q '^<6>rank=0 info: obcommd [0-9.]*: cluster obcomm, node 0 of 1' \
    "$dir/j.log" || fail "journal format: $(cat "$dir/j.log")"
grep -qv '^<[0-9]>rank=0 ' "$dir/j.log" && fail "a line without <N>"

# Two nodes whose peers lists differ in their last entry.
# Ports from tests/python/ports.py: outside the kernel's ephemeral range and
# locked against other tests until this script exits.
ports=$(python3 "$(dirname "$0")/python/ports.py" 3 $$)
read -r pa pb pc <<<"$ports"
a="127.0.0.1:$pa" b="127.0.0.1:$pb" c="127.0.0.1:$pc"
"$obcommd" --rank 0 --peers "$a,$b" --socket "$dir/a.sock" \
    --connect-backoff-max-ms 50 2>"$dir/a.log" &
pids+=($!)
"$obcommd" --rank 1 --peers "$a,$b,$c" --socket "$dir/b.sock" \
    --connect-backoff-max-ms 50 2>"$dir/b.log" &
pids+=($!)
wait_sock "$dir/a.sock"
errors=0
for _ in $(seq 400); do
    errors=$("$obcommctl" -s "$dir/a.sock" --json metrics 2>/dev/null |
        grep -o '"link_errors"[^}]*"value":[0-9]*' | grep -o '[0-9]*$' || echo 0)
    [ "${errors:-0}" -ge 10 ] && break
    sleep 0.05
done
[ "${errors:-0}" -ge 10 ] || fail "only $errors refusals"
n=$(grep -c 'error: refusing a peer ' "$dir/a.log" || true)
[ "$n" = 1 ] || fail "$n refusal lines for $errors refusals: $(cat "$dir/a.log")"
grep -q "^[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]T[0-9:.]*Z obcommd rank=0 error: refusing a peer (127.0.0.1:[0-9]*): .*the peers lists differ: 2 nodes here, 3 at the peer: rank 2 ($c) is missing here (fingerprints [0-9a-f]* here, [0-9a-f]* there)$" \
    "$dir/a.log" || fail "refusal line: $(cat "$dir/a.log")"
n=$(grep -c 'unidentified connection from .* closed' "$dir/a.log" || true)
[ "$n" = 1 ] || fail "$n close lines"
n=$(grep -c "rank=1 error: node 0 (127.0.0.1:[0-9]*) refused by the peer: .*rank 2 ($c) is missing here" "$dir/b.log" || true)
[ "$n" = 1 ] || fail "$n refused lines at rank 1: $(cat "$dir/b.log")"
echo "ok: $errors refusals, one line each side"
