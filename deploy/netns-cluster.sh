#!/usr/bin/env bash
# An emulated K-node obcomm cluster on one machine: K network namespaces
# obcomm-n0..n{K-1}, each joined to a bridge by a veth pair whose both ends
# are shaped with tbf, and one obcommd per namespace.
#
#   deploy/netns-cluster.sh up K [RATE] [-- obcommd flags...]
#                                           ("{i}" in a flag: the node index)
#   deploy/netns-cluster.sh down
#   deploy/netns-cluster.sh exec I CMD...   run CMD in node I's namespace,
#                                           with OBCOMM_SOCKET set to its daemon
#   deploy/netns-cluster.sh status
#
# Topology (needs root):
#
#   netns obcomm-br:  bridge obbr0 <- obv0 ... obv{K-1}   (no address)
#   netns obcomm-nI:  lo, ob0 = 10.77.0.(I+1)/24  (veth peer of obvI)
#
# The bridge lives in its own namespace, so the root namespace gets no
# interface, route or address. Node I's egress (ob0) and ingress (obvI
# egress towards it) are each shaped by `tbf rate RATE`, i.e. each node can
# send RATE and receive RATE at once, like a full-duplex port on a switch.
# RATE is a tc rate (default 1gbit). tbf counts whole frames (Ethernet + IP +
# TCP headers): with MTU 1500 a TCP stream gets at most 1448/1514 = 95.6% of
# RATE as payload.
#
# Daemons: obcommd --rank I --peers 10.77.0.1:PORT,... --listen
# 10.77.0.(I+1):PORT --auth_key_file $DIR/cluster.key (a fresh key per
# `up`) --socket $DIR/nI.sock, log $DIR/nI.log, where DIR is
# $OBCOMM_NETNS_DIR (default /tmp/obcomm-netns) and PORT $OBCOMM_NETNS_PORT
# (default 7800). Binaries come from $BUILD (default build/).
#
# `down` is idempotent and works after a crash: it kills every process
# still inside an obcomm-* namespace (by pid, from `ip netns pids`), then
# deletes the namespaces and the run dir's sockets.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
dir=${OBCOMM_NETNS_DIR:-/tmp/obcomm-netns}
build=${BUILD:-$top/build}
port=${OBCOMM_NETNS_PORT:-7800}
prefix=obcomm-n
brns=obcomm-br
subnet=10.77.0

die() {
    echo "netns-cluster: $*" >&2
    exit 1
}

addr() { echo "$subnet.$(($1 + 1))"; }

# Our namespaces, whether or not a previous run finished cleanly.
our_netns() {
    ip netns list 2>/dev/null | awk '{print $1}' |
        grep -E "^(${prefix}[0-9]+|${brns})$" || true
}

down() {
    local ns pids
    for ns in $(our_netns); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] && kill $pids 2>/dev/null || true
    done
    for _ in $(seq 50); do
        local left=""
        for ns in $(our_netns); do
            left+=$(ip netns pids "$ns" 2>/dev/null || true)
        done
        [ -z "$left" ] && break
        sleep 0.1
    done
    for ns in $(our_netns); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    done
    for ns in $(our_netns); do
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -f "$dir"/n*.sock "$dir/nodes" "$dir/rate" "$dir/cluster.key"
}

# shape DEV RATE [NETNS]: tbf on DEV's egress. burst must hold at least a
# GSO super-packet (64 KiB) and one timer tick of tokens; latency bounds
# the queue (rate * latency bytes).
shape() {
    ip -n "$3" link set "$1" gso_max_size 65536 2>/dev/null || true
    ip netns exec "$3" tc qdisc replace dev "$1" root tbf rate "$2" \
        burst 256kb latency 20ms
}

up() {
    local k=${1:-} rate=${2:-1gbit}
    [ -n "$k" ] || die "usage: up K [RATE] [-- obcommd flags]"
    shift $(($# < 2 ? $# : 2))
    [ "${1:-}" = "--" ] && shift
    [[ "$k" =~ ^[1-8]$ ]] || die "K must be 1..8"
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
    [ -x "$build/daemon/obcommd" ] || die "no $build/daemon/obcommd; run deploy/build.sh"
    [ -z "$(our_netns)" ] || die "already up (run '$0 down' first)"
    mkdir -p "$dir"
    # On any failure below, leave nothing behind.
    trap 'down' ERR

    ip netns add "$brns"
    ip -n "$brns" link set lo up
    ip -n "$brns" link add obbr0 type bridge
    ip -n "$brns" link set obbr0 up
    local i peers=""
    for ((i = 0; i < k; i++)); do
        local ns=$prefix$i
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add obv$i netns "$brns" type veth peer name ob0 netns "$ns"
        ip -n "$brns" link set obv$i master obbr0
        ip -n "$brns" link set obv$i up
        ip -n "$ns" addr add "$(addr $i)/24" dev ob0
        ip -n "$ns" link set ob0 up
        shape ob0 "$rate" "$ns"
        shape obv$i "$rate" "$brns"
        peers+="${peers:+,}$(addr $i):$port"
    done
    # The addresses are not loopback, so the daemons need a cluster key
    # (protected mode): one fresh key per cluster, readable by root only.
    # A --auth_key_file among the flags overrides it.
    (umask 077 && head -c 32 /dev/urandom >"$dir/cluster.key")
    # "{i}" in a flag becomes the node's index (--trace_file /tmp/t{i}.json).
    for ((i = 0; i < k; i++)); do
        ip netns exec "$prefix$i" "$build/daemon/obcommd" --rank "$i" \
            --peers "$peers" --listen "$(addr $i):$port" \
            --auth_key_file "$dir/cluster.key" \
            --socket "$dir/n$i.sock" "${@//\{i\}/$i}" >"$dir/n$i.log" 2>&1 &
    done
    echo "$k" >"$dir/nodes"
    echo "$rate" >"$dir/rate"
    # Wait until every daemon answers and sees all its links.
    for ((i = 0; i < k; i++)); do
        local ok=0
        for _ in $(seq 200); do
            if "$build/client/obcommctl" -s "$dir/n$i.sock" --json metrics \
                2>/dev/null | grep -q "\"links_up\",\"kind\":\"gauge\",\"value\":$((k - 1))[,}]"; then
                ok=1
                break
            fi
            sleep 0.05
        done
        [ $ok -eq 1 ] || { cat "$dir/n$i.log" >&2; false; }
    done
    trap - ERR
    echo "netns-cluster: $k nodes up at $rate; sockets $dir/n0.sock .. n$((k - 1)).sock"
}

node_exec() {
    local i=${1:-}
    [[ "$i" =~ ^[0-9]+$ ]] || die "usage: exec I CMD..."
    shift
    ip netns list | grep -q "^$prefix$i\b" || die "no namespace $prefix$i"
    exec ip netns exec "$prefix$i" env OBCOMM_SOCKET="$dir/n$i.sock" \
        OBCOMM_NODE="$i" OBCOMM_NODE_ADDR="$(addr "$i")" "$@"
}

status() {
    local ns
    for ns in $(our_netns); do
        echo "== $ns: $(ip -n "$ns" -br addr | grep -v '^lo' | tr -s ' ' | tr '\n' ';')"
        ip netns exec "$ns" tc qdisc show | grep tbf || true
    done
    for s in "$dir"/n*.sock; do
        [ -S "$s" ] || continue
        echo "== $s"
        "$build/client/obcommctl" -s "$s" peers || true
    done
}

case "${1:-}" in
up) shift; up "$@" ;;
down) down ;;
exec) shift; node_exec "$@" ;;
status) status ;;
*) echo "usage: $0 up K [RATE] [-- obcommd flags] | down | exec I CMD... | status" >&2; exit 2 ;;
esac
