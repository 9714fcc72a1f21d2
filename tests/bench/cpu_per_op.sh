#!/usr/bin/env bash
# The daemons' CPU time per 1-bit op (or fp32 AVG allreduce) against a
# memcpy of the tensor, for one or more obcommd builds side by side in the
# same run.
#
#   tests/bench/cpu_per_op.sh [--runs K] [--count N] [--repeats R]
#       [--warmup W] [--trainers T] [--nodes 1|2] [--kind 1bit|avg]
#       [--special] [--probe PATH] [--out FILE] NAME=OBCOMMD [NAME=OBCOMMD...]
#
# For each of K runs and each build in turn: two daemons on loopback (one
# daemon, a one-node world, with --nodes 1), T trainers each (default 1;
# tests/bench/onebit_cpu), W untimed and R timed 1-bit ops (--kind avg:
# fp32 allreduces with OBCOMM_AVG) of
# N floats (default 16 Mi); each trainer reads its daemon's utime + stime
# (/proc/PID/stat), and its loop thread's (/proc/PID/task/PID/stat: the
# sockets, frames and pool hand-offs, without the codec passes), around
# the R ops and times a memcpy of the tensor in the same run. Prints one JSON line per (run, build, node), with the load
# average at the start of the run, to FILE (default stdout), then per build
# the medians over runs and nodes, and whether every build's results were
# bit-identical (the trainers hash every op's output; --special puts NaNs,
# Infs, -0.0 and subnormals among the inputs, onebit_cpu -x). For 1-bit
# ops on 2 nodes it also runs tests/bench/traffic_floor once per run: the
# op's bytes moved by plain loops on both nodes at once, the floor under
# the daemon's CPU on a machine whose emulated nodes share one memory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
runs=5 count=$((16 << 20)) repeats=20 warmup=5 trainers=1 out=/dev/stdout
nodes=2 kind=1bit special=
probe=$root/build/tests/bench/onebit_cpu
floor=$root/build/tests/bench/traffic_floor
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --kind) kind=$2; shift 2 ;;
    --special) special=-x; shift ;;
    --probe) probe=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || set -- "after=$root/build/daemon/obcommd"
[ -x "$probe" ] || { echo "cpu_per_op: no $probe (meson compile onebit_cpu)" >&2; exit 2; }

. "$here/loopback_pair.sh"
pair_init obcomm-cpu

results=$dir/results.jsonl
: >"$results"
for run in $(seq 1 "$runs"); do
    for spec in "$@"; do
        name=${spec%%=*} bin=${spec#*=}
        load=$(cut -d' ' -f1 /proc/loadavg)
        pair_start "$bin" "$name-$run" "$nodes"
        tp=()
        for i in $(seq 0 $((nodes - 1))); do
            for l in $(seq 0 $((trainers - 1))); do
                "$probe" -s "$dir/n$i.sock" -p "${pids[$i]}" -n "$count" \
                    -w "$warmup" -r "$repeats" -L "$trainers" -l "$l" -k "$kind" $special \
                    >"$dir/p$i-$l.json" &
                tp+=($!)
            done
        done
        ok=1
        for p in "${tp[@]}"; do wait "$p" || ok=0; done
        pair_stop
        [ $ok -eq 1 ] || { echo "cpu_per_op: run $run of $name failed (logs in $dir)" >&2; trap - EXIT; exit 1; }
        for f in "$dir"/p*.json; do
            sed "s/^{/{\"run\":$run,\"build\":\"$name\",\"load\":$load,\"trainers\":$trainers,\"nodes\":$nodes,\"kind\":\"$kind\",/" "$f" >>"$results"
        done
        rm -f "$dir"/p*.json
    done
    # The floor under the 1-bit figures, once per run: the op's bytes moved
    # by plain loops on every node at once (traffic_floor.c).
    if [ "$kind" = 1bit ] && [ "$nodes" -gt 1 ] && [ -x "$floor" ]; then
        "$floor" -n "$count" -k "$nodes" |
            sed "s/^{/{\"run\":$run,\"build\":\"floor\",/" >>"$dir/floor.jsonl"
    fi
done
cat "$results" >"$out"
[ -f "$dir/floor.jsonl" ] && cat "$dir/floor.jsonl" >>"$out"
python3 - "$results" "$dir/floor.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
builds = list(dict.fromkeys(r["build"] for r in rows))
print("build      cpu ms/op  (loop thread)  memcpy ms  cpu/memcpy  wall ms/op  (%s, medians of %d runs x %d nodes x %d trainers; load %s)"
      % (rows[0]["kind"], max(r["run"] for r in rows), rows[0]["nodes"], rows[0]["trainers"],
         ", ".join(sorted({str(r["load"]) for r in rows}))))
for b in builds:
    rs = [r for r in rows if r["build"] == b]
    med = lambda k: statistics.median(r[k] for r in rs)
    print("%-10s %9.1f  %13.1f  %9.2f  %10.2f  %10.1f" % (b, med("daemon_cpu_ms_per_op"),
          med("loop_cpu_ms_per_op"), med("memcpy_ms"), med("ratio"), med("wall_ms_per_op")))
try:
    floors = [json.loads(l) for l in open(sys.argv[2])]
except OSError:
    floors = []
if floors:
    fl = statistics.median(f["floor_cpu_ms_per_op"] for f in floors)
    fm = statistics.median(f["memcpy_ms"] for f in floors)
    print("floor: the op's bytes moved by plain loops on all %d nodes at once (traffic_floor), "
          "%.1f ms/op = %.2fx its memcpy (median of %d runs)" % (rows[0]["nodes"], fl, fl / fm, len(floors)))
    for b in builds:
        rs = [r for r in rows if r["build"] == b]
        print("%-10s daemon CPU / floor: %.2f" % (b, statistics.median(r["daemon_cpu_ms_per_op"] for r in rs) / fl))
hashes = {r["hash"] for r in rows}
print("results bit-identical across builds and runs:", "yes" if len(hashes) == 1 else "NO (%d hashes)" % len(hashes))
PY
