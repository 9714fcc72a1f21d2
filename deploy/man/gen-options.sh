#!/usr/bin/env bash
# Fills the OPTIONS section of obcommd(8) from the example configuration
# (and the version and paths into the rest of the page): the blocks of
# deploy/obcommd.conf.example ("# help..." lines, then "# name = default")
# become .TP entries. The example is `obcommd --example-config` (the test
# example_config holds the two equal), so the page cannot drift from the
# option table, and no obcommd has to run on the build machine: a cross
# build makes the same page.
#   gen-options.sh EXAMPLE TEMPLATE OUTPUT SYSCONFDIR VERSION
set -euo pipefail
example=$1 template=$2 output=$3 sysconfdir=$4 version=$5
options=$(awk '
    function roff(s) {
        gsub(/\\/, "\\e", s)
        gsub(/-/, "\\-", s)
        return s
    }
    NR <= 3 { next }                      # the file header
    /^# [a-z_]+ = / {
        name = $2
        sub(/^# [a-z_]+ = /, "")
        def = $0 == "" ? "(empty)" : $0
        printf ".TP\n.BR \"%s = \" \"%s\"\n", roff(name), roff(def)
        flag = name
        gsub(/_/, "-", flag)
        printf "%s\n", "Flag: \\fB\\-\\-" roff(flag) "\\fR \\fIvalue\\fR."
        # The help text; a line that starts with . or '"'"' is escaped.
        text = help
        if (text ~ /^[.'"'"']/) text = "\\&" text
        printf "%s\n", roff(text)
        help = ""
        next
    }
    /^# / { sub(/^# /, ""); help = help == "" ? $0 : help " " $0; next }
' "$example")
# Through the environment: awk -v would turn the \f of font changes into
# form feeds.
OPTS=$options ETC=$sysconfdir VERSION=$version awk '
    $0 == "@OPTIONS@" { print ENVIRON["OPTS"]; next }
    {
        gsub(/@SYSCONFDIR@/, ENVIRON["ETC"])
        gsub(/@VERSION@/, ENVIRON["VERSION"])
        print
    }
' "$template" >"$output"
