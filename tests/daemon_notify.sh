#!/usr/bin/env bash
# obcommd's sd_notify protocol, with a stand-in for systemd's
# NOTIFY_SOCKET: READY=1 once it serves, WATCHDOG=1 from the loop at half
# of WATCHDOG_USEC (counted, not timed), STOPPING=1 on SIGTERM; no
# WATCHDOG=1 when WATCHDOG_PID names another process.
set -euo pipefail
obcommd=$1
dir=$(mktemp -d /tmp/obcomm-notify-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Receives datagrams on $1 and appends each to $2, one a line.
listen() {
    python3 - "$1" "$2" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode().replace("\n", "|") + "\n")
PY
    pids+=($!)
    for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
    fail "no notify socket"
}
count() { grep -c "$1" "$2" || true; }

listen "$dir/notify" "$dir/got"
NOTIFY_SOCKET=$dir/notify WATCHDOG_USEC=100000 \
    "$obcommd" --socket "$dir/d.sock" --log-level warn 2>"$dir/log" &
d=$!
pids+=($d)
for _ in $(seq 400); do
    [ "$(count '^WATCHDOG=1$' "$dir/got")" -ge 3 ] && break
    sleep 0.05
done
[ "$(count '^WATCHDOG=1$' "$dir/got")" -ge 3 ] || fail "watchdog: $(cat "$dir/got")"
[ "$(head -1 "$dir/got")" = "READY=1|STATUS=node 0 of 1" ] ||
    fail "first message: $(head -1 "$dir/got")"
kill "$d"
wait "$d" || fail "exit status $?"
[ "$(tail -1 "$dir/got")" = "STOPPING=1" ] || fail "last: $(tail -1 "$dir/got")"

# WATCHDOG_PID of another process: READY=1 but no pings, while a daemon
# started after it with its own pid pings five times.
listen "$dir/notify2" "$dir/got2"
: >"$dir/got"
NOTIFY_SOCKET=$dir/notify WATCHDOG_USEC=20000 WATCHDOG_PID=1 \
    "$obcommd" --socket "$dir/e.sock" --log-level warn 2>"$dir/log" &
e=$!
pids+=($e)
for _ in $(seq 200); do [ -s "$dir/got" ] && break; sleep 0.05; done
NOTIFY_SOCKET=$dir/notify2 WATCHDOG_USEC=20000 \
    "$obcommd" --socket "$dir/f.sock" --log-level warn 2>"$dir/log2" &
f=$!
pids+=($f)
for _ in $(seq 400); do
    [ "$(count '^WATCHDOG=1$' "$dir/got2")" -ge 5 ] && break
    sleep 0.05
done
[ "$(count '^WATCHDOG=1$' "$dir/got2")" -ge 5 ] || fail "second daemon"
kill "$e" "$f"
wait "$e" || fail "exit status $?"
wait "$f" || fail "exit status $?"
[ "$(count '^READY=1' "$dir/got")" = 1 ] || fail "no READY: $(cat "$dir/got")"
[ "$(count '^WATCHDOG=1$' "$dir/got")" = 0 ] || fail "pinged for another pid"
echo ok
