#!/usr/bin/env python3
"""Draws obcommd timelines (trace_file, Chrome trace events) as a PNG:
one row per node and track, one bar per span. For a quick look without a
browser; ui.perfetto.dev opens the same files interactively.

    trace_plot.py OUT.png node0.json node1.json ...
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    text = open(path).read().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"  # a daemon that did not close it
    return [e for e in json.loads(text) if e.get("ph") == "X"]


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    events = [e for p in paths for e in load(p)]
    t0 = min(e["ts"] for e in events)
    def row(e):
        # Concurrent steps of one op get a row each; tasks share the pool's.
        sub = e["name"] if e["cat"] == "1-bit" else ""
        return (e["pid"], e["tid"] >= 1000000, e["cat"], sub)

    rows = sorted({row(e) for e in events}, reverse=True)
    names = sorted({e["name"] for e in events})
    colors = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.5))
    for e in events:
        y = rows.index(row(e))
        ax.broken_barh([((e["ts"] - t0) / 1000, max(e["dur"], 1) / 1000)],
                       (y - 0.4, 0.8), color=colors[e["name"]])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"node {p} {'pool' if pool else 'loop'} {s or c}"
                        for p, pool, c, s in rows], fontsize=7)
    ax.set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names]
    ax.legend(handles, names, ncol=4, fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
