#!/usr/bin/env bash
# Usage: check_exports.sh LIBRARY.so HEADER
# Fails unless the dynamic symbols LIBRARY defines are exactly the functions
# HEADER declares with OBCOMM_API: nothing internal leaks (protobuf-c code,
# obc_* helpers), and nothing public is missing.
set -euo pipefail

lib=$1
header=$2
nm=${NM:-nm}

exported=$("$nm" -D --defined-only "$lib" | awk '{ print $NF }' | sort -u)
declared=$(grep 'OBCOMM_API' "$header" | grep -v '#' |
    grep -oE '\bobcomm_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u)

if [ -z "$declared" ]; then
    echo "exports: found no OBCOMM_API functions in $header" >&2
    exit 1
fi

status=0
extra=$(comm -23 <(echo "$exported") <(echo "$declared"))
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
if [ -n "$extra" ]; then
    echo "exports: $lib exports symbols outside the public API:" >&2
    echo "$extra" | sed 's/^/  /' >&2
    status=1
fi
if [ -n "$missing" ]; then
    echo "exports: $lib does not export:" >&2
    echo "$missing" | sed 's/^/  /' >&2
    status=1
fi
[ $status -eq 0 ] && echo "exports: $(echo "$exported" | wc -l) obcomm_* symbols, as declared"
exit $status
