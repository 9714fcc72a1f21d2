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
