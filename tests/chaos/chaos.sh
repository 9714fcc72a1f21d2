#!/usr/bin/env bash
# The chaos test (see chaos.py): skipped (exit 77) without root, ip or
# iptables-legacy. Arguments go to chaos.py: --short (the meson test,
# about 3 minutes), --seconds N (random scenarios until N seconds pass),
# --only NAME,..., --seed S, --keep, --workdir DIR.
# Whatever happens to the driver, nothing it made stays behind: on exit
# (also on SIGTERM from meson's timeout) the namespaces, their iptables
# rules and the processes inside them are removed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then
    echo "chaos: needs root (network namespaces, iptables); skipped"
    exit 77
fi
for t in ip iptables-legacy python3; do
    if ! command -v "$t" >/dev/null; then
        echo "chaos: no $t; skipped (deploy/bootstrap.sh installs iptables)"
        exit 77
    fi
done
export PYTHONDONTWRITEBYTECODE=1
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid"
    "$py" "$here/chaos.py" --cleanup
}
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 129' HUP
"$py" "$here/chaos.py" "$@" &
pid=$!
wait "$pid"
rc=$?
pid=
"$py" "$here/chaos.py" --cleanup
exit $rc
