#!/usr/bin/env bash
# obcommctl against two real daemons: exit codes, --version, --json (read
# back with python3's json module), the Prometheus text (promtool check
# metrics where Debian's prometheus package is installed), `ops` naming the
# op, its age and who has not arrived, and `peers` with RTT and last error.
set -euo pipefail
obcommd=$1 obcommctl=$2 trainer=$3
dir=$(mktemp -d /tmp/obcomm-ctl-XXXXXX)
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
# json FILE EXPR: evaluates a Python expression over the parsed JSON `j`.
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
ctl() { "$obcommctl" "$@"; }

# Usage errors exit 2, an absent daemon 3.
set +e
ctl bogus 2>/dev/null; [ $? = 2 ] || fail "unknown command: not 2"
ctl --format yaml metrics 2>/dev/null; [ $? = 2 ] || fail "bad format: not 2"
ctl --format prometheus peers 2>/dev/null; [ $? = 2 ] || fail "prom peers: not 2"
ctl -s "$dir/none.sock" status 2>/dev/null; [ $? = 3 ] || fail "no daemon: not 3"
set -e
v=$(ctl --version)
grep -q "^obcommctl [0-9.]*$" <<<"$v" || fail "version: $v"
proto=$(sed -n 's/^#define OBCOMM_PROTO_VERSION \([0-9]*\)$/\1/p' \
    "$(dirname "$0")/../proto/wire.h")
[ -n "$proto" ] || fail "no OBCOMM_PROTO_VERSION in proto/wire.h"
grep -q "^protocol $proto\$" <<<"$v" || fail "version protocol: $v (want $proto)"

# Ports from tests/python/ports.py: outside the kernel's ephemeral range and
# locked against other tests until this script exits.
ports=$(python3 "$(dirname "$0")/python/ports.py" 2 $$)
read -r p0 p1 <<<"$ports"
peers="127.0.0.1:$p0,127.0.0.1:$p1"
for r in 0 1; do
    "$obcommd" --rank $r --peers "$peers" --socket "$dir/$r.sock" \
        --connect-backoff-max-ms 100 --log-level warn 2>"$dir/$r.log" &
    pids+=($!)
done
wait_sock "$dir/0.sock"
wait_sock "$dir/1.sock"

# 20 allreduces of 100000 floats (400 KB: size class 1MiB) on each node.
"$trainer" -s "$dir/0.sock" -r 0 -n 1 -c 100000 -i 20 >/dev/null &
t=$!
"$trainer" -s "$dir/1.sock" -r 0 -n 1 -c 100000 -i 20 >/dev/null
wait $t

ctl -s "$dir/0.sock" --json status >"$dir/status.json"
[ "$(json "$dir/status.json" "j['schema_version'], j['rank'], j['world_size'], j['peers_by_state']")" = "1 0 2 {'self': 1, 'up': 1}" ] ||
    fail "status json: $(cat "$dir/status.json")"
ctl -s "$dir/0.sock" --json peers >"$dir/peers.json"
[ "$(json "$dir/peers.json" "j['peers'][1]['state'], j['peers'][1]['rtt_us'] > 0, j['peers'][1]['reconnects'], j['peers'][1]['bytes_sent'] > 20 * 400000")" = "up True 0 True" ] ||
    fail "peers json: $(cat "$dir/peers.json")"
ctl -s "$dir/0.sock" --json metrics >"$dir/metrics.json"
[ "$(json "$dir/metrics.json" "[m['value'] for m in j['metrics'] if m['name'] in ('ops_completed', 'allreduce_ops')]")" = "[20, 20]" ] ||
    fail "metrics json"
[ "$(json "$dir/metrics.json" "[(h['count'], h['buckets'][-1]['count'] <= 20) for h in j['histograms'] if h['op'] == 'allreduce' and h['size_class'] == '1MiB']")" = "[(20, True)]" ] ||
    fail "histogram json: $(cat "$dir/metrics.json")"
[ "$(json "$dir/metrics.json" "sum(h['count'] for h in j['histograms'])")" = 20 ] ||
    fail "histogram total"

# Prometheus exposition format.
ctl -s "$dir/0.sock" metrics --format prometheus >"$dir/metrics.prom"
grep -qx 'obcomm_ops_completed_total 20' "$dir/metrics.prom" || fail "prom counter"
grep -qx 'obcomm_op_latency_seconds_count{op="allreduce",size="1MiB"} 20' \
    "$dir/metrics.prom" || fail "prom histogram count"
grep -qx 'obcomm_op_latency_seconds_bucket{op="allreduce",size="1MiB",le="+Inf"} 20' \
    "$dir/metrics.prom" || fail "prom +Inf bucket"
grep -qx 'obcomm_op_latency_seconds_bucket{op="allreduce",size="64KiB",le="0.0001"} 0' \
    "$dir/metrics.prom" || fail "prom bound text"
if command -v promtool >/dev/null; then
    promtool check metrics <"$dir/metrics.prom" || fail "promtool check metrics"
    echo "promtool check metrics: ok"
else
    echo "SKIP promtool check (install Debian's prometheus package)"
fi

# An op that waits: a job of 2 local trainers on node 0 where only local
# rank 0 came, and nobody on node 1.
"$trainer" -s "$dir/0.sock" -j waiting -r 0 -n 2 -c 1000 -i 1 -t 600000 \
    >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 200); do
    ctl -s "$dir/0.sock" --json ops >"$dir/ops.json"
    [ "$(json "$dir/ops.json" "len(j['jobs']) and len(j['jobs'][0]['ops'])")" = 1 ] && break
    sleep 0.05
done
[ "$(json "$dir/ops.json" "j['jobs'][0]['name'], j['jobs'][0]['ops'][0]['op'], j['jobs'][0]['ops'][0]['state'], j['jobs'][0]['ops'][0]['submitted'], j['jobs'][0]['ops'][0]['count'], j['jobs'][0]['ops'][0]['dtype']")" = "waiting allreduce collecting 1 1000 float32" ] ||
    fail "ops json: $(cat "$dir/ops.json")"
w=$(json "$dir/ops.json" "j['jobs'][0]['ops'][0]['waiting_for']")
[ "$w" = "rank 1 (node 0 local 1, not joined), node 1 (ranks 2-3)" ] ||
    fail "waiting_for: $w"
ctl -s "$dir/0.sock" ops | grep '^waiting  *1/2  *0  allreduce  collecting .* 1/2  rank 1 (node 0 local 1, not joined), node 1 (ranks 2-3)$' >/dev/null ||
    fail "ops text: $(ctl -s "$dir/0.sock" ops)"
# Node 1 knows nothing of the job (no trainer joined there): not listed.
ctl -s "$dir/1.sock" --json ops >"$dir/ops1.json"
[ "$(json "$dir/ops1.json" "len(j['jobs'])")" = 0 ] || fail "phantom job"

# Node 1 goes away: node 0's peer shows the link's last error.
kill "${pids[1]}"
wait "${pids[1]}" || true
for _ in $(seq 200); do
    ctl -s "$dir/0.sock" --json peers >"$dir/peers.json"
    [ "$(json "$dir/peers.json" "j['peers'][1]['state']")" != up ] && break
    sleep 0.05
done
[ "$(json "$dir/peers.json" "j['peers'][1]['last_error'] is not None, j['peers'][1]['up_since'], j['peers'][1]['rtt_us']")" = "True None None" ] ||
    fail "peer down: $(cat "$dir/peers.json")"
echo ok
