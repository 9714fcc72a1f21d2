#!/usr/bin/python3
"""gloo_allreduce: times torch.distributed's collectives (backend gloo) over
fp32 tensors of a range of sizes, the same way bench_allreduce times
obcomm: all_reduce (SUM, in place) and allgather. Per size and op WARMUP
untimed ops, then REPEATS timed ones, each after a barrier, only the
collective timed. One process per node; rendezvous through a TCP store on
rank 0's address.

  gloo_allreduce.py --rank R --world N --master ADDR[:PORT]
                    [--sizes-mib "1 4 16 64 256"] [--repeats 5] [--warmup 1]
                    [--dev ob0] [--threads 1] [--ops "allreduce allgather"]

A size is MiB of one fp32 tensor, as for bench_allreduce: the all_reduce's
data, the allgather's whole result (rounded down to a multiple of the
world size; each rank sends 1/world of it). --ops (default allreduce)
lists the ops. The allgather uses dist.all_gather_into_tensor where Gloo
supports it, else (torch 1.13) dist.all_gather into views of one result
tensor; the JSON line says which ("api"). Gloo in torch 1.13 has no
reduce-scatter.

Gloo binds to DEV (GLOO_SOCKET_IFNAME) so it uses the shaped link. Bytes each
node sends per op: tx_bytes of DEV in /proc/net/dev of the process's network
namespace over the timed repeats (barriers included). One JSON line per size
on stdout. Needs torch: run with the project's .venv/bin/python.
"""
import argparse
import json
import os
import statistics
import time


def dev_tx_bytes(dev):
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.strip().partition(":")
                if name == dev:
                    return int(rest.split()[8])
    except OSError:
        pass
    return -1


def allgather_api(dist, world):
    """all_gather_into_tensor if the backend runs it, else all_gather. Gloo
    in torch 1.13 refuses _allgather_base at once, before any message, on
    every rank alike, so trying it on one element is safe."""
    import torch
    if hasattr(dist, "all_gather_into_tensor"):
        try:
            dist.all_gather_into_tensor(torch.zeros(world), torch.zeros(1))
            return "all_gather_into_tensor"
        except RuntimeError:
            pass
    return "all_gather"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="ADDR[:PORT] of rank 0")
    ap.add_argument("--sizes-mib", default="1 4 16 64 256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dev", default="ob0")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (the reduction itself)")
    ap.add_argument("--ops", default="allreduce",
                    help="allreduce and/or allgather, comma or space separated")
    a = ap.parse_args()
    ops = a.ops.replace(",", " ").split()
    unknown = [o for o in ops if o not in ("allreduce", "allgather")]
    if not ops or unknown:
        ap.error(f"--ops: unknown or no op {unknown} (allreduce, allgather)")

    os.environ.setdefault("GLOO_SOCKET_IFNAME", a.dev)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    host, _, port = a.master.partition(":")
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port or 29500}",
                            rank=a.rank, world_size=a.world,
                            timeout=__import__("datetime").timedelta(minutes=10))
    sizes = [float(s) for s in a.sizes_mib.replace(",", " ").split()]
    maxcount = int(max(sizes) * 1048576 / 4)
    g = torch.Generator().manual_seed(2463534242 + a.rank)
    pristine = (torch.rand(maxcount + maxcount // a.world + 1, generator=g)
                - 0.5) * 1e-3
    x = torch.empty(maxcount)
    y = torch.empty(maxcount // a.world + 1)
    gather_api = allgather_api(dist, a.world) if "allgather" in ops else None
    for mib in sizes:
        count = int(mib * 1048576 / 4)
        for op in ("allreduce", "allgather"):
            if op not in ops:
                continue
            if op == "allreduce":
                n = count
                view = x[:n]
                run = lambda: dist.all_reduce(view, op=dist.ReduceOp.SUM)
            else:
                n = count - count % a.world
                out, inp = x[:n], y[:n // a.world]
                if gather_api == "all_gather_into_tensor":
                    run = lambda: dist.all_gather_into_tensor(out, inp)
                else:
                    parts = list(out.chunk(a.world))
                    run = lambda: dist.all_gather(parts, inp)
            # Fresh small values before every (op, size): sums stay finite.
            x.copy_(pristine[:maxcount])
            y.copy_(pristine[maxcount:])
            times = []
            n0 = -1
            for i in range(a.warmup + a.repeats):
                if i == a.warmup:
                    n0 = dev_tx_bytes(a.dev)
                dist.barrier()
                t0 = time.perf_counter()
                run()
                t1 = time.perf_counter()
                if i >= a.warmup:
                    times.append((t1 - t0) * 1e3)
            dist.barrier()
            n1 = dev_tx_bytes(a.dev)
            line = {
                "contender": "gloo", "op": op, "nodes": a.world,
                "rank": a.rank, "mib": mib if mib != int(mib) else int(mib),
                "count": n, "repeats": a.repeats, "warmup": a.warmup,
                "median_ms": round(statistics.median(times), 3),
                "min_ms": round(min(times), 3),
                "max_ms": round(max(times), 3),
                "daemon_bytes_per_op": -1,
                "dev_tx_bytes_per_op":
                    (n1 - n0) // a.repeats if n0 >= 0 and n1 >= 0 else -1,
                "times_ms": [round(t, 3) for t in times],
            }
            if op == "allgather":
                line["api"] = gather_api
            print(json.dumps(line, separators=(",", ":")), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
