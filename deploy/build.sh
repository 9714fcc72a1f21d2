#!/usr/bin/env bash
# Installs what is missing (Debian packages, the project's virtualenv
# .venv with torch) and builds obcomm into build/ (release-like, with
# debug info), with the tests and the examples, and with -Werror: here
# and in CI a warning is a failure (a packager's build keeps werror off).
# Used by run.sh and test.sh.
#   deploy/build.sh [PKG...]           extra Debian packages, as bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/bootstrap.sh "$@"
had_venv=0
[ -x .venv/bin/python ] && had_venv=1
deploy/venv.sh
deploy/setup.sh build
if [ "$had_venv" -eq 0 ]; then
    # The Python tests are defined only when .venv exists.
    meson setup --reconfigure build >/dev/null
fi
meson compile -C build >/dev/null
