"""Trainer processes of test_onebit_overlap.py (run as workers.py is, by
cluster.Cluster.run(..., script=overlap_workers.WORKERS)): OneBitAdam with
several buckets, with and without overlap."""

import hashlib
import os
import time

import torch

import obcomm
import obcomm.torch

from workers import digest, serve

WORKERS = os.path.abspath(__file__)

# A bucket of at least 4 KiB (1024 floats): Deep gets four buckets.
CAP_MB = 4096 / 2**20


class Deep(torch.nn.Module):
    """Several layers and one that forward never uses. With CAP_MB the
    buckets, in start order, are [fc3, fc4], [fc2], [unused, fc1] and
    [conv]: the first two start during backward, the last two only at its
    end (the third waits for `unused`, the fourth for the third)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 8 * 8, 64)
        self.unused = torch.nn.Linear(32, 16)
        self.fc2 = torch.nn.Linear(64, 48)
        self.fc3 = torch.nn.Linear(48, 32)
        self.fc4 = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        return self.fc4(x)


def batch(rank, step, micro=0, n=16):
    g = torch.Generator().manual_seed(1000 * rank + 37 * micro + step)
    x = torch.rand(n, 1, 16, 16, generator=g)
    x[:, :, :, -4:] = 0  # dead inputs: some conv weights see gradient 0
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def loss_of(model, rank, step, micro=0):
    x, y = batch(rank, step, micro)
    return torch.nn.functional.cross_entropy(model(x), y)


def _optimizer(model, comm, args):
    cap = args.get("cap_mb", CAP_MB)
    if "cap_mb_last" in args and comm.rank == comm.size - 1:
        cap = args["cap_mb_last"]
    return obcomm.torch.OneBitAdam(
        model.parameters(), lr=1e-3, freeze_step=args["freeze"], comm=comm,
        weight_decay=args.get("wd", 0.0), overlap=args["overlap"],
        bucket_cap_mb=cap, threads=args.get("threads"))


def _log_starts(opt):
    """Records (key, during backward) of every bucket start: True when a
    gradient hook started it, False at the end of backward or in step()."""
    log = []
    start = opt._start

    def logged(b, *args):
        log.append((b.key, opt._in_backward))
        start(b, *args)

    opt._start = logged
    return log


def train(args):
    """Deep with OneBitAdam and a StepLR schedule. args: overlap, freeze,
    until (train up to this global step, exclusive), accum (backward
    passes per step; with overlap all but the last inside no_sync()),
    cap_mb (cap_mb_last: the last rank's), save (path: state_dict and
    model after the steps), load (resume from it),
    swap (on the last rank: its first two buckets start in the other
    order), own_grads (a step at which two gradients are not the
    optimizer's views: None and a new tensor). Returns digests after each
    step, the starts of each step, whether every gradient was the
    optimizer's view after every step, masked(), the buckets, per-bucket v
    (with "v": True), the error of a failed step."""
    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)
    model = Deep()  # different on every rank: the optimizer broadcasts
    comm = obcomm.Communicator(timeout_ms=20000)
    out = {"rank": comm.rank, "digests": [], "starts": [], "error": None}
    try:
        opt = _optimizer(model, comm, args)
    except obcomm.ObcommError as e:
        out["error"] = {"code": e.code, "message": e.message}
        comm.close()
        return out
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    out["buckets"] = [(k, [tuple(p.shape) for p in ps], n)
                      for k, ps, n in opt.buckets]
    if args.get("swap") and comm.rank == comm.size - 1:
        opt._order[0], opt._order[1] = opt._order[1], opt._order[0]
    first = 0
    if args.get("load"):
        ck = torch.load(args["load"] + f".{comm.rank}")
        model.load_state_dict(ck["model"])
        try:
            opt.load_state_dict(ck["opt"])
        except ValueError as e:
            out["load_error"] = str(e)
            opt.close()
            comm.close()
            return out
        sched.load_state_dict(ck["sched"])
        first = ck["step"]
    log = _log_starts(opt)
    accum = args.get("accum", 1)
    unused0 = model.unused.weight.detach().clone()
    t0 = time.monotonic()
    for step in range(first, args["until"]):
        opt.zero_grad()
        if step == args.get("own_grads"):
            # Gradients that are not the optimizer's views: backward makes
            # new tensors, or adds into ones of the user's.
            model.fc4.weight.grad = None
            model.fc1.weight.grad = torch.zeros_like(model.fc1.weight)
        for micro in range(accum):
            if opt.overlap and micro < accum - 1:
                with opt.no_sync():
                    loss_of(model, comm.rank, step, micro).backward()
            else:
                loss_of(model, comm.rank, step, micro).backward()
        try:
            opt.step()
        except obcomm.ObcommError as e:
            out["error"] = {"code": e.code, "message": e.message,
                            "seconds": time.monotonic() - t0}
            break
        sched.step()
        out["starts"].append(list(log))
        log.clear()
        out["digests"].append(digest(model))
        # The gradients after the step: in the warm-up the average (the
        # same on every rank), in the compression stage this rank's own.
        with torch.no_grad():
            gs = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out.setdefault("grads", []).append(
            hashlib.sha256(gs.numpy().tobytes()).hexdigest())
        out["views"] = out.get("views", True) and all(
            comm.is_shared(p.grad) for p in model.parameters())
    out["steps"] = opt.steps
    out["threads"] = [opt.threads, torch.get_num_threads()]
    if out["error"] is None:
        out["masked"] = opt.masked()
        out["unused_moved"] = (
            (model.unused.weight - unused0).abs().max().item())
        if args.get("v") or args.get("save"):
            sd = opt.state_dict()
            out["obcomm"] = {k: v for k, v in sd["obcomm"].items()
                             if k != "part"}
            byp = {id(p): i for i, p in enumerate(model.parameters())}
            vs = [sd["state"][i]["exp_avg_sq"] for i in range(len(byp))]
            out["bucket_v"] = [
                torch.cat([vs[byp[id(p)]].reshape(-1) for p in ps])
                for _, ps, _ in opt.buckets]
            if args.get("save"):
                torch.save({"model": model.state_dict(), "opt": sd,
                            "sched": sched.state_dict(),
                            "step": args["until"]},
                           args["save"] + f".{comm.rank}")
    opt.close()
    comm.close()
    return out


def misuse(args):
    """With overlap: a second backward pass before step() (outside
    no_sync) and zero_grad() after a backward pass raise RuntimeError;
    step() then finishes the started step on every rank alike."""
    torch.manual_seed(0)
    model = Deep()
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = _optimizer(model, comm, {"freeze": 100, "overlap": True})
    out = {}
    loss_of(model, comm.rank, 0).backward()
    try:
        loss_of(model, comm.rank, 1).backward()
        out["second_backward"] = None
    except RuntimeError as e:
        out["second_backward"] = str(e)
    try:
        opt.zero_grad()
        out["zero_grad"] = None
    except RuntimeError as e:
        out["zero_grad"] = str(e)
    opt.step()
    opt.zero_grad()
    loss_of(model, comm.rank, 2).backward()
    opt.step()
    out["steps"] = opt.steps
    out["digest"] = digest(model)
    opt.close()
    comm.close()
    return out


if __name__ == "__main__":
    serve(globals())
