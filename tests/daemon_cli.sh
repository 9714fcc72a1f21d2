#!/usr/bin/env bash
# obcommd's command line as an operator meets it: --version, exit codes of
# bad configs, --check-config with peers_file and rank auto, and `threads`
# sizing libuv's worker pool (counted in /proc/PID/task).
set -euo pipefail
obcommd=$1
dir=$(mktemp -d /tmp/obcomm-cli-XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# --version names the version, protocol, codec and build.
out=$("$obcommd" --version)
grep -q '^obcommd [0-9]\+\.[0-9]\+\.[0-9]\+$' <<<"$out" || fail "version: $out"
proto=$(sed -n 's/^#define OBCOMM_PROTO_VERSION \([0-9]*\)$/\1/p' \
    "$(dirname "$0")/../proto/wire.h")
[ -n "$proto" ] || fail "no OBCOMM_PROTO_VERSION in proto/wire.h"
grep -q "^protocol $proto\$" <<<"$out" || fail "protocol: $out (want $proto)"
grep -q '^codec \(portable\|avx2\) (built: ' <<<"$out" || fail "codec: $out"
grep -q '^build buildtype=' <<<"$out" || fail "build: $out"

# One default socket everywhere: --help, the public header, and what the
# README, docs/, the manual pages and the Python package tell.
src=$(dirname "$0")/..
want=$(sed -n 's/^#define OBCOMM_DEFAULT_SOCKET "\(.*\)"$/\1/p' "$src/include/obcomm.h")
[ "$want" = /run/obcomm/obcommd.sock ] || fail "OBCOMM_DEFAULT_SOCKET is $want"
# (grep reads all of it: with -q it may stop early and the writer's
# SIGPIPE would fail the pipeline under pipefail.)
"$obcommd" --help | grep -F -- "(default: $want)" >/dev/null ||
    fail "--help lacks $want"
stale=$(grep -rn '/tmp/obcommd\.sock' "$src/README.md" "$src/docs" \
    "$src/deploy/man" "$src/client/python/obcomm" "$src/include" || true)
[ -z "$stale" ] || fail "another default socket: $stale"

# A directory given as config file: exit 2, no daemon on defaults.
set +e
msg=$("$obcommd" -c "$dir" 2>&1); rc=$?
set -e
[ "$rc" = 2 ] || fail "-c DIR exited $rc"
grep -q "not a regular file" <<<"$msg" || fail "-c DIR said: $msg"

# peers_file with comments; rank auto finds the local entry.
cat >"$dir/peers" <<EOT
# rank order
198.51.100.7:7100   # rack 1
127.0.0.1:7100
EOT
printf 'peers_file = %s\nsocket = %s/d.sock\n' "$dir/peers" "$dir" \
    >"$dir/conf"
out=$("$obcommd" -c "$dir/conf" --check-config)
grep -q '^rank = 1$' <<<"$out" || fail "rank auto: $out"
grep -q '^# ok: 2 node(s), this is rank 1$' <<<"$out" || fail "ok: $out"

# The same node twice under two spellings is refused at start.
printf '127.0.0.1:7100\nlocalhost:7100\n' >"$dir/peers"
set +e
msg=$("$obcommd" -c "$dir/conf" --rank 0 2>&1); rc=$?
set -e
[ "$rc" = 2 ] || fail "two spellings exited $rc"
grep -q "$dir/conf:1: peers_file: ranks 0 (127.0.0.1:7100) and 1 (localhost:7100) are the same node" <<<"$msg" ||
    fail "two spellings said: $msg"

# --check-config refuses what the start refuses, with the same words:
# the key's mode, state_dir's owner and mode, an unknown socket_group.
start_fails() { # conf, expected text
    local msg rc
    set +e
    msg=$("$obcommd" -c "$1" --check-config 2>&1); rc=$?
    set -e
    [ "$rc" = 2 ] || fail "--check-config of $(cat "$1") exited $rc: $msg"
    grep -qF -- "$2" <<<"$msg" || fail "--check-config said: $msg (want $2)"
    set +e
    msg=$(timeout 10 "$obcommd" -c "$1" 2>&1); rc=$?
    set -e
    [ "$rc" = 1 ] || fail "start with $(cat "$1") exited $rc: $msg"
    grep -qF -- "$2" <<<"$msg" || fail "start said: $msg (want $2)"
}
head -c 32 /dev/urandom >"$dir/key"
chmod 644 "$dir/key"
printf 'socket = %s/d.sock\nauth_key_file = %s/key\n' "$dir" "$dir" \
    >"$dir/bad.conf"
start_fails "$dir/bad.conf" \
    "auth_key_file $dir/key: mode 0644 lets group or others at the key; run chmod 600 $dir/key"
mkdir -m 777 "$dir/state"
printf 'socket = %s/d.sock\nstate_dir = %s/state\n' "$dir" "$dir" \
    >"$dir/bad.conf"
start_fails "$dir/bad.conf" \
    "state_dir $dir/state belongs to uid $(id -u) with mode 0777: refused"
printf 'socket = %s/d.sock\nsocket_group = no-such-group-obcomm\n' "$dir" \
    >"$dir/bad.conf"
start_fails "$dir/bad.conf" "socket_group no-such-group-obcomm: no such group"

# A socket directory that does not exist yet passes the check (nothing is
# created) and the start creates it; the key with mode 0600 passes both.
chmod 600 "$dir/key"
printf 'socket = %s/run/d.sock\nauth_key_file = %s/key\nlog_level = info\n' \
    "$dir" "$dir" >"$dir/good.conf"
out=$("$obcommd" -c "$dir/good.conf" --check-config) ||
    fail "--check-config with a missing socket directory: $out"
grep -q '^# ok: 1 node(s), this is rank 0$' <<<"$out" || fail "ok: $out"
[ ! -e "$dir/run" ] || fail "--check-config created $dir/run"
"$obcommd" -c "$dir/good.conf" 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do
    [ -S "$dir/run/d.sock" ] && break
    sleep 0.05
done
[ -S "$dir/run/d.sock" ] || fail "daemon did not start: $(cat "$dir/log")"

# SIGHUP with nothing changed names nothing: rank and threads, which the
# start resolved from auto and 0, are compared as given.
kill -HUP "$pid"
for _ in $(seq 100); do
    grep -q 'SIGHUP: configuration reloaded' "$dir/log" && break
    sleep 0.05
done
grep -q "SIGHUP: configuration reloaded; nothing that can change while running changed" \
    "$dir/log" || fail "SIGHUP: $(cat "$dir/log")"
grep -q "applied only at a restart" "$dir/log" &&
    fail "SIGHUP named a change nobody made: $(cat "$dir/log")"
printf 'threads = 3\n' >>"$dir/good.conf"
kill -HUP "$pid"
for _ in $(seq 100); do
    grep -q 'applied only at a restart' "$dir/log" && break
    sleep 0.05
done
grep -q "SIGHUP: changed but applied only at a restart: threads: 0 -> 3$" \
    "$dir/log" || fail "SIGHUP threads: $(cat "$dir/log")"
kill "$pid"
wait "$pid" || fail "daemon exited $? on SIGTERM"
pid=

# A state_dir has one owner: a second daemon on it refuses to start,
# naming the first one's pid, and --check-config says the same; once the
# first is gone, the second starts.
mkdir -m 700 "$dir/owned"
"$obcommd" --socket "$dir/a.sock" --state_dir "$dir/owned" \
    --log-level warn 2>"$dir/log" &
pid=$!
for _ in $(seq 100); do
    [ -S "$dir/a.sock" ] && break
    sleep 0.05
done
[ -S "$dir/a.sock" ] || fail "daemon did not start: $(cat "$dir/log")"
want="state_dir $dir/owned is in use by obcommd pid $pid (it holds $dir/owned/lock)"
set +e
msg=$("$obcommd" --socket "$dir/b.sock" --state_dir "$dir/owned" 2>&1); rc=$?
set -e
[ "$rc" != 0 ] || fail "a second daemon on one state_dir started"
grep -qF -- "$want" <<<"$msg" || fail "second daemon said: $msg"
grep -qF -- "give this one another directory" <<<"$msg" ||
    fail "second daemon said: $msg"
[ ! -S "$dir/b.sock" ] || fail "the refused daemon left its socket"
set +e
msg=$("$obcommd" --socket "$dir/b.sock" --state_dir "$dir/owned" \
    --check-config 2>&1); rc=$?
set -e
[ "$rc" != 0 ] || fail "--check-config passed a state_dir in use"
grep -qF -- "$want" <<<"$msg" || fail "--check-config said: $msg"
kill "$pid"
wait "$pid" || fail "daemon exited $? on SIGTERM"
pid=
"$obcommd" --socket "$dir/b.sock" --state_dir "$dir/owned" --check-config \
    >/dev/null || fail "--check-config refused a free state_dir"

# threads sizes the pool: the process has its main thread and `threads`
# workers once it serves.
for threads in 3 0; do
    want=$threads
    [ "$threads" = 0 ] && want=$(nproc)
    rm -f "$dir/d.sock"
    "$obcommd" --socket "$dir/d.sock" --threads "$threads" \
        --log-level warn 2>"$dir/log" &
    pid=$!
    for _ in $(seq 100); do
        [ -S "$dir/d.sock" ] && break
        sleep 0.05
    done
    [ -S "$dir/d.sock" ] || fail "daemon did not start: $(cat "$dir/log")"
    n=$(ls "/proc/$pid/task" | wc -l)
    [ "$n" = $((want + 1)) ] ||
        fail "threads $threads: $n tasks, want $((want + 1))"
    kill "$pid"
    wait "$pid" || fail "daemon exited $? on SIGTERM"
    pid=
done
echo "ok"
