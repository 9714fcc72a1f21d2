#!/usr/bin/env bash
# `meson install` as a packager runs it: into a DESTDIR, then a program
# built with `pkg-config --cflags --libs obcomm` alone runs against the
# installed obcommd, the unit names the installed paths, and every manual
# page renders without a groff warning.
#   install.sh MESON BUILD_ROOT
set -euo pipefail
meson=$1 build=$2
dir=$(mktemp -d /tmp/obcomm-install-XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A sanitizer build's library needs the sanitizer's runtime in every
# program that links it: not what a package ships, and not what
# `pkg-config --libs` alone can link. Meson before 1.8 says "none", later
# ones an empty list.
sanitize=$("$meson" introspect "$build" --buildoptions |
    python3 -c '
import json, sys
v = [o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize"][0]
v = ",".join(v) if isinstance(v, list) else v
print(v or "none")')
if [ "$sanitize" != none ]; then
    echo "SKIP: b_sanitize=$sanitize"
    exit 77
fi

dest=$dir/dest
"$meson" install -C "$build" --destdir "$dest" --no-rebuild --quiet \
    >"$dir/install.log" 2>&1 || fail "meson install: $(cat "$dir/install.log")"
prefix=$("$meson" introspect "$build" --buildoptions |
    python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
root=$dest$prefix

# What a package holds.
for f in bin/obcommd bin/obcommctl include/obcomm.h \
    lib/systemd/system/obcommd.service etc/obcomm/obcommd.conf \
    share/doc/obcomm/README.md share/doc/obcomm/examples/obcommd.conf.example \
    share/man/man8/obcommd.8 share/man/man8/obcommctl.8 \
    share/man/man3/obcomm.3 share/man/man7/obcomm.7; do
    [ -e "$root/$f" ] || fail "not installed: $prefix/$f"
done
pc=$(find "$dest" -name obcomm.pc)
[ -n "$pc" ] || fail "no obcomm.pc"
libdir=$(dirname "$(dirname "$pc")")
[ -e "$libdir/libobcomm.so.0" ] || fail "no libobcomm.so.0 in $libdir"

# The unit names the installed programs and configuration.
unit=$root/lib/systemd/system/obcommd.service
grep -qx "ExecStart=$prefix/bin/obcommd -c $prefix/etc/obcomm/obcommd.conf" \
    "$unit" || fail "unit: $(grep Exec "$unit")"
grep -q '@[A-Z]*@' "$unit" && fail "unsubstituted unit"

# Manual pages render without warnings.
for page in "$root"/share/man/man*/*; do
    out=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) ||
        fail "man -l $page failed"
    [ -z "$out" ] || fail "man -l $page: $out"
    lines=$(MANWIDTH=80 man -l "$page" 2>/dev/null | wc -l)
    [ "$lines" -gt 20 ] || fail "$page renders $lines lines"
done
# (Output captured first: grep -q ending a pipe early fails it under
# pipefail.)
text=$(MANWIDTH=80 man -l "$root/share/man/man8/obcommd.8" 2>/dev/null)
grep -q '^ *timeout_ms = 60000$' <<<"$text" ||
    fail "obcommd(8) lacks the option table"

# A program built from pkg-config alone, against the installed daemon.
export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
flags=$(pkg-config --cflags --libs obcomm)
grep -q -- "-I$root/include" <<<"$flags" || fail "cflags: $flags"
cat >"$dir/hello.c" <<'EOT'
#include <obcomm.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    obcomm_options_t o = {.socket_path = argv[1], .job = "install",
                          .local_rank = 0, .local_size = 1};
    obcomm_t *c;
    int *x;
    int rc = obcomm_connect(&o, &c);
    if (rc == 0)
        rc = obcomm_alloc(c, 1000 * sizeof(int), (void **)&x);
    for (int i = 0; rc == 0 && i < 1000; i++)
        x[i] = i;
    if (rc == 0)
        rc = obcomm_allreduce(c, x, 1000, OBCOMM_INT32, OBCOMM_SUM);
    if (rc == 0)
        rc = obcomm_barrier(c);
    if (rc != 0) {
        fprintf(stderr, "%s\n", obcomm_strerror(rc));
        return 1;
    }
    printf("rank %d of %d: x[999] = %d\n", obcomm_rank(c), obcomm_size(c),
           x[999]);
    obcomm_close(c);
    return 0;
}
EOT
# shellcheck disable=SC2086
cc -o "$dir/hello" "$dir/hello.c" $flags || fail "cc with pkg-config flags"
"$root/bin/obcommd" --socket "$dir/d.sock" --log-level warn 2>"$dir/d.log" &
pid=$!
for _ in $(seq 200); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done
out=$(LD_LIBRARY_PATH=$libdir "$dir/hello" "$dir/d.sock")
[ "$out" = "rank 0 of 1: x[999] = 999" ] || fail "hello: $out"
text=$(LD_LIBRARY_PATH=$libdir ldd "$dir/hello")
grep -q "libobcomm.so.0 => $libdir/libobcomm.so.0 " <<<"$text" ||
    fail "hello is not linked to the installed library: $text"
text=$("$root/bin/obcommctl" -s "$dir/d.sock" --json metrics)
grep -q '"name":"ops_completed","kind":"counter","value":2,' <<<"$text" ||
    fail "installed obcommctl: not two ops: $text"
echo "ok: installed into $dest$prefix"
