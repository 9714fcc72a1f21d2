#!/usr/bin/env bash
# deploy/obcommd.conf.example is generated from the option table, with the
# paths the systemd unit provides set (its RuntimeDirectory= and
# StateDirectory=); this fails when the two drift apart, and checks that
# the example parses as a config file. Regenerate it with:
#   obcommd --example-config --socket /run/obcomm/obcommd.sock \
#       --state-dir /var/lib/obcomm > deploy/obcommd.conf.example
set -euo pipefail
obcommd=$1 example=$2
diff -u "$example" <("$obcommd" --example-config \
    --socket /run/obcomm/obcommd.sock --state-dir /var/lib/obcomm)
# The directories need not exist here: the check runs with its own.
dir=$(mktemp -d /tmp/obcomm-example-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$obcommd" -c "$example" --socket "$dir/obcommd.sock" --state-dir "$dir" \
    --check-config >/dev/null
