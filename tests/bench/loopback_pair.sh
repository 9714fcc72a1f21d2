# Sourced by the loopback benchmarks (cpu_per_op.sh, ring_threads.sh): two
# obcommd on loopback in a temporary directory, cleaned up on exit.
#
#   pair_init PREFIX        makes $dir (/tmp/PREFIX-XXXXXX) and the EXIT trap
#   pair_start BIN LOG [NODES]
#                           starts two daemons of BIN on free loopback ports
#                           (stderr to $dir/LOG-0.log, -1.log), waits for
#                           their sockets $dir/n0.sock, n1.sock; their pids
#                           are ${pids[0]} and ${pids[1]}; with NODES=1 one
#                           daemon without peers (a one-node world), n0.sock
#   pair_stop               kills and reaps them and removes the sockets
pids=()

pair_stop() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
    rm -f "$dir"/n*.sock
}

pair_init() {
    dir=$(mktemp -d "/tmp/$1-XXXXXX")
    trap 'pair_stop; rm -rf "$dir"' EXIT
}

pair_start() {
    local bin=$1 log=$2 nodes=${3:-2} p0 p1 i
    if [ "$nodes" = 1 ]; then
        "$bin" --socket "$dir/n0.sock" 2>"$dir/$log-0.log" &
        pids+=($!)
        for _ in $(seq 200); do [ -S "$dir/n0.sock" ] && break; sleep 0.05; done
        return
    fi
    # Ports from tests/python/ports.py, locked until this shell exits: a
    # port the kernel picked (bind to port 0) may be handed to another
    # connection before the daemon binds it.
    read -r p0 p1 < <(python3 "$(dirname "${BASH_SOURCE[0]}")/../python/ports.py" 2 $$)
    for i in 0 1; do
        "$bin" --socket "$dir/n$i.sock" --rank $i \
            --peers "127.0.0.1:$p0,127.0.0.1:$p1" 2>"$dir/$log-$i.log" &
        pids+=($!)
    done
    for i in 0 1; do
        for _ in $(seq 200); do [ -S "$dir/n$i.sock" ] && break; sleep 0.05; done
    done
}
