#!/usr/bin/env bash
# Installs what is missing and builds obcomm into build/ (release-like,
# with debug info), with the tests and the examples, and with -Werror: here
# and in CI a warning is a failure (a packager's build keeps werror off).
# Used by run.sh and test.sh.
#   deploy/build.sh [PKG...]           extra Debian packages, as bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/bootstrap.sh "$@"
deploy/setup.sh build
meson compile -C build >/dev/null
