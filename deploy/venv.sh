#!/usr/bin/env bash
# Creates the project's virtualenv .venv (ignored by git) from Debian's
# /usr/bin/python3, with the Python side's packages from PyPI: torch
# 2.13.0 (the CPU build), numpy and pytest. Every Python test, example,
# benchmark and deploy/run-torch.sh runs under .venv/bin/python.
# Idempotent and quiet when the packages are there.
#
# torch is asked for by its exact version: plain `torch`, or a range
# that admits a newer release, would make pip download a CUDA build of
# several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
torch_version=2.13.0
py=$venv/bin/python

ready() {
    [ -x "$py" ] && "$py" - "$torch_version" <<'PY' 2>/dev/null
import sys
import numpy, pytest, torch  # noqa: F401
sys.exit(torch.__version__.split("+")[0] != sys.argv[1])
PY
}

ready && exit 0
echo "venv: installing torch==$torch_version numpy pytest into $venv" >&2
[ -x "$py" ] || /usr/bin/python3 -m venv "$venv"
log=$(mktemp /tmp/obcomm-venv-XXXXXX)
# torch first, pinned on its own, so that nothing installed after it can
# make pip pick another torch.
for pkgs in "torch==2.13.0" "numpy pytest"; do
    # shellcheck disable=SC2086
    if ! "$py" -m pip install -q $pkgs >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        exit 1
    fi
done
rm -f "$log"
ready || { echo "venv: $venv has no torch $torch_version" >&2; exit 1; }
