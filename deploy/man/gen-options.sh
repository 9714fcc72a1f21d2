#!/usr/bin/env bash
# Fills the OPTIONS section of obcommd(8) from the option table (and the
# version and paths into the rest of the page): the blocks
# of `obcommd --example-config` ("# help..." lines, then "# name = default")
# become .TP entries, so the man page cannot drift from the parser.
#   gen-options.sh OBCOMMD TEMPLATE OUTPUT SYSCONFDIR
set -euo pipefail
obcommd=$1 template=$2 output=$3 sysconfdir=$4
options=$("$obcommd" --example-config | awk '
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
')
# Through the environment: awk -v would turn the \f of font changes into
# form feeds.
version=$("$obcommd" --version | awk 'NR == 1 { print $2 }')
OPTS=$options ETC=$sysconfdir VERSION=$version awk '
    $0 == "@OPTIONS@" { print ENVIRON["OPTS"]; next }
    {
        gsub(/@SYSCONFDIR@/, ENVIRON["ETC"])
        gsub(/@VERSION@/, ENVIRON["VERSION"])
        print
    }
' "$template" >"$output"
