#!/usr/bin/python3
"""Step time of obcomm.torch.OneBitAdam with and without overlapping each
bucket's communication with backward, on a loopback cluster of real
daemons (tests/python/cluster.py; build/ by default, as the pytest suite).

    tests/bench/overlap_step.py [--nodes 2] [--trainers 1] [--layers 6]
        [--width 1024] [--batch 64] [--cap-mb 4] [--steps 20] [--repeats 3]

A trainer times forward + backward + step() of an MLP (`layers` linear
layers of width x width) in the warm-up (fp32 averages) and in the
compression stage (1-bit), and the part of it spent in step() (what is
left of the communication once backward is over). Modes run alternately,
`repeats` times each, on one cluster; the table gives the median over
repeats of each mode's mean per step. A measurement, no threshold: run
it on an otherwise idle machine and record the load.
"""

import argparse
import os
import pickle
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def bench(args):
    """One trainer: `steps` timed steps in each stage after 2 untimed
    ones; returns mean seconds per step and per step() call."""
    import torch
    import obcomm
    import obcomm.torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = args["width"]
    layers = []
    for _ in range(args["layers"]):
        layers += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    comm = obcomm.Communicator(timeout_ms=60000)
    warm = 2 + args["steps"]
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=1e-4,
                                  freeze_step=warm, comm=comm,
                                  overlap=args["overlap"],
                                  bucket_cap_mb=args["cap_mb"])
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(args["batch"], w, generator=g)
    out = {"buckets": len(opt.buckets), "rank": comm.rank}
    for stage in ("warmup", "compression"):
        total = in_step = 0.0
        for i in range(warm):
            t0 = time.perf_counter()
            opt.zero_grad()
            model(x).square().mean().backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            if i >= 2:
                total += t2 - t0
                in_step += t2 - t1
        out[stage] = (total / args["steps"], in_step / args["steps"])
    assert opt.steps == 2 * warm
    opt.close()
    comm.close()
    return out


def main():
    import cluster
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--trainers", type=int, default=1)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cap-mb", type=float, default=4.0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    args = {"layers": a.layers, "width": a.width, "batch": a.batch,
            "cap_mb": a.cap_mb, "steps": a.steps}
    res = {True: [], False: []}
    load = os.getloadavg()[0]
    with cluster.Cluster(a.nodes, timeout_ms=60000) as cl:
        for r in range(a.repeats):
            for overlap in (False, True):
                out = cl.run(f"bench{r}{int(overlap)}", "bench", a.trainers,
                             args=dict(args, overlap=overlap),
                             script=os.path.abspath(__file__), timeout=1200)
                res[overlap].append(out[0])  # rank 0's view
    nparams = a.layers * (a.width * a.width + a.width)
    print(f"# {a.nodes} nodes x {a.trainers} trainers on loopback, MLP "
          f"{a.layers} x {a.width}^2 ({nparams / 1e6:.1f} M params, "
          f"{res[True][0]['buckets']} buckets of >= {a.cap_mb} MiB), "
          f"batch {a.batch}, {a.steps} steps per stage, median of "
          f"{a.repeats}; load average before {load:.2f}, after "
          f"{os.getloadavg()[0]:.2f}")
    print("| stage | overlap | ms/step | ms in step() |")
    print("| --- | --- | ---: | ---: |")
    for stage in ("warmup", "compression"):
        for overlap in (False, True):
            tot = statistics.median(o[stage][0] for o in res[overlap])
            ins = statistics.median(o[stage][1] for o in res[overlap])
            print(f"| {stage} | {overlap} | {1e3 * tot:.1f} | "
                  f"{1e3 * ins:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "bench":
        # A trainer started by cluster.Cluster.run.
        with open(sys.argv[2], "rb") as f:
            result = bench(pickle.load(f))
        with open(sys.argv[3] + ".tmp", "wb") as f:
            pickle.dump(result, f)
        os.rename(sys.argv[3] + ".tmp", sys.argv[3])
    else:
        main()
