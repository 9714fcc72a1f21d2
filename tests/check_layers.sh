#!/usr/bin/env bash
# The daemon's modules form a tree (daemon.h draws it): the modules that
# talk to the outside (ctl.c: trainers, peers.c: other nodes) and the op
# core (job.c) never include each other's headers the wrong way round, so
# no call goes job -> ctl, job -> peers, peers -> job or peers -> ctl.
# Usage: check_layers.sh DAEMON_DIR
set -euo pipefail
dir=$1
bad=0
forbid() { # file header...
    local f=$1
    shift
    for h in "$@"; do
        if grep -q "^#include \"$h\"" "$dir/$f"; then
            echo "check_layers: $f includes $h (a circle through the daemon)" >&2
            bad=1
        fi
    done
}
forbid job.c ctl.h peers.h daemon.c
forbid job.h ctl.h peers.h
forbid peers.c job.h ctl.h coll.h efstore.h
forbid peers.h job.h ctl.h coll.h
forbid handshake.c job.h ctl.h coll.h efstore.h
forbid link.h job.h ctl.h coll.h
forbid auth.c uv.h job.h peers.h
forbid coll_ring.c ctl.h peers.h
forbid coll_onebit.c ctl.h peers.h
forbid efstore.c job.h ctl.h peers.h coll.h snapset.h
forbid coll_efstate.c ctl.h peers.h
forbid snapset.c uv.h job.h efstore.h daemon.h
forbid onebit_task.c uv.h job.h
for pure in onebit_task codec reduce frame ring runq snapset; do
    [ -f "$dir/$pure.h" ] || continue
    case $pure in runq) continue ;; esac
    if grep -q '^#include <uv.h>' "$dir/$pure.h"; then
        echo "check_layers: $pure.h includes uv.h but is pure" >&2
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "check_layers: no circle through job, ctl and peers"
exit $bad
