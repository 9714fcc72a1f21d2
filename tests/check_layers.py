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

The house as a drawing shows it: files that call each other or share a
struct's fields. A module that reads the fields of a struct another
module's header defines (a `struct NAME` in its source and an access
`->field` or `.field` of one of its fields) depends on that module as
if it called it. Over calls and shared structs together, every group of
three or more modules that reach one another (a strongly connected set)
is printed with a circle through it; one with a module outside
CIRCLE_ALLOWED fails the check.
"""
import collections
import fnmatch
import os
import re
import subprocess
import sys

# Modules that are one unit of the layering, in two files.
FRIENDS = [("handshake", "peers")]
# One module in several files that call only downwards among themselves
# (daemon/job_impl.h): one unit for shared structs (they share job.h's),
# each file on its own for calls.
GROUPS = {"job": ("job", "route", "registry", "match", "op")}
# Headers whose structs belong to another module than their name says.
HEADER_OWNER = {"link": "peers", "job_impl": "job", "codec_impl": "codec"}
# The modules still in a circle of three or more through struct
# obd_daemon, which holds every module's state and which daemon.c wires:
# they read its fields (stall.c, status.c, ctl.c, peers.c, efstore.c,
# trace.c, the job module, the algorithms through their op's daemon),
# and daemon.c calls them. Patterns (fnmatch): every algorithm file,
# coll_*, is in it through trace.c and efstore.c. A module that joins the
# circle fails the check; the list shrinks as modules take their state
# out of struct obd_daemon (docs/design.md, "Layering").
CIRCLE_ALLOWED = ["coll", "coll_*", "ctl", "daemon", "efstore",
                  "handshake/peers", "job", "stall", "status", "trace"]
# Files that never touch the event loop.
PURE = ["auth.c", "owner.c", "owner.h", "snapset.c", "onebit_task.c", "codec.h", "reduce.h",
        "frame.h", "ring.h", "snapset.h", "onebit_task.h"]


def unit(module):
    for pair in FRIENDS:
        if module in pair:
            return "/".join(pair)
    return module


def group(module):
    """The unit a module is in the drawing of shared structs."""
    module = HEADER_OWNER.get(module, module)
    for name, files in GROUPS.items():
        if module in files:
            return name
    return unit(module)


STRUCT = re.compile(r"^struct (\w+) \{\n(.*?)^\};", re.M | re.S)
FIELD = re.compile(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?:\)\s*\([^;]*)?;")


def struct_edges(src, files):
    """{(user, owner): why} for every module that reads the fields of a
    struct defined in another module's header."""
    owned = {}
    for f in files:
        if not f.endswith(".h"):
            continue
        with open(os.path.join(src, f)) as fh:
            for m in STRUCT.finditer(fh.read()):
                body = re.sub(r"/\*.*?\*/", "", m.group(2), flags=re.S)
                fields = {x for x in FIELD.findall(body)
                          if x not in ("int", "void")}
                fields |= set(re.findall(r"\(\*(\w+)\)", body))
                owned[m.group(1)] = (group(f[:-2]), fields)
    edges = {}
    for f in files:
        if not f.endswith(".c"):
            continue
        user = group(f[:-2])
        with open(os.path.join(src, f)) as fh:
            text = re.sub(r"/\*.*?\*/", "", fh.read(), flags=re.S)
        for name, (owner, fields) in sorted(owned.items()):
            if owner == user or not re.search(rf"\bstruct {name}\b", text):
                continue
            used = sorted(x for x in fields
                          if re.search(rf"(?:->|\.){x}\b", text))
            if used:
                edges.setdefault((user, owner),
                                 f"{f} reads struct {name} .{used[0]}")
    return edges


def strong_sets(edges):
    """The strongly connected sets of the graph (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def circle_through(edges, comp):
    """A longest-first circle inside the set, from its first member: a
    depth-first walk that stays in the set and returns to the start."""
    start, members = comp[0], set(comp)
    best = []

    def dfs(v, path):
        nonlocal best
        for w in sorted(edges.get(v, ())):
            if w == start and len(path) > len(best):
                best = path + [start]
            elif w in members and w not in path and len(best) < len(comp) + 1:
                dfs(w, path + [w])

    dfs(start, [start])
    return best


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
    for m, (_, used) in sorted(mods.items()):
        for s in sorted(used):
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

    drawing, because = collections.defaultdict(set), {}
    for m, outs in edges.items():
        for o in outs:
            a, b = group(m), group(o)
            if a != b:
                drawing[a].add(b)
                because.setdefault((a, b), f"calls {why[(m, o)]}")
    for (a, b), r in struct_edges(src, files).items():
        drawing[a].add(b)
        because.setdefault((a, b), r)
    for comp in strong_sets(drawing):
        if len(comp) < 3:
            continue
        c = circle_through(drawing, comp)
        steps = ", ".join(f"{a} -> {b} ({because[(a, b)]})"
                          for a, b in zip(c, c[1:]))
        new = [m for m in comp
               if not any(fnmatch.fnmatchcase(m, p) for p in CIRCLE_ALLOWED)]
        print(f"check_layers: {len(comp)} modules reach one another through "
              f"calls and shared structs: {', '.join(comp)}; for example "
              f"{steps}", file=sys.stderr)
        if new:
            bad = 1
            print("check_layers: new in that circle (not in CIRCLE_ALLOWED): "
                  + ", ".join(new), file=sys.stderr)
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
              "no circle outside CIRCLE_ALLOWED")
    return bad


if __name__ == "__main__":
    sys.exit(main())
