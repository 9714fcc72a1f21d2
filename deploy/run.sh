#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts a local 2-node
# obcomm cluster (two obcommd on loopback), runs 2 trainers per node that
# allreduce a tensor and check every result, shows the daemons' counters,
# and cleans up after itself.
#
#   deploy/run.sh [--nodes K] [--trainers T] [--count N] [--iters I]
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=2 trainers=2 count=$((4 << 20)) iters=10
while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    *) echo "usage: $0 [--nodes K] [--trainers T] [--count N] [--iters I]" >&2; exit 2 ;;
    esac
done

deploy/build.sh
export OBCOMM_LOCAL_DIR=${OBCOMM_LOCAL_DIR:-/tmp/obcomm-run-$$}
trap 'deploy/local-cluster.sh stop; rm -rf "$OBCOMM_LOCAL_DIR"' EXIT INT TERM
deploy/local-cluster.sh start "$nodes" $((7900 + $$ % 1000 * 8)) --log-level warn

pids=()
for ((n = 0; n < nodes; n++)); do
    for ((t = 0; t < trainers; t++)); do
        build/client/obcomm-allreduce -s "$OBCOMM_LOCAL_DIR/node$n.sock" \
            -j demo -r "$t" -n "$trainers" -c "$count" -i "$iters" &
        pids+=($!)
    done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done

echo
echo "== node 0 as obcommctl sees it"
build/client/obcommctl -s "$OBCOMM_LOCAL_DIR/node0.sock" peers
build/client/obcommctl -s "$OBCOMM_LOCAL_DIR/node0.sock" metrics |
    grep -E '^(ops_completed|ops_failed|bytes_sent|bytes_received|allreduce_bytes_sent|logical_bytes) '
exit $status
