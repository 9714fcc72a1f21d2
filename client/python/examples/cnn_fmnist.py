"""A small convolutional network on Fashion-MNIST, data-parallel under
torchrun, with one of five optimizers/communication schemes:

  adam      torch.optim.Adam, gradients averaged by DDP over Gloo
  onebit    obcomm.torch.OneBitAdam (no DDP, no Gloo: obcomm only)
  zeroone   obcomm.torch.ZeroOneAdam, 0/1 Adam (obcomm only), its variance
            frozen at the same step as OneBitAdam's
  lamb      obcomm.torch.OneBitLamb, 1-bit LAMB (obcomm only), frozen at
            the same step
  powersgd  torch.optim.Adam, DDP over Gloo with PyTorch's PowerSGD hook

Run it with torchrun, one torchrun per node, next to that node's obcommd
(deploy/cnn-compare.sh does all of it):

  OBCOMM_SOCKET=/tmp/node0.sock torchrun --nnodes 2 --nproc_per_node 2 \\
      --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:29400 --rdzv_id cnn \\
      client/python/examples/cnn_fmnist.py --mode onebit --out DIR

Every mode uses the same seed (same initial model on every rank, same data
shards: rank r of world w takes every w-th sample of a seeded permutation),
the same steps and batch. Rank 0 writes DIR/<tag>.json (accuracy, losses,
steps/s, bytes) and DIR/<tag>.csv (step, training loss averaged over all
ranks). Bytes on the wire of the Gloo modes are measured here, from the
kernel's TCP counters of the connections between trainers of different
nodes (wire.py); obcomm's are read from the daemons by the caller.
"""

import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402


class Net(nn.Module):
    """conv 5x5 16 - pool - conv 5x5 32 - pool - fc 128 - fc 10 (215 k
    parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data, kind):
    x = idx(os.path.join(data, f"{kind}-images-idx3-ubyte.gz"))
    y = idx(os.path.join(data, f"{kind}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    # Normalised with the training set's mean and std (0.2860, 0.3530).
    return (x - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["adam", "onebit", "powersgd",
                                      "zeroone", "lamb"],
                   default="onebit")
    p.add_argument("--tag", help="output name (default: the mode)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=32, help="per trainer")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--freeze-frac", type=float, default=0.15,
                   help="onebit: warm-up steps / steps; powersgd: steps "
                   "before compression starts (the same share)")
    p.add_argument("--mask", default="auto",
                   help="onebit, zeroone, lamb: auto | off (the ablation) | "
                   "a ratio for set_auto_mask")
    p.add_argument("--bias-correction", action="store_true",
                   help="onebit: Adam's bias correction (torch's Adam always "
                   "has it; OneBitAdam's default, as DeepSpeed's, is off)")
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--out", required=True)
    return p.parse_args()


class Reducer:
    """Sum of a small float64 tensor over all ranks (logging, evaluation),
    over the same channel as the training: obcomm or Gloo."""

    def __init__(self, comm):
        self.comm = comm

    def sum(self, t):
        if self.comm is not None:
            return self.comm.allreduce(t, op="sum")
        dist.all_reduce(t)
        return t


def main():
    a = parse()
    tag = a.tag or a.mode
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    node = int(os.environ.get("GROUP_RANK", "0"))

    comm = None
    if a.mode in ("onebit", "zeroone", "lamb"):
        import obcomm
        import obcomm.torch
        comm = obcomm.Communicator()
        assert comm.size == world
    else:
        dist.init_process_group("gloo")
    red = Reducer(comm)

    train_x, train_y = load(a.data, "train")
    test_x, test_y = load(a.data, "t10k")
    g = torch.Generator().manual_seed(a.seed)
    perm = torch.randperm(len(train_y), generator=g)
    shard = perm[rank::world]

    torch.manual_seed(a.seed)  # the same initial model on every rank
    model = Net()
    freeze = int(round(a.freeze_frac * a.steps))
    if a.mode == "onebit":
        opt = obcomm.torch.OneBitAdam(model.parameters(), lr=a.lr,
                                      eps=a.eps, freeze_step=freeze,
                                      bias_correction=a.bias_correction,
                                      comm=comm)
        if a.mask == "off":
            opt.set_auto_mask(False)
        elif a.mask != "auto":
            opt.set_auto_mask(float(a.mask))
        net = model
    elif a.mode == "zeroone":
        opt = obcomm.torch.ZeroOneAdam(model.parameters(), lr=a.lr,
                                       eps=a.eps, var_freeze_step=freeze,
                                       comm=comm)
        if a.mask == "off":
            opt.set_auto_mask(-1.0)
        elif a.mask != "auto":
            opt.set_auto_mask(float(a.mask))
        net = model
    elif a.mode == "lamb":
        opt = obcomm.torch.OneBitLamb(model.parameters(), lr=a.lr, eps=a.eps,
                                      freeze_step=freeze, comm=comm)
        if a.mask == "off":
            opt.set_auto_mask(-1.0)
        elif a.mask != "auto":
            opt.set_auto_mask(float(a.mask))
        net = model
    else:
        net = nn.parallel.DistributedDataParallel(model)
        if a.mode == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import \
                powerSGD_hook as psgd
            state = psgd.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=a.powersgd_rank,
                start_powerSGD_iter=max(freeze, 2), use_error_feedback=True,
                warm_start=True, random_seed=a.seed)
            net.register_comm_hook(state, psgd.powerSGD_hook)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, eps=a.eps)

    nparams = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"cnn_fmnist: {tag}: {world} trainers, {a.steps} steps of "
              f"{a.batch} per trainer, lr {a.lr}, eps {a.eps}, freeze/start "
              f"step {freeze}, {nparams} parameters", file=sys.stderr)
    losses, log, diverged, stopped = [], [], None, False
    pos = 0
    t0 = time.monotonic()
    t_tail = None
    pending = []
    for step in range(a.steps):
        if step == freeze:
            t_tail = time.monotonic()
        if pos + a.batch > len(shard):
            pos = 0
        idx_ = shard[pos:pos + a.batch]
        pos += a.batch
        opt.zero_grad()
        loss = F.cross_entropy(net(train_x[idx_]), train_y[idx_])
        loss.backward()
        try:
            opt.step()
        except Exception as e:  # obcomm: NaN/Inf momentum, same on all ranks
            if getattr(e, "code", None) == -1008:
                # The op failed on every rank, and a failed op stops the
                # job: no collective after it.
                diverged, stopped = step, True
                break
            raise
        pending.append(loss.item())
        if len(pending) == a.log_every or step + 1 == a.steps:
            t = red.sum(torch.tensor(pending, dtype=torch.float64)) / world
            first = step + 1 - len(pending)
            for i, l in enumerate(t.tolist()):
                log.append((first + i, l))
                if not math.isfinite(l) and diverged is None:
                    diverged = first + i
            pending = []
            if diverged is not None:
                break
    t_train = time.monotonic() - t0
    tail_rate = ((a.steps - freeze) / (time.monotonic() - t_tail)
                 if t_tail is not None and diverged is None else None)

    # Test set, split over the ranks (each rank its own model, the whole
    # set, when the job stopped).
    model.eval()
    hits = torch.zeros(2, dtype=torch.float64)
    first, stride = (0, 500) if stopped else (rank * 500, world * 500)
    with torch.no_grad():
        for i in range(first, len(test_y), stride):
            out = model(test_x[i:i + 500])
            hits[0] += (out.argmax(1) == test_y[i:i + 500]).sum()
            hits[1] += F.cross_entropy(out, test_y[i:i + 500],
                                       reduction="sum").item()
    if not stopped:
        red.sum(hits)

    # Gloo's bytes between the nodes, while its connections are open.
    gloo_bytes = None
    if comm is None:
        pids = [None] * world
        dist.all_gather_object(pids, (os.getpid(), node))
        dist.barrier()
        if rank == 0:
            gloo_bytes = wire.inter_node_bytes(dict(pids))
        dist.barrier()

    if rank == 0:
        tail = [l for _, l in log[-100:]]
        r = {"mode": a.mode, "tag": tag, "trainers": world, "steps": a.steps,
             "steps_done": len(log), "batch": a.batch, "lr": a.lr,
             "eps": a.eps, "seed": a.seed, "freeze_step": freeze,
             "parameters": nparams,
             "test_accuracy": hits[0].item() / len(test_y),
             "test_loss": hits[1].item() / len(test_y),
             "final_train_loss": (sum(tail) / len(tail)
                                  if tail and all(map(math.isfinite, tail))
                                  else None),
             "train_seconds": t_train,
             "steps_per_second": len(log) / t_train,
             "tail_steps_per_second": tail_rate,
             "gloo_wire_bytes": gloo_bytes}
        if a.mode == "onebit":
            r["mask"] = a.mask
            r["masked"] = opt.masked()
            r["bias_correction"] = a.bias_correction
            # Its schedule: every bucket, one fp32 allreduce per warm-up
            # step, one 1-bit allreduce per step after.
            nb = len(opt.buckets)
            done = len(log)
            r["rounds"] = {"fp32": nb * min(freeze, done),
                           "1bit": nb * max(0, done - freeze)}
        if a.mode in ("zeroone", "lamb"):
            r["mask"] = a.mask
            r["masked"] = opt.masked()
            r["rounds"] = dict(opt.rounds)  # counted by the optimizer
        if a.mode == "powersgd":
            r["powersgd_rank"] = a.powersgd_rank
        if diverged is not None:
            r["diverged_at_step"] = diverged
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"{tag}.json"), "w") as f:
            json.dump(r, f, indent=1)
        with open(os.path.join(a.out, f"{tag}.csv"), "w") as f:
            f.write("step,loss\n")
            for s, l in log:
                f.write(f"{s},{l!r}\n")
        print(f"cnn_fmnist: {tag}: test accuracy {100 * r['test_accuracy']:.2f} %"
              + (f", DIVERGED at step {diverged}" if diverged is not None
                 else "") + f", {r['steps_per_second']:.1f} steps/s",
              file=sys.stderr)
    if comm is not None:
        opt.close()
        comm.close()
    else:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
