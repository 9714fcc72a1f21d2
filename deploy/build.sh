#!/usr/bin/env bash
# Installs what is missing (Debian packages, the project's virtualenv
# .venv with torch) and builds obcomm into build/ (release-like, with
# debug info). Used by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/bootstrap.sh "$@"
had_venv=0
[ -x .venv/bin/python ] && had_venv=1
deploy/venv.sh
if [ ! -f build/build.ninja ]; then
    meson setup build >/dev/null
elif [ "$had_venv" -eq 0 ]; then
    # The Python tests are defined only when .venv exists.
    meson setup --reconfigure build >/dev/null
fi
meson compile -C build >/dev/null
