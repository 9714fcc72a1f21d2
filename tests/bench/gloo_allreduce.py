#!/usr/bin/python3
"""gloo_allreduce: times torch.distributed.all_reduce (fp32 SUM, backend
gloo) over a range of tensor sizes, the same way bench_allreduce times
obcomm: per size WARMUP untimed ops, then REPEATS timed ones, each after a
barrier, only the collective timed. One process per node; rendezvous through
a TCP store on rank 0's address.

  gloo_allreduce.py --rank R --world N --master ADDR[:PORT]
                    [--sizes-mib "1 4 16 64 256"] [--repeats 5] [--warmup 1]
                    [--dev ob0] [--threads 1]

Gloo binds to DEV (GLOO_SOCKET_IFNAME) so it uses the shaped link. Bytes each
node sends per op: tx_bytes of DEV in /proc/net/dev of the process's network
namespace over the timed repeats (barriers included). One JSON line per size
on stdout. Needs Debian's python3-torch: run with /usr/bin/python3.
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
    a = ap.parse_args()

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
    x = (torch.rand(maxcount, generator=g) - 0.5) * 1e-3
    for mib in sizes:
        count = int(mib * 1048576 / 4)
        view = x[:count]
        times = []
        n0 = -1
        for i in range(a.warmup + a.repeats):
            if i == a.warmup:
                n0 = dev_tx_bytes(a.dev)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(view, op=dist.ReduceOp.SUM)
            t1 = time.perf_counter()
            if i >= a.warmup:
                times.append((t1 - t0) * 1e3)
        dist.barrier()
        n1 = dev_tx_bytes(a.dev)
        print(json.dumps({
            "contender": "gloo", "nodes": a.world, "rank": a.rank,
            "mib": mib if mib != int(mib) else int(mib), "count": count,
            "repeats": a.repeats, "warmup": a.warmup,
            "median_ms": round(statistics.median(times), 3),
            "min_ms": round(min(times), 3), "max_ms": round(max(times), 3),
            "daemon_bytes_per_op": -1,
            "dev_tx_bytes_per_op":
                (n1 - n0) // a.repeats if n0 >= 0 and n1 >= 0 else -1,
            "times_ms": [round(t, 3) for t in times],
        }, separators=(",", ":")), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
