#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the unit and
# integration suites, then builds again with AddressSanitizer +
# UndefinedBehaviorSanitizer and runs the unit suite and the representative
# integration tests of suite `asan` there. Tests run in parallel where they
# can (tests/meson.build). Prints the ten slowest tests, then "tests: N
# passed, N failed" last. The long runs (every torture round, the chaos
# test, the rest of the integration suite under the sanitizers) are
# deploy/test-slow.sh, which CI runs after this.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dataset is for the training smoke test (tests that need it would
# otherwise skip). The Python tests (tests/python, meson tests python_*,
# pytest under the project's .venv with torch 2.13) run in the normal
# build only.
deploy/build.sh dataset-fashion-mnist
. deploy/testlib.sh

run_suite build --suite unit --suite integration

deploy/setup.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-asan >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_suite build-asan --suite unit --suite asan

summary
