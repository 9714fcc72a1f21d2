#!/usr/bin/python3
"""report.py: turns the raw JSON lines of run_bench.sh into
results/allreduce.json, allreduce.md and allreduce.png.

  report.py RAW_DIR OUT_DIR RATE

RAW_DIR holds *.jsonl (one line per contender, nodes, size and rank) and
optionally codec.json (bench_codec --json). RATE is the tc rate of each
link (e.g. 1gbit).

Aggregation, per (contender, nodes, MiB):
  median_ms   the largest per-rank median (the slowest node sets the pace)
  min_ms      the smallest time any rank saw
  bytes/node  obcomm: the daemon's payload counter (allreduce_bytes_sent or
              onebit_bytes_sent, 1-bit includes frame headers); OpenMPI and
              Gloo: tx_bytes of the node's veth (payload + TCP/IP headers as
              the veth sees them, i.e. one header per GSO super-packet, and
              the barrier before each op). Largest over the ranks.
  wire limit  bytes each node must send / link rate, with S = MiB * 2^20:
              fp32 ring (obcomm fp32, OpenMPI, Gloo): 2(n-1)/n * S
              1-bit: 2(n-1)/n * S/32 (docs/design.md, "The compressed
              allreduce, exactly"; scales and frame headers ignored)
              tbf counts frame bytes, so with MTU 1500 even a perfect
              sender reaches only ratio 1514/1448 = 1.046.
  algbw       S / median time (GB/s = 1e9 bytes/s)
"""
import collections
import glob
import json
import os
import re
import statistics
import sys

ORDER = ["obcomm_fp32", "openmpi", "openmpi_ring", "gloo", "obcomm_1bit"]
FP32_RING = {"obcomm_fp32", "openmpi", "openmpi_ring", "gloo"}
BASELINES = ("openmpi", "openmpi_ring", "gloo")


def rate_bps(rate):
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(i?)(bit|bps)?", rate.lower())
    if not m:
        raise SystemExit(f"report: cannot parse rate {rate!r}")
    base = 1024 if m.group(3) else 1000
    mult = base ** " kmgt".index(m.group(2) or " ")
    bits = float(m.group(1)) * mult
    return bits * 8 if m.group(4) == "bps" else bits


def wire_bytes(contender, n, mib):
    s = mib * 1048576
    ring = 2 * (n - 1) / n
    return ring * s if contender in FP32_RING else ring * s / 32


def load(raw):
    rows = collections.defaultdict(list)
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
                    rows[(r["contender"], r["nodes"], r["mib"])].append(r)
    return rows


def aggregate(rows, bps):
    out = []
    for (c, n, mib), rs in rows.items():
        d = [r["daemon_bytes_per_op"] for r in rs if r["daemon_bytes_per_op"] >= 0]
        v = [r["dev_tx_bytes_per_op"] for r in rs if r["dev_tx_bytes_per_op"] >= 0]
        sent = max(d) if d else (max(v) if v else -1)
        med = max(r["median_ms"] for r in rs)
        wb = wire_bytes(c, n, mib)
        wl = wb * 8 / bps * 1e3
        out.append({
            "contender": c, "nodes": n, "mib": mib, "ranks": len(rs),
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


def plot(agg, path, rate, bps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: no matplotlib, no plot", file=sys.stderr)
        return
    nodes = sorted({r["nodes"] for r in agg})
    fig, axes = plt.subplots(1, len(nodes), figsize=(5 * len(nodes), 4.2), squeeze=False, sharey=True)
    style = {"obcomm_fp32": "o-", "openmpi": "s-", "openmpi_ring": "s--", "gloo": "^-", "obcomm_1bit": "D-"}
    for ax, n in zip(axes[0], nodes):
        sizes = sorted({r["mib"] for r in agg if r["nodes"] == n})
        for c in ORDER:
            pts = [(r["mib"], r["median_ms"]) for r in agg if r["nodes"] == n and r["contender"] == c]
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style.get(c, "x-"), label=c)
        for c, ls, lab in (("gloo", "k--", "wire limit fp32 ring"), ("obcomm_1bit", "k:", "wire limit 1-bit")):
            ax.plot(sizes, [wire_bytes(c, n, s) * 8 / bps * 1e3 for s in sizes], ls, lw=1, label=lab)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} nodes, {rate} links")
        ax.set_xlabel("tensor MiB (fp32)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("median time per allreduce (ms)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    if len(sys.argv) < 4:
        raise SystemExit("usage: report.py RAW_DIR OUT_DIR RATE [META]")
    raw, out, rate = sys.argv[1:4]
    meta = sys.argv[4] if len(sys.argv) > 4 else ""
    bps = rate_bps(rate)
    agg = aggregate(load(raw), bps)
    codec = None
    cpath = os.path.join(raw, "codec.json")
    if os.path.exists(cpath):
        try:
            with open(cpath) as f:
                codec = json.load(f)
        except ValueError:
            print("report: codec.json unreadable, skipped", file=sys.stderr)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "allreduce.json"), "w") as f:
        json.dump({"rate": rate, "rate_bits_per_s": bps, "meta": meta,
                   "wire_limit": {"fp32_ring": "2(n-1)/n * S / rate", "onebit": "2(n-1)/n * S/32 / rate"},
                   "results": agg, "codec": codec}, f, indent=1)
    with open(os.path.join(out, "allreduce.md"), "w") as f:
        f.write(markdown(agg, codec, rate, meta))
    plot(agg, os.path.join(out, "allreduce.png"), rate, bps)
    print(f"report: {len(agg)} rows -> {out}/allreduce.{{json,md,png}}")


if __name__ == "__main__":
    main()
