#!/usr/bin/env bash
# End to end with PyTorch: whole training runs of every contender on K
# emulated nodes (deploy/netns-cluster.sh: network namespaces, tbf-shaped
# links, one obcommd per node), one trainer per node, one torch thread
# each. The trainer is tests/bench/torch_e2e.py (its --help says what the
# models and contenders are). Needs root.
#
#   tests/bench/run_torch_e2e.sh [--nodes "2 4"] [--models "mlp transformer"]
#       [--contenders "floor ddp-gloo ddp-powersgd ddp-obcomm onebit"]
#       [--steps 60] [--warmup-frac 0.15] [--rate 1gbit] [--repeats 1]
#       [--onebit-args 'k=v,...'] [--out DIR] [--quick] [--keep]
#       [-- more torch_e2e.py run flags]
#
# Contenders: floor, ddp-gloo, ddp-powersgd, ddp-obcomm, onebit by default;
# ddp-powersgd-1b (PowerSGD in one DDP bucket) on request. Every run
# (contender x model x node count x repeat) gets a fresh cluster: up, the K
# trainers at once, down. Repeat R uses seed R (initial model, data order,
# PowerSGD's vectors), so repeats show the run-to-run noise; a --seed among
# the trainer flags overrides it. --onebit-args passes keyword arguments to
# OneBitAdam's constructor ("overlap=True"), so the same command measures
# later versions of it. --quick: 2 nodes, 6 steps, into
# /tmp/obcomm-torch-e2e-quick unless --out says otherwise (a smoke check).
# DIR/raw is emptied first unless --keep (then the report merges these runs
# with the ones already there, a run of the same name replaced).
#
# Output: DIR/raw/MODEL-CONTENDER-nK[-rR].{jsonl,rI.err} (every rank's JSON
# line and the driver's run_info line: load average before and after, exit
# codes, seconds), DIR/e2e.jsonl and DIR/e2e.md (torch_e2e.py report);
# DIR defaults to tests/bench/results-issue21. A failed or aborted run is
# reported in the table, not retried; the exit status is 1 if any failed.
# The cluster and the trainers are torn down on every exit, also on failure
# or Ctrl-C.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${BUILD:-$top/build}
cluster=$top/deploy/netns-cluster.sh
py=$top/.venv/bin/python   # torch 2.13 (deploy/venv.sh)
nodes="2 4"
models="mlp transformer"
contenders="floor ddp-gloo ddp-powersgd ddp-obcomm onebit"
steps=""
warmup_frac=0.15
rate=1gbit
repeats=1
onebit_args=""
out=""
quick=0
keep=0

# The command as given, for the report.
command="tests/bench/run_torch_e2e.sh$(printf ' %q' "$@")"

usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --contenders) contenders=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup-frac) warmup_frac=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --onebit-args) onebit_args=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) echo "run_torch_e2e: unknown argument $1" >&2; usage ;;
    esac
done
trainer_flags=("$@")
if [ $quick -eq 1 ]; then
    nodes=2
    [ -n "$steps" ] || steps=6
    [ -n "$out" ] || out=/tmp/obcomm-torch-e2e-quick
fi
[ -n "$out" ] || out=$here/results-issue21
[ -n "$steps" ] || steps=60
raw=$out/raw
log() { echo "run_torch_e2e: $*" >&2; }

[ "$(id -u)" -eq 0 ] || { log "needs root (network namespaces)"; exit 1; }
# The namespaces have fixed names, and tearing a cluster down kills every
# process in them: never start while one is up, which may be another run's.
if ip netns list 2>/dev/null | grep -qE '^obcomm-(n[0-9]+|br)( |$)'; then
    log "an emulated cluster is up (another run?); left alone. If it is a leftover: deploy/netns-cluster.sh down"
    exit 1
fi

pids=()
cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    "$cluster" down >/dev/null 2>&1 || true
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

(cd "$top" && deploy/build.sh dataset-fashion-mnist iproute2)
"$py" -c 'import torch.distributed' || { log "no torch for $py"; exit 1; }
[ $keep -eq 1 ] || rm -rf "$raw"
mkdir -p "$raw"

# "total stolen idle" CPU ticks of the machine so far (/proc/stat): on a
# virtual machine the host may take CPU time the load average does not show.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $9, $5 + $6 }' /proc/stat; }

# run_once K MODEL CONTENDER REPEAT: one run on a fresh K-node cluster.
# Appends the ranks' JSON lines and a run_info line to the run's .jsonl.
run_once() {
    local k=$1 model=$2 c=$3 rep=$4 i
    local name=$model-$c-n$k
    [ "$repeats" -gt 1 ] && name+=-r$rep
    local file=$raw/$name.jsonl
    rm -f "$file" "$raw/$name".r*.err
    "$cluster" up "$k" "$rate" >&2
    local load0 t0 codes=() per_run_timeout=$((120 + steps * 20))
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    local tk0 st0 id0 tk1 st1 id1
    read -r tk0 st0 id0 < <(cpu_ticks)
    t0=$(date +%s.%N)
    pids=()
    for ((i = 0; i < k; i++)); do
        PYTHONPATH=$top/client/python OBCOMM_LIBRARY=$build/client/libobcomm.so.0 \
            OMP_NUM_THREADS=1 timeout "$per_run_timeout" \
            "$cluster" exec "$i" "$py" "$here/torch_e2e.py" run \
            --contender "$c" --model "$model" --rank "$i" --world "$k" \
            --master 10.77.0.1:29500 --steps "$steps" \
            --warmup-frac "$warmup_frac" --job "e2e-$name" \
            --onebit-args "$onebit_args" --seed "$rep" "${trainer_flags[@]}" \
            >"$raw/$name.r$i.out" 2>"$raw/$name.r$i.err" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        local rc=0
        wait "${pids[$i]}" || rc=$?
        codes+=("$rc")
        [ "$rc" -eq 0 ] || log "$name: node $i exited with $rc, see $raw/$name.r$i.err"
    done
    pids=()
    local secs load1
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    load1=$(cut -d' ' -f1-3 /proc/loadavg)
    read -r tk1 st1 id1 < <(cpu_ticks)
    local busy stolen
    busy=$(awk -v t=$((tk1 - tk0)) -v s=$((st1 - st0)) -v i=$((id1 - id0)) \
        'BEGIN { if (t <= 0) t = 1; printf "%.0f", 100 * (t - i - s) / t }')
    stolen=$(awk -v t=$((tk1 - tk0)) -v s=$((st1 - st0)) \
        'BEGIN { if (t <= 0) t = 1; printf "%.0f", 100 * s / t }')
    "$cluster" down >&2
    cat "$raw/$name".r*.out | grep '^{' >"$file" || true
    rm -f "$raw/$name".r*.out
    local codes_json
    codes_json=$(IFS=,; echo "${codes[*]}")
    printf '{"run_info":{"contender":"%s","model":"%s","nodes":%d,"repeat":%d,"rate":"%s","load_before":"%s","load_after":"%s","seconds":%.1f,"cpu_busy_pct":%d,"cpu_stolen_pct":%d,"exit_codes":[%s],"date":"%s"}}\n' \
        "$c" "$model" "$k" "$rep" "$rate" "$load0" "$load1" "$secs" "$busy" "$stolen" "$codes_json" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$file"
    log "$name: ${secs%.*} s, exit codes ${codes[*]}, load $load0 -> $load1, CPU busy $busy %, stolen $stolen %"
    for i in "${codes[@]}"; do [ "$i" -eq 0 ] || return 1; done
}

failed=0
start_load=$(cut -d' ' -f1-3 /proc/loadavg)
start_date=$(date -u +%Y-%m-%dT%H:%MZ)
for k in $nodes; do
    for model in $models; do
        for c in $contenders; do
            for ((rep = 1; rep <= repeats; rep++)); do
                log "=== $model, $c, $k nodes at $rate, $steps steps (repeat $rep)"
                run_once "$k" "$model" "$c" "$rep" || failed=1
            done
        done
    done
done

# torch's matrix products run on whatever BLAS it was built with (the
# BLAS_INFO the report records), which sets the compute floor.
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
blas=$("$py" -c 'import re, torch; m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show()); print(m.group(1) if m else "?")')
libblas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo "?")
meta="Command: \`$command\`. Started $start_date, finished $(date -u +%Y-%m-%dT%H:%MZ), on $(nproc) CPUs ($cpu, $(uname -r); \
torch $("$py" -c 'import torch; print(torch.__version__)') with BLAS_INFO=$blas, \
libblas.so.3 = $libblas), shared \
machine: load average (1/5/15 min) $start_load at the start, \
$(cut -d' ' -f1-3 /proc/loadavg) at the end. Links shaped to $rate \
(deploy/netns-cluster.sh), one trainer per node, torch threads 1, \
$steps steps, warm-up $warmup_frac of them, repeats $repeats; \
OneBitAdam: freeze_step = the warm-up, bias_correction=True, \
--onebit-args ${onebit_args:-(none)}; trainer flags: \
${trainer_flags[*]:-(defaults)}."
"$py" "$here/torch_e2e.py" report "$raw" "$out" --meta "$meta"
exit $failed
