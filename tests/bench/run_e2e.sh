#!/usr/bin/env bash
# End to end: steps per second of a data-parallel trainer with Adam +
# full-precision allreduce against 1-bit Adam, on K emulated nodes (network
# namespaces, tbf-shaped links; deploy/netns-cluster.sh), one trainer per
# node. The trainer is obcomm-fmnist-wide: the Fashion-MNIST MLP with 4096
# hidden units (3.3 M parameters, 13 MB of fp32 gradients), a model whose
# step is dominated by communication at 1 Gbit/s. The figure compared is the
# rate over the steps after the warm-up (half the steps by default), where 1-bit
# Adam compresses.
#
#   tests/bench/run_e2e.sh [--nodes K] [--rate 1gbit] [--steps N] [--batch B]
#                          [--freeze-frac F] [--lr X]
# (A short warm-up of a model this wide diverges after the freeze, see
# client/examples/results/fmnist; half the steps are warm-up by default.)
#
# Output: tests/bench/results/e2e.{json,md}.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${BUILD:-$top/build}
nodes=4 rate=1gbit steps=160 batch=8 freeze=0.5 lr=5e-4
while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --freeze-frac) freeze=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    *) sed -n '2,13p' "$0"; exit 2 ;;
    esac
done

"$top/deploy/build.sh" dataset-fashion-mnist iproute2
out=$here/results
raw=$out/raw
mkdir -p "$raw"
cluster=$top/deploy/netns-cluster.sh
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT INT TERM

echo "[" >"$out/e2e.json"
first=1
for mode in adam onebit; do
    "$cluster" up "$nodes" "$rate" >&2
    pids=()
    for ((i = 0; i < nodes; i++)); do
        "$cluster" exec "$i" "$build/client/obcomm-fmnist-wide" \
            -s "${OBCOMM_NETNS_DIR:-/tmp/obcomm-netns}/n$i.sock" \
            -j "e2e-$mode" -r 0 -n 1 --mode "$mode" --steps "$steps" \
            --batch "$batch" --freeze-frac "$freeze" --lr "$lr" --check-every 20 \
            >"$raw/e2e-$mode-n$nodes-r$i.log" 2>"$raw/e2e-$mode-n$nodes-r$i.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || echo "run_e2e: a $mode trainer failed" >&2; done
    bytes=0
    for ((i = 0; i < nodes; i++)); do
        b=$("$build/client/obcommctl" -s "${OBCOMM_NETNS_DIR:-/tmp/obcomm-netns}/n$i.sock" \
            --json metrics | grep -o '"name":"bytes_sent","kind":"counter","value":[0-9]*' |
            grep -o '[0-9]*$')
        bytes=$((bytes + b))
    done
    "$cluster" down >&2
    line=$(grep '^{' "$raw/e2e-$mode-n$nodes-r0.log" | tail -1)
    [ $first -eq 1 ] || echo "," >>"$out/e2e.json"
    first=0
    printf '{"mode": "%s", "nodes": %d, "rate": "%s", "bytes_on_wire": %d, "trainer": %s}\n' \
        "$mode" "$nodes" "$rate" "$bytes" "$line" >>"$out/e2e.json"
done
echo "]" >>"$out/e2e.json"

/usr/bin/python3 - "$out/e2e.json" "$out/e2e.md" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))
r = {x["mode"]: x for x in runs}
a, o = r["adam"]["trainer"], r["onebit"]["trainer"]
with open(sys.argv[2], "w") as f:
    f.write("# End to end: %d emulated nodes at %s, 1 trainer each\n\n" % (r["adam"]["nodes"], r["adam"]["rate"]))
    f.write("Trainer: obcomm-fmnist-wide (MLP 784-%d-10, %d parameters), batch %d, %d steps, "
            "freeze at step %d. Rate = steps per second after the warm-up.\n\n"
            % (a["hidden"], a["parameters"], a["batch"], a["steps"], o["freeze_step"]))
    f.write("| optimizer | steps/s after step %d | test accuracy | bytes on wire (all nodes) |\n|---|---:|---:|---:|\n" % o["freeze_step"])
    for m, name in (("adam", "Adam + fp32 allreduce"), ("onebit", "1-bit Adam")):
        t = r[m]["trainer"]
        f.write("| %s | %.2f | %.2f %% | %d |\n" % (name, t["tail_steps_per_second"], 100 * t["test_accuracy"], r[m]["bytes_on_wire"]))
    f.write("\nSpeed-up of 1-bit Adam in the compression stage: %.2fx (target: at least 3x).\n"
            % (o["tail_steps_per_second"] / a["tail_steps_per_second"]))
print(open(sys.argv[2]).read())
PY
