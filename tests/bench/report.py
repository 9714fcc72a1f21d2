#!/usr/bin/python3
"""report.py: turns the raw JSON lines of run_bench.sh into OP.json, OP.md
and OP.png for each collective OP measured (allreduce, allgather,
reduce_scatter).

  report.py RAW_DIR OUT_DIR RATE [META]

RAW_DIR holds *.jsonl (one line per contender, op, nodes, size and rank;
a line without "op" is an allreduce) and optionally codec.json
(bench_codec --json), which goes with the allreduce. RATE is the tc rate
of each link (e.g. 1gbit).

Aggregation, per (op, contender, nodes, MiB):
  median_ms   the largest per-rank median (the slowest node sets the pace)
  min_ms      the smallest time any rank saw
  bytes/node  obcomm: the daemon's payload counter (allreduce_bytes_sent,
              onebit_bytes_sent (with frame headers), allgather_bytes_sent,
              reduce_scatter_bytes_sent); OpenMPI and
              Gloo: tx_bytes of the node's veth (payload + TCP/IP headers as
              the veth sees them, i.e. one header per GSO super-packet, and
              the barrier before each op). Largest over the ranks.
  wire limit  bytes each node must send / link rate, with S = MiB * 2^20:
              fp32 ring (obcomm fp32, OpenMPI, Gloo): 2(n-1)/n * S
              1-bit: 2(n-1)/n * S/32 (docs/design.md, "The compressed
              allreduce, exactly"; scales and frame headers ignored)
              allgather, reduce-scatter: (n-1)/n * S (S is the whole
              result, the whole input: the same tensor as the allreduce's)
              tbf counts frame bytes, so with MTU 1500 even a perfect
              sender reaches only ratio 1514/1448 = 1.046.
  algbw       S / median time (GB/s = 1e9 bytes/s)

For allgather and reduce-scatter the report also puts obcomm beside each
baseline, as the ratio of the median times obcomm / baseline (below 1:
obcomm is faster).
"""
import collections
import glob
import json
import os
import re
import statistics
import sys

ORDER = ["obcomm_fp32", "obcomm", "openmpi", "openmpi_ring", "gloo", "obcomm_1bit"]
FP32_RING = {"obcomm_fp32", "openmpi", "openmpi_ring", "gloo"}
BASELINES = ("openmpi", "openmpi_ring", "gloo")
OPS = ("allreduce", "allgather", "reduce_scatter")
TITLE = {"allreduce": "Allreduce", "allgather": "Allgather",
         "reduce_scatter": "Reduce-scatter"}
WHOLE = {"allgather": "the result, each rank sends 1/world of it",
         "reduce_scatter": "the input of every rank, each rank receives 1/world of its reduction"}
# What each contender calls, for the tables of allgather and reduce-scatter.
CALLS = {
    "allgather": {"obcomm": "obcomm_allgather", "gloo": "dist.all_gather",
                  "openmpi": "MPI_Allgather",
                  "openmpi_ring": "MPI_Allgather (ring)"},
    "reduce_scatter": {"obcomm": "obcomm_reduce_scatter",
                       "openmpi": "MPI_Reduce_scatter_block"},
}


def rate_bps(rate):
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(i?)(bit|bps)?", rate.lower())
    if not m:
        raise SystemExit(f"report: cannot parse rate {rate!r}")
    base = 1024 if m.group(3) else 1000
    mult = base ** " kmgt".index(m.group(2) or " ")
    bits = float(m.group(1)) * mult
    return bits * 8 if m.group(4) == "bps" else bits


def wire_bytes(op, contender, n, mib):
    s = mib * 1048576
    if op != "allreduce":
        return (n - 1) / n * s
    ring = 2 * (n - 1) / n
    return ring * s if contender in FP32_RING else ring * s / 32


def load(raw):
    """{op: {(contender, nodes, mib): [line, ...]}}"""
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in sorted(glob.glob(os.path.join(raw, "*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "contender" in r:
                    rows[r.get("op", "allreduce")][(r["contender"], r["nodes"], r["mib"])].append(r)
    return rows


def aggregate(op, rows, bps):
    out = []
    for (c, n, mib), rs in rows.items():
        d = [r["daemon_bytes_per_op"] for r in rs if r["daemon_bytes_per_op"] >= 0]
        v = [r["dev_tx_bytes_per_op"] for r in rs if r["dev_tx_bytes_per_op"] >= 0]
        sent = max(d) if d else (max(v) if v else -1)
        med = max(r["median_ms"] for r in rs)
        wb = wire_bytes(op, c, n, mib)
        wl = wb * 8 / bps * 1e3
        out.append({
            "op": op, "contender": c, "nodes": n, "mib": mib, "ranks": len(rs),
            "repeats": rs[0]["repeats"], "median_ms": med,
            "min_ms": min(r["min_ms"] for r in rs),
            "median_ms_per_rank": [r["median_ms"] for r in sorted(rs, key=lambda r: r["rank"])],
            "algbw_gbs": mib * 1048576 / (med / 1e3) / 1e9,
            "bytes_sent_per_node": sent,
            "bytes_source": "daemon counter" if d else "veth tx_bytes",
            "veth_tx_bytes_per_node": max(v) if v else -1,
            "wire_bytes_per_node": wb, "wire_limit_ms": wl,
            "ratio_to_wire": med / wl,
        })
    out.sort(key=lambda r: (r["nodes"], r["mib"], ORDER.index(r["contender"])
                            if r["contender"] in ORDER else 99))
    return out


def find(agg, c, n, mib):
    for r in agg:
        if r["contender"] == c and r["nodes"] == n and r["mib"] == mib:
            return r
    return None


def targets(agg):
    """Informational: the issue's targets, checked on whatever was measured."""
    lines = []
    nodes = sorted({r["nodes"] for r in agg})
    sizes = sorted({r["mib"] for r in agg})
    for n in nodes:
        for mib in sizes:
            if mib < 16:
                continue
            o = find(agg, "obcomm_fp32", n, mib)
            others = [r for r in (find(agg, b, n, mib) for b in BASELINES) if r]
            if not o:
                continue
            best = min(others, key=lambda r: r["median_ms"]) if others else None
            vs = (f"{o['median_ms'] / best['median_ms']:.2f}x the faster baseline "
                  f"({best['contender']} {best['median_ms']:.0f} ms)") if best else "no baseline"
            ok = (best is None or o["median_ms"] <= best["median_ms"] * 1.05) and o["ratio_to_wire"] <= 1.15
            lines.append(f"| fp32 ring on par (<= 1.05x best baseline) and <= 1.15x wire | {n} | {mib:g} | "
                         f"{o['median_ms']:.0f} ms = {vs}; {o['ratio_to_wire']:.2f}x wire | "
                         f"{'met' if ok else 'missed'} |")
    for n in nodes:
        for mib in sizes:
            if mib < 64:
                continue
            b = find(agg, "obcomm_1bit", n, mib)
            others = [r for r in (find(agg, b, n, mib) for b in BASELINES) if r]
            if not b or not others:
                continue
            best = min(others, key=lambda r: r["median_ms"])
            sp = best["median_ms"] / b["median_ms"]
            ok = sp >= 20 and b["ratio_to_wire"] <= 1.3
            lines.append(f"| 1-bit >= 20x faster than fp32 MPI/Gloo and <= 1.3x own wire | {n} | {mib:g} | "
                         f"{sp:.1f}x faster than {best['contender']}; {b['ratio_to_wire']:.2f}x wire "
                         f"({b['median_ms']:.1f} vs {b['wire_limit_ms']:.1f} ms) | {'met' if ok else 'missed'} |")
    if len(nodes) >= 2:
        lo, hi = nodes[0], nodes[-1]
        for mib in sizes:
            a, b = find(agg, "obcomm_1bit", lo, mib), find(agg, "obcomm_1bit", hi, mib)
            if a and b:
                g = b["median_ms"] / a["median_ms"]
                lines.append(f"| 1-bit growth {lo} -> {hi} nodes < 1.3x | {lo}->{hi} | {mib:g} | "
                             f"{a['median_ms']:.1f} -> {b['median_ms']:.1f} ms = {g:.2f}x"
                             f"{'' if hi == 8 else ' (target is 2 -> 8)'} | {'met' if g < 1.3 else 'missed'} |")
    return lines


def markdown(agg, codec, rate, meta):
    md = [f"# Allreduce benchmark at {rate} per link", ""]
    if meta:
        md += [f"{meta}", ""]
    md += ["Time: the largest per-rank median (slowest node). Bytes sent per node: obcomm = daemon counter, "
           "OpenMPI/Gloo = veth tx_bytes (incl. TCP/IP headers and barrier). Wire limit = bytes each node must "
           "send / link rate: fp32 ring 2(n-1)/n*S, 1-bit 2(n-1)/n*S/32 (S = tensor bytes). With MTU 1500, tbf "
           "counts frame bytes, so a perfect TCP sender reaches 1514/1448 = 1.046x at best.", "",
           "| op | nodes | MiB | median ms | algbw GB/s | bytes sent per node | wire limit ms | ratio to wire limit |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in agg:
        md.append(f"| {r['contender']} | {r['nodes']} | {r['mib']:g} | {r['median_ms']:.1f} | "
                  f"{r['algbw_gbs']:.3f} | {r['bytes_sent_per_node']:,} | {r['wire_limit_ms']:.1f} | "
                  f"{r['ratio_to_wire']:.2f} |")
    t = targets(agg)
    if t:
        md += ["", "## Targets (computed from the table above; informational)", "",
               "| target | nodes | MiB | measured | status |", "| --- | --- | ---: | --- | --- |"] + t
    if codec:
        md += ["", f"## 1-bit codec (bench_codec --json, {codec['elems']} elements, "
               f"median of {codec['repeats']})", "",
               "| op | impl | threads | ms | GB/s | ratio to memcpy |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in codec["rows"]:
            md.append(f"| {r['op']} | {r['impl']} | {r['threads']} | {r['ms']:.2f} | {r['gbps']:.2f} | "
                      f"{r['ratio']:.2f} |")
    return "\n".join(md) + "\n"


def ratio_markdown(op, agg, rate, meta):
    """The allgather's or reduce-scatter's report: every contender as in the
    allreduce's table, then obcomm beside each baseline."""
    md = [f"# {TITLE[op]} benchmark at {rate} per link", ""]
    if meta:
        md += [meta, ""]
    calls = CALLS.get(op, {})
    md += ["Contenders: " + ", ".join(f"{c} = `{calls[c]}`" for c in ORDER if c in calls and
                                       any(r["contender"] == c for r in agg)) + ". "
           f"A size is MiB of the whole fp32 tensor: {WHOLE[op]}. Time: the largest per-rank median (slowest node). "
           "Bytes sent per node: obcomm = daemon counter (payload), OpenMPI/Gloo = veth tx_bytes (incl. "
           "TCP/IP headers and barrier). Wire limit = bytes each node must send / link rate = (n-1)/n*S / "
           "rate; with MTU 1500 a perfect TCP sender reaches 1514/1448 = 1.046x at best.", "",
           "| contender | nodes | MiB | median ms | algbw GB/s | bytes sent per node | wire limit ms | ratio to wire limit |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in agg:
        md.append(f"| {r['contender']} | {r['nodes']} | {r['mib']:g} | {r['median_ms']:.1f} | "
                  f"{r['algbw_gbs']:.3f} | {r['bytes_sent_per_node']:,} | {r['wire_limit_ms']:.1f} | "
                  f"{r['ratio_to_wire']:.2f} |")
    bases = [b for b in BASELINES if any(r["contender"] == b for r in agg)]
    if any(r["contender"] == "obcomm" for r in agg) and bases:
        md += ["", "## obcomm against the baselines", "",
               "Median ms (ratio to the wire limit); obcomm / baseline below 1 means obcomm is faster.", "",
               "| nodes | MiB | obcomm | " + " | ".join(bases) + " | " +
               " | ".join(f"obcomm / {b}" for b in bases) + " |",
               "| ---: | ---: | ---: | " + " | ".join("---:" for _ in bases * 2) + " |"]
        for n, mib in sorted({(r["nodes"], r["mib"]) for r in agg}):
            o = find(agg, "obcomm", n, mib)
            if not o:
                continue
            cells = [f"{o['median_ms']:.1f} ({o['ratio_to_wire']:.2f}x)"]
            ratios = []
            for b in bases:
                r = find(agg, b, n, mib)
                cells.append(f"{r['median_ms']:.1f} ({r['ratio_to_wire']:.2f}x)" if r else "")
                ratios.append(f"{o['median_ms'] / r['median_ms']:.2f}" if r else "")
            md.append(f"| {n} | {mib:g} | " + " | ".join(cells + ratios) + " |")
        md += ["", "## Target: at least the baselines' speed (informational)", "",
               "| nodes | MiB | baseline | obcomm / baseline | status |", "| ---: | ---: | --- | ---: | --- |"]
        for n, mib in sorted({(r["nodes"], r["mib"]) for r in agg}):
            o = find(agg, "obcomm", n, mib)
            for b in bases:
                r = find(agg, b, n, mib)
                if o and r:
                    q = o["median_ms"] / r["median_ms"]
                    md.append(f"| {n} | {mib:g} | {b} | {q:.2f} | {'met' if q <= 1.0 else 'missed'} |")
    return "\n".join(md) + "\n"


def plot(op, agg, path, rate, bps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: no matplotlib, no plot", file=sys.stderr)
        return
    nodes = sorted({r["nodes"] for r in agg})
    fig, axes = plt.subplots(1, len(nodes), figsize=(5 * len(nodes), 4.2), squeeze=False, sharey=True)
    style = {"obcomm_fp32": "o-", "obcomm": "o-", "openmpi": "s-", "openmpi_ring": "s--", "gloo": "^-",
             "obcomm_1bit": "D-"}
    for ax, n in zip(axes[0], nodes):
        sizes = sorted({r["mib"] for r in agg if r["nodes"] == n})
        for c in ORDER:
            pts = [(r["mib"], r["median_ms"]) for r in agg if r["nodes"] == n and r["contender"] == c]
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style.get(c, "x-"), label=c)
        limits = ((("gloo", "k--", "wire limit fp32 ring"), ("obcomm_1bit", "k:", "wire limit 1-bit"))
                  if op == "allreduce" else (("obcomm", "k--", "wire limit"),))
        for c, ls, lab in limits:
            ax.plot(sizes, [wire_bytes(op, c, n, s) * 8 / bps * 1e3 for s in sizes], ls, lw=1, label=lab)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} nodes, {rate} links")
        ax.set_xlabel("tensor MiB (fp32)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"median time per {TITLE[op].lower()} (ms)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    if len(sys.argv) < 4:
        raise SystemExit("usage: report.py RAW_DIR OUT_DIR RATE [META]")
    raw, out, rate = sys.argv[1:4]
    meta = sys.argv[4] if len(sys.argv) > 4 else ""
    bps = rate_bps(rate)
    rows = load(raw)
    codec = None
    cpath = os.path.join(raw, "codec.json")
    if os.path.exists(cpath):
        try:
            with open(cpath) as f:
                codec = json.load(f)
        except ValueError:
            print("report: codec.json unreadable, skipped", file=sys.stderr)
    os.makedirs(out, exist_ok=True)
    # A report per op measured; with nothing measured, the allreduce's
    # (empty) one.
    for op in OPS:
        if op not in rows and (rows or op != "allreduce"):
            continue
        agg = aggregate(op, rows.get(op, {}), bps)
        doc = {"op": op, "rate": rate, "rate_bits_per_s": bps, "meta": meta, "results": agg}
        if op == "allreduce":
            doc["wire_limit"] = {"fp32_ring": "2(n-1)/n * S / rate", "onebit": "2(n-1)/n * S/32 / rate"}
            doc["codec"] = codec
            md = markdown(agg, codec, rate, meta)
        else:
            doc["wire_limit"] = "(n-1)/n * S / rate"
            md = ratio_markdown(op, agg, rate, meta)
        with open(os.path.join(out, f"{op}.json"), "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.join(out, f"{op}.md"), "w") as f:
            f.write(md)
        plot(op, agg, os.path.join(out, f"{op}.png"), rate, bps)
        print(f"report: {op}: {len(agg)} rows -> {out}/{op}.{{json,md,png}}")


if __name__ == "__main__":
    main()
