#!/usr/bin/env bash
# One training run of obcomm-fmnist (an MLP on Fashion-MNIST) on a private
# local cluster: installs what is missing, builds, starts NODES obcommd on
# loopback, runs TRAINERS trainers per node, collects every daemon's
# counters and writes
#
#   OUT/<mode>.json   test accuracy, final training loss, bytes on the wire,
#                     steps, seconds (one JSON object)
#   OUT/<mode>.csv    step,loss: the mean minibatch loss over all trainers
#   OUT/<mode>.log    the trainers' and daemons' messages
#
# The cluster is stopped on every exit path (success, failure, Ctrl-C).
# Exit status: 0 done, 1 failure, 3 training diverged (still recorded).
#
#   deploy/train.sh [--mode adam|onebit|onebit-noef] [--steps N] [--nodes K]
#                   [--trainers T] [--out DIR] [--tag NAME] [--quiet]
#                   [-- more obcomm-fmnist flags, e.g. --lr 2e-3 --seed 7]
#
# Bytes: "bytes_on_wire" is the sum of bytes_sent (frame headers included)
# over all daemons: the whole run, including the initial broadcast and the
# small loss/checksum allreduces. "fp32_equivalent_bytes" is what the run
# would have sent with every 1-bit allreduce replaced by a full-precision
# ring allreduce of the same tensor: each node's onebit_logical_bytes times
# 2(K-1)/K, plus the bytes that were not 1-bit anyway.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=onebit steps=1000 nodes=2 trainers=2 out=client/examples/results/fmnist tag="" quiet=0
extra=()
usage() {
    echo "usage: $0 [--mode adam|onebit|onebit-noef] [--steps N] [--nodes K]" \
        "[--trainers T] [--out DIR] [--tag NAME] [--quiet] [-- trainer flags]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
    --mode) mode=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) usage ;;
    esac
done
name=${tag:-$mode}

# python3 only reads the daemons' JSON counters (standard library).
deploy/build.sh dataset-fashion-mnist python3
mkdir -p "$out"
py=/usr/bin/python3

export OBCOMM_LOCAL_DIR=/tmp/obcomm-train-$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    deploy/local-cluster.sh stop >/dev/null 2>&1 || true
    if [ -d "$OBCOMM_LOCAL_DIR" ]; then
        cat "$OBCOMM_LOCAL_DIR"/node*.log >>"$out/$name.log" 2>/dev/null || true
        rm -rf "$OBCOMM_LOCAL_DIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$OBCOMM_LOCAL_DIR"
: >"$out/$name.log"
deploy/local-cluster.sh start "$nodes" $((16000 + $$ % 1000 * 8)) \
    --log-level warn >/dev/null

t0=$(date +%s.%N)
for ((n = 0; n < nodes; n++)); do
    for ((t = 0; t < trainers; t++)); do
        args=(-s "$OBCOMM_LOCAL_DIR/node$n.sock" -j "fmnist-$name" -r "$t"
            -n "$trainers" --mode "$mode" --steps "$steps" "${extra[@]}")
        if [ $n -eq 0 ] && [ $t -eq 0 ]; then
            build/client/obcomm-fmnist "${args[@]}" --log "$out/$name.csv" \
                >"$OBCOMM_LOCAL_DIR/rank0.json" 2>>"$out/$name.log" &
        else
            build/client/obcomm-fmnist "${args[@]}" >/dev/null \
                2>>"$out/$name.log" &
        fi
        pids+=($!)
    done
done
if [ $quiet -eq 0 ]; then
    echo "train: $nodes nodes x $trainers trainers, mode $mode, $steps steps" \
        "(log: $out/$name.log)" >&2
fi
# Exit 3 from every trainer: training diverged (the JSON says where); the
# run is still recorded, and this script exits 3.
status=0
for p in "${pids[@]}"; do
    rc=0
    wait "$p" || rc=$?
    if [ $rc -eq 3 ] && [ $status -ne 1 ]; then status=3; elif [ $rc -ne 0 ]; then status=1; fi
done
pids=()
t1=$(date +%s.%N)
if [ $status -eq 3 ]; then
    echo "train: $name diverged; recording it" >&2
elif [ $status -ne 0 ]; then
    echo "train: a trainer failed; see $out/$name.log:" >&2
    grep -v '^$' "$out/$name.log" | tail -5 >&2
    exit 1
fi

for ((n = 0; n < nodes; n++)); do
    build/client/obcommctl -s "$OBCOMM_LOCAL_DIR/node$n.sock" --json metrics \
        >"$OBCOMM_LOCAL_DIR/metrics$n.json"
done

"$py" - "$OBCOMM_LOCAL_DIR" "$nodes" "$trainers" "$t0" "$t1" \
    >"$out/$name.json" <<'EOF'
import json, sys
d, nodes, trainers, t0, t1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
r = json.load(open(f"{d}/rank0.json"))
tot = {}
for n in range(nodes):
    for m in json.load(open(f"{d}/metrics{n}.json"))["metrics"]:
        if m["kind"] == "counter":
            tot[m["name"]] = tot.get(m["name"], 0) + m["value"]
ring = 2 * (nodes - 1) / nodes
r.update(nodes=nodes, trainers_per_node=trainers,
         seconds=round(t1 - t0, 2),
         bytes_on_wire=tot["bytes_sent"],
         allreduce_bytes_sent=tot["allreduce_bytes_sent"],
         broadcast_bytes_sent=tot["broadcast_bytes_sent"],
         onebit_bytes_sent=tot["onebit_bytes_sent"],
         onebit_logical_bytes=tot["onebit_logical_bytes"],
         onebit_ops=tot["onebit_ops"],
         fp32_equivalent_bytes=round(tot["bytes_sent"] - tot["onebit_bytes_sent"]
                                     + tot["onebit_logical_bytes"] * ring),
         ops_failed=tot["ops_failed"])
print(json.dumps(r))
EOF
if [ $quiet -eq 0 ]; then cat "$out/$name.json"; fi
exit $status
