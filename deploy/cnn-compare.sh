#!/usr/bin/env bash
# The CNN experiment: a small convnet on Fashion-MNIST under torchrun on 2
# emulated nodes x 2 trainers (one obcommd per node on loopback, one
# torchrun per node, c10d rendezvous on 127.0.0.1), with
#   adam             torch.optim.Adam + DDP over Gloo
#   onebit           obcomm.torch.OneBitAdam (eps 1e-8, automatic mask)
#   powersgd         torch.optim.Adam + DDP over Gloo + PowerSGD hook (rank 2)
#   onebit-nomask    the ablation: OneBitAdam without the mask
#   onebit-bc        OneBitAdam with bias correction, as torch's Adam has
#                    (OneBitAdam's default is DeepSpeed's: none)
#   zeroone          obcomm.torch.ZeroOneAdam (0/1 Adam), variance frozen
#                    at OneBitAdam's freeze step, eps 1e-8, automatic mask
#   lamb             obcomm.torch.OneBitLamb (1-bit LAMB), frozen at the
#                    same step, eps 1e-8, automatic mask, lr 1e-2: LAMB's
#                    lr is a step relative to each layer's norm (at Adam's
#                    1e-3 it reached 85.2 %, 4.4 points under Adam)
# The same seed, steps, batch and lr everywhere. Writes into OUT (default
# client/python/examples/results/cnn): results.md (the table), loss.png,
# and per run <tag>.json, <tag>.csv (loss log), <tag>.log.
#
#   deploy/cnn-compare.sh [--steps N] [--out DIR] [--runs "TAG..."]
#                         [--report-only] [-- cnn_fmnist.py flags]
#
# --runs picks some of the seven runs (deploy/run-torch.sh runs "onebit");
# the table and plot are made only when all seven are there.
# Bytes on the wire: for obcomm the daemons' bytes_sent counters
# (obcommctl --json metrics, summed over both daemons), cross-checked with
# the kernel's tcp_info bytes_sent of the daemons' links; for Gloo the
# kernel's tcp_info bytes_sent of every connection between trainers of
# different nodes, read by rank 0 before the process group closes
# (client/python/examples/wire.py).
#
# The trainers run under the project's virtualenv (.venv, torch 2.13.0;
# deploy/build.sh makes it); the report's plot under Debian's python3
# with python3-matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
steps=1500 out=client/python/examples/results/cnn extra=() report_only=0
runs="adam onebit powersgd onebit-nomask onebit-bc zeroone lamb"
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--steps N] [--out DIR] [--runs \"TAG...\"]" \
        "[--report-only] [-- flags]" >&2
       exit 2 ;;
    esac
done

py=$top/.venv/bin/python
deploy/build.sh dataset-fashion-mnist python3-matplotlib
mkdir -p "$out"
out=$(cd "$out" && pwd)
export OBCOMM_LIBRARY=$top/build/client/libobcomm.so.0
export PYTHONPATH=$top/client/python${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1

dir=""
cleanup() {
    [ -n "$dir" ] || return 0
    OBCOMM_LOCAL_DIR=$dir deploy/local-cluster.sh stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run() { # tag mode flags...
    local tag=$1 mode=$2
    shift 2
    dir=$(mktemp -d /tmp/obcomm-cnn-XXXXXX)
    local base=$((17000 + $$ % 500 * 8))
    OBCOMM_LOCAL_DIR=$dir deploy/local-cluster.sh start 2 "$base" \
        --log-level warn >/dev/null
    local rdzv=$((base + 4)) pids=() status=0
    : >"$out/$tag.log"
    echo "cnn-compare: $tag ($steps steps)" >&2
    for n in 0 1; do
        OBCOMM_SOCKET=$dir/node$n.sock OBCOMM_JOB=cnn-$tag \
            "$py" -m torch.distributed.run --nnodes 2 --nproc_per_node 2 \
            --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$rdzv" \
            --rdzv_id "cnn-$tag-$$" --max_restarts 0 \
            client/python/examples/cnn_fmnist.py --mode "$mode" --tag "$tag" \
            --steps "$steps" --out "$out" "$@" "${extra[@]}" \
            >>"$out/$tag.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    if [ $status -ne 0 ]; then
        echo "cnn-compare: $tag failed; see $out/$tag.log" >&2
        tail -20 "$out/$tag.log" >&2
        exit 1
    fi
    # obcomm's bytes: the daemons' counters, and the kernel's view of
    # their links (the daemons are still up, their links open).
    local dpids
    dpids=$(awk '{ printf "%s:%d ", $1, NR - 1 }' "$dir/pids")
    # shellcheck disable=SC2086
    "$py" - "$out/$tag.json" "$dir" "$("$py" client/python/examples/wire.py $dpids)" <<'EOF'
import json, subprocess, sys
path, d, kernel = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(path))
tot = {}
for n in range(2):
    out = subprocess.run(["build/client/obcommctl", "-s", f"{d}/node{n}.sock",
                          "--json", "metrics"], capture_output=True, text=True,
                         check=True).stdout
    for m in json.loads(out)["metrics"]:
        if m["kind"] == "counter":
            tot[m["name"]] = tot.get(m["name"], 0) + m["value"]
r["obcomm_bytes_sent"] = tot["bytes_sent"]
r["obcomm_onebit_bytes_sent"] = tot["onebit_bytes_sent"]
r["obcomm_kernel_bytes"] = kernel
r["wire_bytes"] = (r["gloo_wire_bytes"]
                   if r["mode"] not in ("onebit", "zeroone", "lamb")
                   else tot["bytes_sent"])
json.dump(r, open(path, "w"), indent=1)
EOF
    cleanup
    dir=""
}

if [ $report_only -eq 0 ]; then
    for r in $runs; do
        case "$r" in
        adam | onebit | powersgd | zeroone) run "$r" "$r" ;;
        lamb) run lamb lamb --lr 1e-2 ;;
        onebit-nomask) run onebit-nomask onebit --mask off ;;
        onebit-bc) run onebit-bc onebit --bias-correction ;;
        *) echo "cnn-compare: no run '$r'" >&2; exit 2 ;;
        esac
    done
fi

for r in adam onebit powersgd onebit-nomask onebit-bc zeroone lamb; do
    [ -f "$out/$r.json" ] || exit 0
done
/usr/bin/python3 client/python/examples/cnn_report.py "$out" "$steps"
