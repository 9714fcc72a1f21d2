# Shared by deploy/test.sh and deploy/test-slow.sh (sourced, not run):
# run_suite runs meson test in a build directory and adds its results to
# the totals; summary prints the ten slowest tests of every run and then
# "tests: N passed, N failed" as the last line, and fails when a test did.
passed=0
failed=0
testlogs=$(mktemp -d /tmp/obcomm-testlogs-XXXXXX)
trap 'rm -rf "$testlogs"' EXIT

run_suite() { # BUILD_DIR MESON_TEST_ARG...
    local dir=$1 rc=0 p f
    shift
    # Parallel as meson's default (one test per core) allows; tests that
    # cannot share the machine say is_parallel : false (tests/meson.build).
    meson test -C "$dir" --print-errorlogs "$@" || rc=$?
    p=$(grep -c '"result": "OK"' "$dir/meson-logs/testlog.json" || true)
    f=$(grep -vcE '"result": "(OK|SKIP)"' "$dir/meson-logs/testlog.json" || true)
    passed=$((passed + p))
    failed=$((failed + f))
    cp "$dir/meson-logs/testlog.json" \
        "$testlogs/$(ls "$testlogs" | wc -l)-$(basename "$dir").json"
    return 0
}

summary() {
    echo "slowest tests:"
    python3 - "$testlogs" <<'PY'
import json, os, sys
runs = []
for f in sorted(os.listdir(sys.argv[1])):
    build = f.split("-", 1)[1].rsplit(".", 1)[0]
    with open(os.path.join(sys.argv[1], f)) as fh:
        for line in fh:
            t = json.loads(line)
            runs.append((t["duration"], build, t["name"], t["result"]))
for d, build, name, result in sorted(runs, reverse=True)[:10]:
    print(f"  {d:8.1f} s  {build:<12} {name} ({result})")
PY
    echo "tests: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
