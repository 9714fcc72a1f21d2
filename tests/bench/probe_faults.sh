#!/usr/bin/env bash
# Where does a daemon's time go per allreduce? For each op and size, on a
# K-node netns cluster, counts node 0's obcommd minor page faults and CPU
# time (utime+stime from /proc/PID/stat) around a bench_allreduce run, and
# prints one JSON line per (op, size) with the per-op figures and the
# median time. Extra env for the daemons (e.g.
# GLIBC_TUNABLES=glibc.malloc.hugetlb=1) passes through.
#
#   tests/bench/probe_faults.sh [K] [SIZES_MIB] [REPEATS]    (needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${BUILD:-$top/build}
cluster=$top/deploy/netns-cluster.sh
k=${1:-2}
sizes=${2:-"16 64"}
repeats=${3:-5}
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$cluster" up "$k" >&2
pid=$(ip netns pids obcomm-n0 | head -1)
tck=$(getconf CLK_TCK)
stat() { awk '{print $10, $14 + $15}' "/proc/$pid/stat"; }
for op in fp32 1bit; do
    for s in $sizes; do
        read -r f0 c0 < <(stat)
        pids=()
        for ((i = 0; i < k; i++)); do
            "$cluster" exec "$i" "$build/tests/bench/bench_allreduce" -j "probe-$op-$s" \
                -z "$s" -r "$repeats" -w 1 -o "$op" >"/tmp/probe-$i.out" &
            pids+=($!)
        done
        wait "${pids[@]}"
        read -r f1 c1 < <(stat)
        ops=$((repeats + 1))
        med=$(grep -o '"median_ms":[0-9.]*' /tmp/probe-0.out | cut -d: -f2)
        echo "{\"op\":\"$op\",\"nodes\":$k,\"mib\":$s,\"median_ms\":$med,\
\"daemon0_minflt_per_op\":$(((f1 - f0) / ops)),\
\"daemon0_cpu_ms_per_op\":$(((c1 - c0) * 1000 / tck / ops)),\
\"glibc_tunables\":\"${GLIBC_TUNABLES:-}\"}"
    done
done
