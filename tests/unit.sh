#!/usr/bin/env bash
# The systemd unit as systemd judges it: `systemd-analyze verify` without a
# word, and `systemd-analyze security --offline=true` rating its exposure at
# most 2.5 (--threshold is in tenths). Skipped where systemd-analyze is
# missing. The unit is the configured one with ExecStart pointing at the
# built obcommd, and the man pages of its Documentation= on MANPATH.
#   unit.sh UNIT OBCOMMD MAN_PAGE...
set -euo pipefail
unit=$1 obcommd=$(realpath "$2")
shift 2
if ! command -v systemd-analyze >/dev/null; then
    echo "SKIP: no systemd-analyze"
    exit 77
fi
dir=$(mktemp -d /tmp/obcomm-unit-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for page in "$@"; do
    section=${page##*.}
    mkdir -p "$dir/man/man$section"
    cp "$page" "$dir/man/man$section/"
done
bindir=$(sed -n 's|^ExecStart=\(/.*\)/obcommd .*|\1|p' "$unit")
[ -n "$bindir" ] || fail "no ExecStart in $unit"
sed "s|$bindir/obcommd|$obcommd|g" "$unit" >"$dir/obcommd.service"

out=$(MANPATH=$dir/man systemd-analyze verify "$dir/obcommd.service" 2>&1) ||
    fail "verify: $out"
[ -z "$out" ] || fail "verify says: $out"

report=$(systemd-analyze security --offline=true --threshold=25 \
    "$dir/obcommd.service" 2>&1) || fail "exposure over 2.5: $(tail -1 <<<"$report")"
level=$(sed -n 's/.*Overall exposure level for obcommd.service: \([0-9.]*\).*/\1/p' <<<"$report")
echo "ok: verify clean, exposure $level"

# What the unit promises the daemon: paths that match the installed
# configuration, the watchdog and reload.
grep -qx 'RuntimeDirectory=obcomm' "$unit" || fail "RuntimeDirectory"
grep -qx 'StateDirectory=obcomm' "$unit" || fail "StateDirectory"
grep -qx 'DynamicUser=yes' "$unit" || fail "DynamicUser"
grep -q '^WatchdogSec=' "$unit" || fail "WatchdogSec"
grep -qx 'ExecReload=/bin/kill -HUP $MAINPID' "$unit" || fail "ExecReload"
