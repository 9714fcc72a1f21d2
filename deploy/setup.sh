#!/usr/bin/env bash
# Sets up a build directory as the project's scripts and CI want it: the
# tests and the examples on, warnings as errors. A directory already set up
# is kept, unless it predates the feature options `tests` and `examples`
# (a boolean `tests`: meson cannot regenerate it, so it is set up afresh).
#   deploy/setup.sh DIR [MESON_OPTION...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1
shift
if [ -f "$dir/build.ninja" ]; then
    type=$(meson introspect "$dir" --buildoptions | python3 -c '
import json, sys
print(next((o["type"] for o in json.load(sys.stdin) if o["name"] == "tests"), ""))')
    # Older meson introspects a feature option as a combo; only a boolean
    # `tests` predates the feature options.
    [ "$type" != boolean ] && exit 0
    rm -rf "$dir"
fi
meson setup "$dir" -Dwerror=true -Dtests=enabled -Dexamples=enabled "$@" \
    >/dev/null
