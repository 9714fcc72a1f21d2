#!/usr/bin/env bash
# A local multi-node obcomm cluster for development: K obcommd processes on
# loopback, one per "node", each with its own Unix socket.
#
#   deploy/local-cluster.sh start K [BASE_PORT] [extra obcommd flags...]
#   deploy/local-cluster.sh status
#   deploy/local-cluster.sh stop
#
# Sockets: $OBCOMM_LOCAL_DIR/node<i>.sock (default /tmp/obcomm-local),
# logs: $OBCOMM_LOCAL_DIR/node<i>.log. Binaries come from $BUILD (default
# build/). A state_dir is one daemon's (obcommd refuses one that another
# daemon holds): `--state-dir DIR` gives node i DIR/node<i>.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
dir=${OBCOMM_LOCAL_DIR:-/tmp/obcomm-local}
build=${BUILD:-$top/build}

start() {
    local k=$1 base=${2:-7800}
    shift 2 || shift $#
    if [ -f "$dir/pids" ]; then
        echo "local-cluster: already running (see $dir); stop it first" >&2
        exit 1
    fi
    mkdir -p "$dir"
    # --state-dir DIR (or --state_dir, or =DIR) becomes DIR/node<i>.
    local flags=() state=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --state-dir | --state_dir) state=${2:?"$1 needs a directory"}; shift 2 ;;
        --state-dir=* | --state_dir=*) state=${1#*=}; shift ;;
        *) flags+=("$1"); shift ;;
        esac
    done
    if [ -n "$state" ]; then
        mkdir -p -m 700 "$state"
    fi
    local peers=""
    for ((i = 0; i < k; i++)); do
        peers+="${peers:+,}127.0.0.1:$((base + i))"
    done
    for ((i = 0; i < k; i++)); do
        local own=()
        [ -n "$state" ] && own=(--state_dir "$state/node$i")
        "$build/daemon/obcommd" --rank "$i" --peers "$peers" \
            --socket "$dir/node$i.sock" "${own[@]}" "${flags[@]}" \
            >"$dir/node$i.log" 2>&1 &
        echo $! >>"$dir/pids"
    done
    # Wait until every daemon answers on its socket; one that exited
    # (a config it refused) fails the start with its log.
    local i=0
    for pid in $(cat "$dir/pids"); do
        for _ in $(seq 100); do
            "$build/client/obcommctl" -s "$dir/node$i.sock" status \
                >/dev/null 2>&1 && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "local-cluster: node $i did not start:" >&2
            cat "$dir/node$i.log" >&2
            stop
            exit 1
        fi
        i=$((i + 1))
    done
    echo "local-cluster: $k nodes up; sockets $dir/node0.sock .. node$((k - 1)).sock"
}

stop() {
    [ -f "$dir/pids" ] || return 0
    local pids
    pids=$(cat "$dir/pids")
    kill $pids 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 $pids 2>/dev/null || break
        sleep 0.05
    done
    kill -9 $pids 2>/dev/null || true
    rm -f "$dir/pids" "$dir"/node*.sock
}

status() {
    for s in "$dir"/node*.sock; do
        [ -S "$s" ] || continue
        echo "== $s"
        "$build/client/obcommctl" -s "$s" peers || true
    done
}

case "${1:-}" in
start) shift; start "$@" ;;
stop) stop ;;
status) status ;;
*) echo "usage: $0 start K [BASE_PORT] [obcommd flags] | status | stop" >&2; exit 2 ;;
esac
