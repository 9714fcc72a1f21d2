#!/usr/bin/env bash
# The PyTorch demo: installs what is missing (Debian packages, the
# project's virtualenv .venv with torch 2.13.0), builds, starts a local
# 2-node obcomm cluster (two obcommd
# on loopback), runs one torchrun per node with 2 trainers each training a
# small CNN on Fashion-MNIST with obcomm.torch.OneBitAdam (DeepSpeed's
# defaults, eps 1e-8), prints the test accuracy and the bytes 1-bit Adam
# sent, and stops the cluster. About two minutes on a 2-core machine.
#
#   deploy/run-torch.sh [--steps N] [--out DIR] [-- cnn_fmnist.py flags]
#
# The trainer is client/python/examples/cnn_fmnist.py; deploy/cnn-compare.sh
# runs it against Adam and PowerSGD over Gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=500 out="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--steps N] [--out DIR] [-- cnn_fmnist.py flags]" >&2
       exit 2 ;;
    esac
done
dir=$out
if [ -z "$dir" ]; then
    dir=$(mktemp -d /tmp/obcomm-run-torch-XXXXXX)
    trap 'rm -rf "$dir"' EXIT
fi
deploy/cnn-compare.sh --runs onebit --steps "$steps" --out "$dir" \
    -- "${extra[@]}"

.venv/bin/python - "$dir/onebit.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps, fs = r["steps"], r["freeze_step"]
print(f"\nPyTorch demo: 2 nodes x 2 trainers under torchrun, "
      f"obcomm.torch.OneBitAdam (eps {r['eps']}, variance frozen at step {fs}),"
      f" {steps} steps of {r['batch']} per trainer, {r['train_seconds']:.0f} s")
if "diverged_at_step" in r:
    print(f"  DIVERGED at step {r['diverged_at_step']}")
print(f"  test accuracy       {100 * r['test_accuracy']:.2f} %  (10000 test images)")
tl = r["final_train_loss"]
print(f"  final train loss    {tl:.4f}  (last 100 steps, all trainers)"
      if tl is not None else "  final train loss    not finite")
w = r["obcomm_bytes_sent"]
# What obcomm's fp32 allreduce of the same gradients would have sent: a
# ring over n = 2 nodes, each node sending 2(n-1)/n x the model per step.
n = 2
fp32 = n * 2 * (n - 1) / n * 4 * r["parameters"] * steps
print(f"  bytes on the wire   {w / 1e6:.1f} MB  (the daemons' bytes_sent, both nodes)")
print(f"  fp32 allreduce      {fp32 / 1e6:.1f} MB  (the same steps as an fp32 ring:"
      " 2 nodes x 2(n-1)/n x 4 bytes x parameters)")
print(f"  traffic saved       {100 * (1 - w / fp32):.1f} %  ({fp32 / w:.2f}x fewer bytes)")
print(f"  masked coordinates  {r['masked']} of {r['parameters']}")
PY
