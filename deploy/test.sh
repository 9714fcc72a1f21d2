#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test, then
# builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs
# every test there too. Prints "N passed, N failed" last.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dataset is for the training smoke test (tests that need it would
# otherwise skip). The Python tests (tests/python, meson tests python_*,
# pytest under /usr/bin/python3) run in the normal build only: the ASan
# build's libobcomm cannot be loaded into an uninstrumented python.
deploy/build.sh dataset-fashion-mnist

passed=0
failed=0
run_suite() { # build dir
    local dir=$1 rc=0
    meson test -C "$dir" --print-errorlogs --num-processes 1 || rc=$?
    local p f
    p=$(grep -c '"result": "OK"' "$dir/meson-logs/testlog.json" || true)
    f=$(grep -vcE '"result": "(OK|SKIP)"' "$dir/meson-logs/testlog.json" || true)
    passed=$((passed + p))
    failed=$((failed + f))
    return 0
}

run_suite build

deploy/setup.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-asan >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_suite build-asan

echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
