#!/usr/bin/env bash
# Installs the Debian packages obcomm needs to build, test and run, and
# nothing else. Idempotent and quiet when everything is already there.
set -euo pipefail

packages=(
    build-essential meson ninja-build pkg-config
    libuv1-dev libprotobuf-c-dev protobuf-c-compiler liblz4-dev check
    libsodium-dev
    zlib1g-dev clang-format iproute2 procps
    iptables  # iptables-legacy: fault injection of tests/chaos/
    libjson-c-dev python3
    prometheus man-db groff-base  # promtool and man -l for the tests
    # The Python package runs in the project's virtualenv (deploy/venv.sh
    # puts torch, numpy and pytest there from PyPI).
    python3-venv
)
# Extra packages a caller asks for (benchmarks, datasets): bootstrap.sh PKG...
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "bootstrap: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
