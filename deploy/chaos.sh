#!/usr/bin/env bash
# Long chaos run: builds obcomm, then repeats random fault scenarios of the
# chaos test (tests/chaos/chaos.py: loss, one-way drops, partitions of 5 s
# and 60 s, a flapping link, kill -9 of a daemon, damaged snapshots, a
# partition during a snapshot op, a trainer restarted alone, a lingering
# node) on 3 obcomm nodes in network namespaces until SECONDS pass,
# checking the failure contract of docs/design.md, "The 1-bit state's
# lifecycle and failures", after each. Prints a summary per scenario and at the end;
# exit 0 only when every check passed. Needs root.
#
#   deploy/chaos.sh SECONDS [--seed S] [--keep] [--workdir DIR]
#
# The same seed replays the same scenarios with the same parameters (the
# timing of the faults against the op stream still varies). Logs stay in
# the work dir it prints when a check failed (or with --keep).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-}
[[ "$secs" =~ ^[0-9]+$ ]] || {
    echo "usage: $0 SECONDS [--seed S] [--keep] [--workdir DIR]" >&2
    exit 2
}
shift
deploy/build.sh
export OBCOMMD=$PWD/build/daemon/obcommd OBCOMMCTL=$PWD/build/client/obcommctl
export OBCOMM_ALLREDUCE=$PWD/build/client/obcomm-allreduce
export OBCOMM_CHAOS_TRAINER=$PWD/build/tests/chaos/chaos-trainer
exec tests/chaos/chaos.sh --seconds "$secs" "$@"
