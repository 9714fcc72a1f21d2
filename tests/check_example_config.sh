#!/usr/bin/env bash
# deploy/obcommd.conf.example is generated from the option table
# (obcommd --example-config); this fails when the two drift apart, and
# checks that the example parses as a config file.
set -euo pipefail
obcommd=$1 example=$2
diff -u "$example" <("$obcommd" --example-config)
"$obcommd" -c "$example" --check-config >/dev/null
