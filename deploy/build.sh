#!/usr/bin/env bash
# Installs what is missing and builds obcomm into build/ (release-like,
# with debug info). Used by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/bootstrap.sh "$@"
[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
