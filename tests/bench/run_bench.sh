#!/usr/bin/env bash
# Collective benchmark: obcomm (fp32 ring and 1-bit allreduce, allgather,
# reduce-scatter) against OpenMPI and Gloo, one process per node, on an
# emulated cluster of network namespaces with shaped links
# (deploy/netns-cluster.sh). Needs root.
#
#   tests/bench/run_bench.sh [--nodes "2 4 8"] [--sizes-mib "1 4 16 64 256"]
#       [--rate 1gbit] [--repeats N] [--warmup N] [--quick]
#       [--contenders "obcomm mpi mpi_ring gloo"] [--out DIR]
#       [--ops "allreduce allgather reduce_scatter"]
#       [--trainer "CMD ..."] [--wire-protection none|integrity|encrypt]
#       [-- obcommd flags...]
#
# --quick: 2 nodes, 1 and 4 MiB, 2 repeats (a smoke check), into
#   tests/bench/results-quick unless --out says otherwise.
# --ops: the collectives every contender runs (default allreduce); a size
#   is MiB of one fp32 tensor: the allreduce's data, the allgather's whole
#   result, the reduce-scatter's whole input.
# Contenders: obcomm = build/tests/bench/bench_allreduce (allreduce: fp32 SUM
#   and 1-bit; allgather; reduce-scatter SUM);
#   mpi = mpi_allreduce under mpirun with Open MPI's default algorithm choice
#   (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block);
#   mpi_ring = the same with coll_tuned forced to the ring allreduce (4) and
#   ring allgather (4); it skips reduce-scatter (no ring algorithm for
#   MPI_Reduce_scatter_block);
#   gloo = gloo_allreduce.py (torch 2.13 in the project's .venv),
#   allreduce and allgather (Gloo has no reduce-scatter in torch 1.13).
#   With mpi or mpi_ring, Open MPI is installed first (deploy/bootstrap.sh
#   openmpi-bin libopenmpi-dev, a benchmark-only need) and meson
#   reconfigured to find it.
# --wire-protection MODE: obcommd's wire_protection (the daemons of the
#   emulated cluster always hold a cluster key, deploy/netns-cluster.sh).
# --trainer CMD: after the contenders, for every node count, runs CMD once
#   per node with run_on_nodes (see below); its output goes to
#   $OUT/raw/trainer-n<K>-r<I>.log. This is the hook for the end-to-end
#   training comparison.
#
# Output: $OUT/raw/*.jsonl (every rank's lines), $OUT/raw/codec.json, and
# from report.py $OUT/OP.{json,md,png} per collective OP (allreduce,
# allgather, reduce_scatter); $OUT defaults to
# tests/bench/results. The cluster is always torn down, also on failure or
# Ctrl-C.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${BUILD:-$top/build}
cluster=$top/deploy/netns-cluster.sh
nodes="2 4 8"
sizes="1 4 16 64 256"
rate=1gbit
repeats=5
warmup=1
contenders="obcomm mpi mpi_ring gloo"
ops="allreduce"
out=$here/results
trainer=""
wire=""
quick=0
per_run_timeout=${BENCH_TIMEOUT:-3600}
py=$here/../../.venv/bin/python   # torch (deploy/venv.sh)

usage() { sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --sizes-mib) sizes=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --contenders) contenders=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --trainer) trainer=$2; shift 2 ;;
    --wire-protection) wire=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) echo "run_bench: unknown argument $1" >&2; usage ;;
    esac
done
daemon_flags=("$@")
[ -n "$wire" ] && daemon_flags+=(--wire_protection "$wire")
if [ $quick -eq 1 ]; then
    nodes=2 sizes="1 4" repeats=2
    # A smoke check never overwrites the committed results.
    [ "$out" = "$here/results" ] && out=$here/results-quick
fi
[ "$(id -u)" -eq 0 ] || { echo "run_bench: needs root (network namespaces)" >&2; exit 1; }
ops=${ops//,/ }
for o in $ops; do
    case "$o" in
    allreduce | allgather | reduce_scatter) ;;
    *) echo "run_bench: unknown op $o (allreduce, allgather, reduce_scatter)" >&2; usage ;;
    esac
done
[ -n "${ops// /}" ] || usage

raw=$out/raw
log() { echo "run_bench: $*" >&2; }

# The emulated cluster's namespaces have fixed names, and tearing a cluster
# down kills every process in them: never start (or tear down) while one
# is up, which may be another run's.
if ip netns list 2>/dev/null | grep -qE '^obcomm-(n[0-9]+|br)( |$)'; then
    log "an emulated cluster is up (another run?); left alone. If it is a leftover: deploy/netns-cluster.sh down"
    exit 1
fi

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    "$cluster" down >/dev/null 2>&1 || true
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Build what the benchmark runs. Open MPI is a need of this benchmark only,
# so it is installed here, not by every build; meson looks for MPI when it
# configures, so a build directory set up before the install is
# reconfigured.
bench_pkgs=()
case " $contenders " in
*" mpi "* | *" mpi_ring "*) bench_pkgs=(openmpi-bin libopenmpi-dev) ;;
esac
(cd "$top" && deploy/build.sh "${bench_pkgs[@]}")
if [ ${#bench_pkgs[@]} -gt 0 ] && [ ! -x "$build/tests/bench/mpi_allreduce" ]; then
    log "reconfiguring $build to find MPI"
    meson setup --reconfigure "$build" >/dev/null
    meson compile -C "$build" >/dev/null
fi
mkdir -p "$raw"
rm -f "$raw"/*.jsonl "$raw"/*.log "$raw"/*.err "$raw/codec.json" "$raw/load.txt"

# run_on_nodes K LABEL CMD...: runs CMD once in every namespace obcomm-n0 ..
# n{K-1} at the same time and waits for all of them. In CMD's environment:
# OBCOMM_SOCKET (the node's daemon), OBCOMM_NODE (I), OBCOMM_NODES (K),
# OBCOMM_NODE_ADDR (10.77.0.(I+1)), OBCOMM_MASTER (node 0's address), and
# the literal word {I} in CMD is replaced by I. stdout goes to
# $raw/LABEL-n<K>-r<I>.log, stderr to .err. Returns non-zero if any node's
# command failed or ran past $BENCH_TIMEOUT seconds. The hook for
# trainers: run_on_nodes 4 mytrainer python3 train.py --rank {I} ...
run_on_nodes() {
    local k=$1 label=$2 i rc=0
    shift 2
    local pids=()
    for ((i = 0; i < k; i++)); do
        local argv=("${@//\{I\}/$i}")
        OBCOMM_NODES=$k OBCOMM_MASTER=10.77.0.1 timeout "$per_run_timeout" \
            "$cluster" exec "$i" "${argv[@]}" \
            >"$raw/$label-n$k-r$i.log" 2>"$raw/$label-n$k-r$i.err" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { rc=$?; log "$label node $i of $k failed ($rc), see $raw/$label-n$k-r$i.err"; }
    done
    return $rc
}

# has_op OP: 0 if OP is among --ops.
has_op() { [[ " $ops " == *" $1 "* ]]; }

# ops_for CONTENDER: the contender's op list (comma separated) for --ops;
# empty if it runs none of them. bench_allreduce names the allreduce's two
# variants (fp32, 1bit); mpi_ring runs what Open MPI has a ring for; Gloo
# has no reduce-scatter.
ops_for() {
    local o list=""
    for o in $ops; do
        case "$1:$o" in
        obcomm:allreduce) o=fp32,1bit ;;
        mpi_ring:reduce_scatter | gloo:reduce_scatter)
            log "$1: no reduce_scatter (see --help), skipped"
            continue ;;
        esac
        list+="${list:+,}$o"
    done
    echo "$list"
}

run_obcomm() {
    local k=$1 o
    o=$(ops_for obcomm)
    run_on_nodes "$k" obcomm "$build/tests/bench/bench_allreduce" -j bench \
        -z "$sizes" -r "$repeats" -w "$warmup" -o "$o" \
        -c "$build/client/obcommctl" -d ob0 || return 1
    cat "$raw"/obcomm-n"$k"-r*.log >"$raw/obcomm-n$k.jsonl"
}

# mpirun starts in node 0's namespace; netns-rsh.sh starts the remote orted
# in the namespace of each host address.
run_mpi() {
    local k=$1 label=$2 i hosts=$raw/hosts-n$1 o
    shift 2
    [ -x "$build/tests/bench/mpi_allreduce" ] || { log "no mpi_allreduce (MPI not found at build), skipped"; return 0; }
    o=$(ops_for "$([ "$label" = openmpi ] && echo mpi || echo mpi_ring)")
    [ -n "$o" ] || return 0
    : >"$hosts"
    for ((i = 0; i < k; i++)); do echo "10.77.0.$((i + 1)) slots=1" >>"$hosts"; done
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout "$per_run_timeout" ip netns exec obcomm-n0 \
        mpirun -np "$k" --hostfile "$hosts" --map-by node \
        --mca plm_rsh_agent "$here/netns-rsh.sh" \
        --mca btl tcp,self --mca btl_tcp_if_include ob0 \
        --mca oob_tcp_if_include ob0 "$@" \
        "$build/tests/bench/mpi_allreduce" -z "$sizes" -r "$repeats" -w "$warmup" -d ob0 -o "$o" \
        >"$raw/$label-n$k.log" 2>"$raw/$label-n$k.err" || { log "$label failed, see $raw/$label-n$k.err"; return 1; }
    if [ "$label" = openmpi ]; then
        cp "$raw/$label-n$k.log" "$raw/$label-n$k.jsonl"
    else
        sed "s/\"contender\":\"openmpi\"/\"contender\":\"$label\"/" \
            "$raw/$label-n$k.log" >"$raw/$label-n$k.jsonl"
    fi
}

run_gloo() {
    local k=$1 o
    "$py" -c 'import torch.distributed' 2>/dev/null || { log "no torch for $py, gloo skipped"; return 0; }
    o=$(ops_for gloo)
    [ -n "$o" ] || return 0
    run_on_nodes "$k" gloo "$py" "$here/gloo_allreduce.py" --rank '{I}' --world "$k" \
        --master 10.77.0.1:29500 --sizes-mib "$sizes" --repeats "$repeats" \
        --warmup "$warmup" --dev ob0 --ops "$o" || return 1
    cat "$raw"/gloo-n"$k"-r*.log >"$raw/gloo-n$k.jsonl"
}

# "total stolen idle" CPU ticks of the machine so far (/proc/stat): on a
# virtual machine the host may take CPU time the load average does not show.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $9, $5 + $6 }' /proc/stat; }
# cpu_share T0 S0 I0: "busy B %, stolen S %" of the CPU time since then.
cpu_share() {
    read -r t s i < <(cpu_ticks)
    awk -v dt=$((t - $1)) -v ds=$((s - $2)) -v di=$((i - $3)) \
        'BEGIN { if (dt <= 0) dt = 1; printf "busy %.0f %%, stolen %.0f %%", 100 * (dt - di - ds) / dt, 100 * ds / dt }'
}

failed=0
for k in $nodes; do
    log "=== $k nodes at $rate, $ops, sizes $sizes MiB, $repeats repeats"
    # The machine may be shared: keep its load next to the numbers.
    echo "$k nodes start: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$raw/load.txt"
    read -r t0 s0 i0 < <(cpu_ticks)
    "$cluster" up "$k" "$rate" -- "${daemon_flags[@]}" >&2
    for c in $contenders; do
        log "$c on $k nodes"
        case "$c" in
        obcomm) run_obcomm "$k" || failed=1 ;;
        mpi) run_mpi "$k" openmpi || failed=1 ;;
        mpi_ring) run_mpi "$k" openmpi_ring --mca coll_tuned_use_dynamic_rules 1 \
            --mca coll_tuned_allreduce_algorithm 4 \
            --mca coll_tuned_allgather_algorithm 4 || failed=1 ;;
        gloo) run_gloo "$k" || failed=1 ;;
        *) log "unknown contender $c"; failed=1 ;;
        esac
    done
    if [ -n "$trainer" ]; then
        log "trainer on $k nodes: $trainer"
        # shellcheck disable=SC2086 # the trainer command is split on purpose
        run_on_nodes "$k" trainer $trainer || failed=1
    fi
    echo "$k nodes end: $(cut -d' ' -f1-3 /proc/loadavg); CPU time meanwhile: $(cpu_share "$t0" "$s0" "$i0")" >>"$raw/load.txt"
    "$cluster" down >&2
done

# The codec figures go with the 1-bit allreduce.
if has_op allreduce; then
    log "codec figures (bench_codec --json)"
    codec_n=$((64 * 1048576))
    [ $quick -eq 1 ] && codec_n=1048576
    "$build/tests/bench/bench_codec" --json -n "$codec_n" -r "$([ $quick -eq 1 ] && echo 3 || echo 5)" \
        >"$raw/codec.json" 2>"$raw/codec.err" || { log "bench_codec failed"; failed=1; }
fi

meta="ops: $ops; nodes: $nodes; sizes MiB: $sizes; repeats $repeats (+$warmup warm-up); rate $rate; \
obcommd flags: ${daemon_flags[*]:-(defaults)}; $(nproc) CPUs, $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); \
load average (1/5/15 min) and CPU time (busy, stolen by the host) per node count: $(tr '\n' ';' <"$raw/load.txt")"
# The report and its plot: Debian's python3 with python3-matplotlib.
/usr/bin/python3 "$here/report.py" "$raw" "$out" "$rate" "$meta"
exit $failed
