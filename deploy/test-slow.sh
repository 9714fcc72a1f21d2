#!/usr/bin/env bash
# The long runs, after deploy/test.sh (CI runs both, .ci/run): the `slow`
# suite (every torture round) in the normal and the
# sanitizer builds, and the integration tests that
# deploy/test.sh does not run under the sanitizers. Prints the ten slowest
# tests, then "tests: N passed, N failed" last.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh
. deploy/testlib.sh

run_suite build --suite slow

deploy/setup.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-asan >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_suite build-asan --suite slow
run_suite build-asan --suite integration --no-suite asan

summary
