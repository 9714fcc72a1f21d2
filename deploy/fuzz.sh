#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz/ for SECONDS each, one after the
# other, with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer:
#
#     deploy/fuzz.sh SECONDS [TARGET...]
#
# Targets: frame peer_msg client_msg config efstate (default: all). The
# targets are built with clang in build-fuzz/ (its own meson setup). Each
# starts from its seed corpus in tests/fuzz/corpus/<name>/ and keeps what
# it finds in build-fuzz/corpus/<name>/ (a scratch dir, not the repo; copy
# an input into the seed corpus by hand when it is worth keeping). A crash
# stops the run and leaves its input in build-fuzz/crashes/<name>/; the
# last lines say how many executions each target made.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 SECONDS [TARGET...]" >&2
    exit 2
fi
seconds=$1
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame peer_msg client_msg config efstate)

deploy/bootstrap.sh clang libfuzzer-14-dev

dir=build-fuzz
if [ ! -f $dir/build.ninja ]; then
    # Coverage instrumentation and the sanitizers on all of the daemon's
    # code, libFuzzer's main only on the fuzz executables. Warnings are the
    # normal builds' business; a new clang warning must not stop fuzzing.
    CC=clang meson setup $dir \
        -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=false \
        -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined' \
        >/dev/null
else
    ninja -C $dir build.ninja >/dev/null # pick up meson.build changes
fi
out=$(meson compile -C $dir $(printf 'tests/fuzz/fuzz_%s ' "${targets[@]}")) ||
    { echo "$out" >&2; exit 1; }

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
summary=()
for t in "${targets[@]}"; do
    mkdir -p $dir/corpus/$t $dir/crashes/$t $dir/logs
    log=$dir/logs/$t.log
    echo "fuzz: $t for ${seconds}s" >&2
    rc=0
    # -rss_limit_mb: the targets bound what they allocate; a bigger RSS is
    # itself a finding. -max_len: above every seed and every bound the
    # parsers care about at header level.
    $dir/tests/fuzz/fuzz_$t -max_total_time="$seconds" -print_final_stats=1 \
        -rss_limit_mb=1024 -max_len=65536 -timeout=10 \
        -artifact_prefix=$dir/crashes/$t/ \
        $dir/corpus/$t tests/fuzz/corpus/$t >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 || true)
    summary+=("$t: ${execs:-?} executions, ${cov:-cov: ?}, exit $rc")
    if [ $rc -ne 0 ]; then
        tail -n 40 "$log" >&2
        printf '%s\n' "${summary[@]}"
        echo "fuzz: $t failed; input in $dir/crashes/$t/, log in $log" >&2
        exit 1
    fi
done
printf '%s\n' "${summary[@]}"
