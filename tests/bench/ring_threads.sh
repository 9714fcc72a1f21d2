#!/usr/bin/env bash
# Where the daemons spend their CPU in an fp32 ring allreduce: the loop
# thread against the worker pool, for one or more obcommd builds side by
# side in the same run (issue 13 item 3).
#
#   tests/bench/ring_threads.sh [--runs K] [--mib M] [--repeats R]
#       [--warmup W] [--trainers T] [--bench PATH] NAME=OBCOMMD [...]
#
# For each of K runs and each build in turn: two daemons on loopback, T
# trainers each (default 2; tests/bench/bench_allreduce -o fp32), W untimed
# and R timed ops of M MiB (default 64). Each daemon's threads are read from
# /proc/PID/task/*/stat (utime + stime) when the trainers have exited: the
# thread whose id is the daemon's pid is the loop thread, every other one
# belongs to libuv's worker pool. Prints per build and node the loop and
# pool CPU ms per op (over W + R ops and their barriers) and the median
# wall time of the timed ops as the trainers saw it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
runs=3 mib=64 repeats=5 warmup=1 trainers=2
bench=$root/build/tests/bench/bench_allreduce
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || set -- "after=$root/build/daemon/obcommd"
[ -x "$bench" ] || { echo "ring_threads: no $bench" >&2; exit 2; }

. "$here/loopback_pair.sh"
pair_init obcomm-ring

# "loop_ticks pool_ticks" of process $1.
ticks() {
    local pid=$1 loop=0 pool=0 t v
    for t in /proc/"$pid"/task/*; do
        # Fields 14 and 15 (utime, stime) after the ")" that ends comm.
        v=$(sed 's/.*) //' "$t/stat" | awk '{print $12 + $13}')
        if [ "${t##*/}" = "$pid" ]; then loop=$((loop + v)); else pool=$((pool + v)); fi
    done
    echo "$loop $pool"
}

hz=$(getconf CLK_TCK)
ops=$((repeats + warmup))
printf "%-8s %3s %4s %12s %12s %12s  load\n" build run node "loop ms/op" "pool ms/op" "wall ms"
for run in $(seq 1 "$runs"); do
    for spec in "$@"; do
        name=${spec%%=*} bin=${spec#*=}
        load=$(cut -d' ' -f1 /proc/loadavg)
        pair_start "$bin" "$name-$run"
        tp=()
        for i in 0 1; do
            for l in $(seq 0 $((trainers - 1))); do
                "$bench" -s "$dir/n$i.sock" -o fp32 -z "$mib" -r "$repeats" \
                    -w "$warmup" -L "$trainers" -l "$l" >"$dir/b$i-$l.json" &
                tp+=($!)
            done
        done
        ok=1
        for p in "${tp[@]}"; do wait "$p" || ok=0; done
        [ $ok -eq 1 ] || { echo "ring_threads: run $run of $name failed (logs in $dir)" >&2; trap - EXIT; pair_stop; exit 1; }
        for i in 0 1; do
            read -r lt pt < <(ticks "${pids[$i]}")
            wall=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["median_ms"])' "$dir/b$i-0.json")
            awk -v n="$name" -v r="$run" -v i="$i" -v lt="$lt" -v pt="$pt" \
                -v hz="$hz" -v ops="$ops" -v w="$wall" -v ld="$load" \
                'BEGIN { printf "%-8s %3d %4d %12.1f %12.1f %12.1f  %s\n", n, r, i, lt * 1000 / hz / ops, pt * 1000 / hz / ops, w, ld }'
        done
        pair_stop
        rm -f "$dir"/b*.json
    done
done
