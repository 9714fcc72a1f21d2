#!/usr/bin/env bash
# Smoke test of obcomm-fmnist against real daemons (meson test fmnist_smoke):
# two obcommd on loopback, one trainer each, 60 steps of 1-bit Adam (the
# compression stage runs steps 30..59: a freeze after a handful of steps
# diverges, v is still near zero then). Passes when both trainers exit 0
# and the final training loss is finite and below the first step's loss.
# Skips (77) when the Fashion-MNIST package is not installed.
#
#   fmnist_smoke.sh OBCOMMD OBCOMMCTL OBCOMM_FMNIST
set -euo pipefail
obcommd=$1 obcommctl=$2 fmnist=$3
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
    echo "skip: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"
    exit 77
fi
dir=$(mktemp -d /tmp/obcomm-fmnist-smoke-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
# Ports from tests/python/ports.py: outside the kernel's ephemeral range and
# locked against other tests until this script exits.
ports=$(python3 "$(dirname "$0")/../../tests/python/ports.py" 2 $$)
read -r p0 p1 <<<"$ports"
peers=127.0.0.1:$p0,127.0.0.1:$p1
for n in 0 1; do
    "$obcommd" --rank $n --peers "$peers" --socket "$dir/node$n.sock" \
        --log-level warn >"$dir/node$n.log" 2>&1 &
    pids+=($!)
done
for n in 0 1; do
    for _ in $(seq 100); do
        "$obcommctl" -s "$dir/node$n.sock" status >/dev/null 2>&1 && break
        sleep 0.05
    done
done
tr=()
for n in 0 1; do
    "$fmnist" -s "$dir/node$n.sock" -j smoke -r 0 -n 1 --mode onebit \
        --steps 60 --freeze-frac 0.5 --check-every 10 -t 20000 \
        >"$dir/out$n.json" 2>"$dir/err$n.log" &
    tr+=($!)
done
status=0
for p in "${tr[@]}"; do wait "$p" || status=1; done
cat "$dir"/err*.log
if [ $status -ne 0 ]; then
    echo "FAIL: a trainer exited non-zero"; cat "$dir"/node*.log; exit 1
fi
json=$(cat "$dir/out0.json")
echo "$json"
first=$(sed -n 's/.*"first_step_loss": \([^,}]*\).*/\1/p' <<<"$json")
final=$(sed -n 's/.*"train_loss": \([^,}]*\).*/\1/p' <<<"$json")
onebit=$("$obcommctl" -s "$dir/node0.sock" metrics | awk '$1 == "onebit_ops" {print $2}')
echo "first step loss $first, final train loss $final, 1-bit ops on node 0: $onebit"
awk -v a="$first" -v b="$final" 'BEGIN {
    if (a == "" || b == "" || a == "null" || b == "null") exit 1
    if (!(b + 0 < a + 0 && b + 0 > 0)) exit 1 }' || {
    echo "FAIL: final loss '$final' not finite or not below the first '$first'"; exit 1; }
[ "${onebit:-0}" -eq 30 ] || { echo "FAIL: expected 30 1-bit ops, got '$onebit'"; exit 1; }
echo "ok"
