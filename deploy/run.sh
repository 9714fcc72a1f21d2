#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains an MLP on
# Fashion-MNIST with 1-bit Adam on a local 2-node obcomm cluster (two
# obcommd on loopback, 2 trainers per node), then prints the test accuracy
# and the traffic 1-bit Adam saved, and cleans up after itself. The default
# run (1000 steps) takes about a minute on a 2-core machine.
#
#   deploy/run.sh [--steps N] [--mode adam|onebit|onebit-noef] [--nodes K]
#                 [--trainers T] [--out DIR] [-- more obcomm-fmnist flags]
#
# --out DIR keeps DIR/<mode>.json, .csv and .log; without it they go to a
# temporary directory that is removed at the end. A plain allreduce demo is
# build/client/obcomm-allreduce (docs/operations.md, "A 4-node cluster on
# loopback, by hand").
set -euo pipefail
cd "$(dirname "$0")/.."
steps=1000 mode=onebit nodes=2 trainers=2 out="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--steps N] [--mode adam|onebit|onebit-noef]" \
        "[--nodes K] [--trainers T] [--out DIR] [-- trainer flags]" >&2; exit 2 ;;
    esac
done

dir=$out
if [ -z "$dir" ]; then
    dir=$(mktemp -d /tmp/obcomm-run-XXXXXX)
    trap 'rm -rf "$dir"' EXIT
fi
status=0
deploy/train.sh --mode "$mode" --steps "$steps" --nodes "$nodes" \
    --trainers "$trainers" --out "$dir" --quiet -- "${extra[@]}" || status=$?
[ $status -eq 0 ] || [ $status -eq 3 ] || exit $status

/usr/bin/python3 - "$dir/$mode.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
n = r["nodes"]
mb = lambda b: b / 1e6
print(f"\n1-bit Adam demo: {n} nodes x {r['trainers_per_node']} trainers, "
      f"mode {r['mode']}, {r['steps']} steps of {r['batch']} per trainer "
      f"(freeze_step {r['freeze_step']}), {r['seconds']:.0f} s")
if "diverged_at_step" in r:
    print(f"  DIVERGED at step {r['diverged_at_step']}")
print(f"  test accuracy       {100 * r['test_accuracy']:.2f} %  "
      f"(10000 test images)")
tl = r["train_loss"]
print(f"  final train loss    {tl:.4f}  (all 60000 training images)" if tl is not None
      else "  final train loss    not finite")
w, f = r["bytes_on_wire"], r["fp32_equivalent_bytes"]
print(f"  bytes on the wire   {mb(w):.1f} MB  (bytes_sent summed over the daemons)")
print(f"  fp32 allreduce      {mb(f):.1f} MB  (same steps, every 1-bit op as a "
      f"full-precision ring: onebit_logical_bytes x 2({n}-1)/{n})")
if w > 0:
    print(f"  traffic saved       {100 * (1 - w / f):.1f} %  ({f / w:.2f}x fewer bytes)")
EOF
exit $status
