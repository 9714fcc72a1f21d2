#!/usr/bin/env python3
"""The daemon's modules form a tree (docs/design.md, "Layering"): no circle
of function references among its object files, and none of includes among
its source files.

  check_layers.py LIBOBD_CORE.a DAEMON_DIR

Function references come from the built code itself (nm): module A calls
into module B when A's object uses a symbol B's object defines, whatever
header declared it. The friend pairs below are one module split in two
files on purpose and count as one. Pure files (no event loop) must not
include uv.h. The daemon has one error type (daemon/err.h): no file but
err.h and err.c names a public OBCOMM_E_* code (outside a string: the
help may name the code a trainer sees) or returns -errno; no function
returns -<variable> (a negated errno or libuv code: OBD_E_* codes are
negative already); and a function that returns a status (an int function
with a `return OBD_E_...`) never returns -1. Prints every circle with the
symbols that make it, and every stray code; exits 1 if there is one.
"""
import collections
import os
import re
import subprocess
import sys

# Modules that are one unit of the layering, in two files.
FRIENDS = [("handshake", "peers")]
# Files that never touch the event loop.
PURE = ["auth.c", "owner.c", "owner.h", "snapset.c", "onebit_task.c", "codec.h", "reduce.h",
        "frame.h", "ring.h", "snapset.h", "onebit_task.h"]


def unit(module):
    for pair in FRIENDS:
        if module in pair:
            return "/".join(pair)
    return module


def symbols(archive):
    """{module: (defined, used)} from nm over the archive's members."""
    out = subprocess.run(["nm", archive], capture_output=True, text=True,
                         check=True).stdout
    mods = {}
    cur = None
    for line in out.splitlines():
        if line.endswith(".o:"):
            cur = unit(os.path.basename(line[:-1]).split(".")[0])
            mods.setdefault(cur, (set(), set()))
            continue
        parts = line.split()
        if cur is None or not parts:
            continue
        if len(parts) == 3 and parts[1] in "TDBRG":
            mods[cur][0].add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            mods[cur][1].add(parts[1])
    return mods


def circles(edges):
    """Every elementary circle found by a depth-first search, each once."""
    found, seen = [], set()

    def dfs(node, path, on_path):
        for nxt in sorted(edges.get(node, ())):
            if nxt in on_path:
                c = path[path.index(nxt):]
                key = frozenset(c)
                if key not in seen:
                    seen.add(key)
                    found.append(c + [nxt])
            elif nxt not in done:
                on_path.add(nxt)
                path.append(nxt)
                dfs(nxt, path, on_path)
                path.pop()
                on_path.discard(nxt)
        done.add(node)

    done = set()
    for start in sorted(edges):
        if start not in done:
            dfs(start, [start], {start})
    return found


FUNC = re.compile(r"^(?:static\s+)?(?:inline\s+)?int\s+\**(\w+)\([^;]*?$",
                  re.M)
MINUS_ONE = re.compile(r"\breturn\s+-\s*1\b")
MINUS_VAR = re.compile(r"\breturn\s+-\s*(?!OBD_E_)[A-Za-z_]\w*\s*;")


def stray_returns(text):
    """(line, function, statement) for each `return -var`, and each
    `return -1` in a function that returns OBD_E_* codes elsewhere."""
    lines = text.splitlines()
    out = []
    for m in FUNC.finditer(text):
        start = text.count("\n", 0, m.start())
        end = start
        while end < len(lines) and lines[end] != "}":
            end += 1
        body = [re.sub(r'"(?:\\.|[^"\\])*"', '""', l)
                for l in lines[start:end + 1]]
        status = any(re.search(r"\breturn\b[^;]*\bOBD_E_[A-Z]", b)
                     for b in body)
        for k, b in enumerate(body):
            if MINUS_VAR.search(b) or (status and MINUS_ONE.search(b)):
                out.append((start + k + 1, m.group(1), b.strip()))
    return out


def main():
    archive, src = sys.argv[1], sys.argv[2]
    bad = 0

    mods = symbols(archive)
    owner = {s: m for m, (defs, _) in mods.items() for s in defs}
    edges, why = collections.defaultdict(set), {}
    for m, (_, used) in mods.items():
        for s in used:
            o = owner.get(s)
            if o is not None and o != m:
                edges[m].add(o)
                why.setdefault((m, o), s)
    for c in circles(edges):
        bad = 1
        steps = ", ".join(f"{a} -> {b} ({why[(a, b)]})"
                          for a, b in zip(c, c[1:]))
        print(f"check_layers: function references go round: {steps}",
              file=sys.stderr)

    files = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    incl = collections.defaultdict(set)
    for f in files:
        with open(os.path.join(src, f)) as fh:
            text = fh.read()
        for h in re.findall(r'^#include "([^"]+)"', text, re.M):
            if h in files:
                incl[f].add(h)
        if f not in ("err.h", "err.c"):
            for n, line in enumerate(text.splitlines(), 1):
                code = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
                if re.search(r"\bOBCOMM_E_[A-Z]|return -errno|= -errno", code):
                    bad = 1
                    print(f"check_layers: {f}:{n}: not an OBD_E_* code "
                          f"(daemon/err.h): {line.strip()}", file=sys.stderr)
            for n, func, stmt in stray_returns(text):
                bad = 1
                print(f"check_layers: {f}:{n}: {func} returns a status, "
                      f"not an OBD_E_* code (daemon/err.h): {stmt}",
                      file=sys.stderr)
        if f in PURE and re.search(r"^#include <uv\.h>", text, re.M):
            bad = 1
            print(f"check_layers: {f} includes uv.h but is pure",
                  file=sys.stderr)
    for c in circles(incl):
        bad = 1
        print("check_layers: includes go round: " + " -> ".join(c),
              file=sys.stderr)

    if not bad:
        print(f"check_layers: {len(mods)} modules and {len(files)} files, "
              "no circle")
    return bad


if __name__ == "__main__":
    sys.exit(main())
