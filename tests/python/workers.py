"""Trainer processes of the Python tests: `workers.py FUNC ARGS.pickle
OUT.pickle` runs FUNC(args) with torchrun's environment (set by
cluster.Cluster.run) and pickles its return value to OUT."""

import hashlib
import math
import os
import pickle
import sys

import torch

import obcomm
import obcomm.torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64]
COUNT = 1001  # odd on purpose


def values(rank, dtype, count=COUNT):
    """Small integers (exact in every dtype, sums too), rank-dependent."""
    i = torch.arange(count, dtype=torch.int64)
    x = (rank + 1) * (i % 7) - 3 * rank + (i % 5) - 4
    return x.to(dtype)


def collectives(args):
    """Every op on every dtype, on a shared tensor and on a plain one;
    returns what each rank received, the test compares it."""
    out = {}
    with obcomm.Communicator(timeout_ms=20000) as comm:
        assert comm.size == int(os.environ["WORLD_SIZE"])
        out["rank"], out["size"] = comm.rank, comm.size
        out["local"] = (comm.local_rank, comm.local_size)
        for dt in DTYPES:
            for op in ("sum", "avg", "max", "min"):
                for where in ("shm", "plain"):
                    x = values(comm.rank, dt)
                    if where == "shm":
                        t = comm.empty(x.shape, dtype=dt)
                        t.copy_(x)
                        assert comm.is_shared(t)
                    else:
                        t = x.clone()
                        assert not comm.is_shared(t)
                    r = comm.allreduce(t, op=op)
                    assert r is t
                    out[(str(dt), op, where)] = t.clone()
        # 2-D, non-contiguous: staged through shared memory.
        x = values(comm.rank, torch.float32, 30).reshape(5, 6).t()
        comm.allreduce(x, op="sum")
        out["noncontig"] = x.clone()
        for dt in DTYPES:
            for root in (0, comm.size - 1):
                for where in ("shm", "plain"):
                    x = values(comm.rank, dt)
                    t = comm.empty(x.shape, dtype=dt) if where == "shm" \
                        else torch.zeros_like(x)
                    t.copy_(x)
                    comm.broadcast(t, root=root)
                    out[("bcast", str(dt), root, where)] = t.clone()
        comm.barrier()
        # 1-bit: two ops on one key; see test_collectives.py for the values.
        for where in ("shm", "plain"):
            res = []
            for op in range(2):
                x = onebit_input(comm.rank // comm.local_size, comm.local_rank,
                                 comm.local_size)
                t = comm.empty(x.shape) if where == "shm" else x.clone()
                t.copy_(x)
                comm.allreduce_1bit(7 if where == "shm" else 8, t)
                res.append(t.clone())
            out[("1bit", where)] = res
    return out


ONEBIT_N = 2048
ONEBIT_C = 0.5


def onebit_signs(node):
    """Node 0's signs, and node 1's: equal where i % 4 == 0, else opposite."""
    i = torch.arange(ONEBIT_N)
    s0 = torch.where((i // 3) % 2 == 0, 1.0, -1.0)
    if node == 0:
        return s0
    return torch.where(i % 4 == 0, s0, -s0)


def onebit_input(node, local_rank, local_size):
    """c * signs of the node, +-0.25 per trainer so that the node's exact
    average is c * signs (with 2 trainers per node)."""
    x = ONEBIT_C * onebit_signs(node)
    d = 0.25 if local_rank % 2 == 0 else -0.25
    if local_size % 2 == 1 and local_rank == local_size - 1:
        d = 0.0
    return (x + d).float()


# -- models -------------------------------------------------------------------


class Net(torch.nn.Module):
    """A small convnet with a dead corner: the inputs' last column is
    always 0, so some conv weights see gradient 0 in the warm-up."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 8 * 8, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def batch(rank, step, n=16):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.rand(n, 1, 16, 16, generator=g)
    x[:, :, :, -4:] = 0
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def grads_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x), y)


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def adam_vs_torch(args):
    """One node: OneBitAdam in warm-up against torch.optim.Adam fed the
    same averaged gradient. Returns the max abs difference per step."""
    torch.manual_seed(0)
    model = Net()
    ref = Net()
    ref.load_state_dict(model.state_dict())
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=1e-2, eps=1e-8,
                                  bias_correction=True, freeze_step=10**6,
                                  comm=comm)
    ropt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-8)
    diffs = []
    for step in range(args["steps"]):
        opt.zero_grad()
        grads_of(model, comm.rank, step).backward()
        # The reference: every rank's gradient, averaged as the daemon does
        # (fp32 sum in rank order, then / size).
        acc = None
        for r in range(comm.size):
            ref.zero_grad()
            grads_of(ref, r, step).backward()
            g = [p.grad.clone() for p in ref.parameters()]
            acc = g if acc is None else [a + b for a, b in zip(acc, g)]
        for p, a in zip(ref.parameters(), acc):
            p.grad = a / comm.size
        ropt.step()
        opt.step()
        diffs.append(max((p - q).abs().max().item() for p, q in
                         zip(model.parameters(), ref.parameters())))
    opt.close()
    comm.close()
    return {"diffs": diffs, "rank": comm.rank}


def train(args):
    """OneBitAdam on Net with a LR schedule; optionally resumes from and
    saves to checkpoints. Returns the parameter digest and counts."""
    torch.manual_seed(args.get("seed", 0) + int(os.environ["RANK"]))
    model = Net()  # different on every rank: the optimizer broadcasts
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=args.get("lr", 1e-3),
                                  freeze_step=args["freeze"], comm=comm,
                                  weight_decay=args.get("wd", 0.0))
    if "auto_mask" in args:
        opt.set_auto_mask(args["auto_mask"])
    if args.get("explicit_mask"):
        keep = torch.ones_like(model.fc2.weight)
        keep[0] = 0
        opt.set_mask(model.fc2.weight, keep)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    first = 0
    if args.get("load"):
        ck = torch.load(args["load"] + f".{comm.rank}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        first = ck["step"]
    digests = []
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    at_freeze = None
    for step in range(first, first + args["steps"]):
        if step == args["freeze"]:
            at_freeze = model.fc2.weight.detach().clone()
        opt.zero_grad()
        loss = grads_of(model, comm.rank, step)
        loss.backward()
        opt.step()
        sched.step()
        digests.append(digest(model))
    out = {"digests": digests, "steps": opt.steps, "masked": opt.masked(),
           "rank": comm.rank,
           "moved": {n: (p.detach() - start[n]).abs().max().item()
                     for n, p in model.named_parameters()},
           "lr": opt.param_groups[0]["lr"]}
    if at_freeze is not None:
        out["fc2_at_freeze"] = at_freeze
        out["fc2_final"] = model.fc2.weight.detach().clone()
    if args.get("mask_counts"):
        sd = opt.state_dict()
        out["v"] = torch.cat([s["exp_avg_sq"].reshape(-1)
                              for s in sd["state"].values()])
        out["masked_by_ratio"] = {}
        for r in args["mask_counts"]:  # a ratio, or "off"
            opt.set_auto_mask(False if r == "off" else r)
            out["masked_by_ratio"][str(r)] = opt.masked()
    if args.get("save"):
        sd = opt.state_dict()
        out["state_keys"] = sorted(sd["state"][0].keys())
        torch.save({"model": model.state_dict(), "opt": sd,
                    "sched": sched.state_dict(),
                    "step": first + args["steps"]},
                   args["save"] + f".{comm.rank}")
    opt.close()
    comm.close()
    return out


def ddp_hook(args):
    """DDP with obcomm.torch.allreduce_hook: the gradients equal the
    average of every rank's own gradients (computed here by hand)."""
    import torch.distributed as dist
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port']}",
                            rank=rank, world_size=size)
    comm = obcomm.Communicator(timeout_ms=20000)
    torch.manual_seed(0)
    model = Net()
    ref = Net()
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(comm, obcomm.torch.allreduce_hook)
    grads_of(ddp, rank, 0).backward()
    acc = None
    for r in range(size):
        ref.zero_grad()
        grads_of(ref, r, 0).backward()
        g = [p.grad.clone() for p in ref.parameters()]
        acc = g if acc is None else [a + b for a, b in zip(acc, g)]
    want = [a / size for a in acc]
    same = all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    diff = max((p.grad - w).abs().max().item()
               for p, w in zip(model.parameters(), want))
    dist.destroy_process_group()
    comm.close()
    return {"same": same, "diff": diff}


def world_size_mismatch(args):
    try:
        obcomm.Communicator(timeout_ms=5000)
    except obcomm.ObcommError as e:
        return {"code": e.code, "message": e.message, "str": str(e)}
    return None


# -- the 1-bit state's lifecycle (test_onebit_state.py) -----------------------


def _error(e):
    return {"code": e.code, "message": e.message, "str": str(e)}


def ckpt_train(args):
    """OneBitAdam on Net as in `train` (same seeds, data, lr schedule),
    with checkpoints at chosen steps. args: freeze; until (train up to
    this global step, exclusive); save {step: path} (after `step` steps:
    state_dict() and a checkpoint file per rank, path.RANK); load (a path
    written by save: resume from it; load_rank: load that rank's file
    instead of this rank's); stop_after_load (return right after
    the load, whatever it did); timeout_ms.

    Returns rank, first (the step the run started at), digests (after
    each step from first on), saved {step: {"keys", "obcomm"}} (the top
    keys of each state dict and its "obcomm" entry, None when absent),
    load_error and save_error ({"code", "message"} of an ObcommError, or
    None). A failed state_dict() ends the run there."""
    torch.manual_seed(args.get("seed", 0) + int(os.environ["RANK"]))
    model = Net()  # different on every rank: the optimizer broadcasts
    comm = obcomm.Communicator(timeout_ms=args.get("timeout_ms", 20000))
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=1e-3,
                                  freeze_step=args["freeze"], comm=comm)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    out = {"rank": comm.rank, "first": 0, "digests": [], "saved": {},
           "load_error": None, "save_error": None}
    first = 0
    try:
        if args.get("load"):
            ck = torch.load(args["load"] +
                            f".{args.get('load_rank', comm.rank)}")
            model.load_state_dict(ck["model"])
            try:
                opt.load_state_dict(ck["opt"])
            except obcomm.ObcommError as e:
                out["load_error"] = _error(e)
                return out
            sched.load_state_dict(ck["sched"])
            first = ck["step"]
            if args.get("stop_after_load"):
                return out
        out["first"] = first
        saves = args.get("save", {})
        for step in range(first, args["until"]):
            opt.zero_grad()
            grads_of(model, comm.rank, step).backward()
            opt.step()
            sched.step()
            out["digests"].append(digest(model))
            if step + 1 in saves:
                try:
                    sd = opt.state_dict()
                except obcomm.ObcommError as e:
                    out["save_error"] = _error(e)
                    return out
                info = sd.get("obcomm")
                if isinstance(info, dict):  # the part's size, not its bytes
                    info = {k: v for k, v in info.items() if k != "part"}
                    info["part_bytes"] = len(sd["obcomm"].get("part") or b"")
                out["saved"][step + 1] = {
                    "keys": sorted(sd.keys()), "obcomm": info}
                torch.save({"model": model.state_dict(), "opt": sd,
                            "sched": sched.state_dict(), "step": step + 1},
                           saves[step + 1] + f".{comm.rank}")
        return out
    finally:
        opt.close()
        comm.close()


def sqrt(t):
    """The correctly rounded square root of a float32 tensor, as the C
    library's sqrtf: torch 2.13's vectorized CPU sqrt is off by one ulp
    on some elements (620 of 100003 uniform [0, 1) values). The square
    root in float64 rounded to float32 is exact."""
    return t.double().sqrt().to(t.dtype)


class SimulatedRanks:
    """`size` ranks of one node simulated in one process, for the
    optimizers' written-out references: each rank's own copy of model
    (params[r]), its gradient at its own parameters, and the exact
    average that obcomm computes inside a node (fp32 sum in rank order,
    then / size)."""

    def __init__(self, model, size):
        self.size = size
        self.models = [Net() for _ in range(size)]
        for m in self.models:
            m.load_state_dict(model.state_dict())
        self.params = [list(m.parameters()) for m in self.models]

    def grads(self, step):
        """Per rank, the gradients of grads_of(rank, step)."""
        out = []
        for r, model in enumerate(self.models):
            model.zero_grad()
            with torch.enable_grad():
                grads_of(model, r, step).backward()
            out.append([p.grad.clone() for p in model.parameters()])
        return out

    def avg(self, per_rank):
        acc = per_rank[0].clone()
        for x in per_rank[1:]:
            acc += x
        return acc / self.size

    def follow(self, model, opt, rank, steps):
        """Trains model with opt as rank `rank` and this reference (its
        step(step)) side by side; the largest difference between model
        and the reference's copy of that rank after each step."""
        diffs = []
        for step in range(steps):
            opt.zero_grad()
            grads_of(model, rank, step).backward()
            opt.step()
            self.step(step)
            diffs.append(max((p - q).abs().max().item() for p, q in zip(
                model.parameters(), self.params[rank])))
        return diffs

    @staticmethod
    def group_mask(v, groups, ratio=0.01):
        """OneBitAdam's automatic mask per parameter, over param groups
        given as lists of parameter indices: held where v <= (ratio *
        sqrt(mean v))^2, the mean in double, the threshold rounded to
        float32 (libobcomm's rule)."""
        drop = [None] * len(v)
        for idx in groups:
            flat = torch.cat([v[i].reshape(-1) for i in idx]).double()
            r = ratio * math.sqrt(flat.sum().item() / flat.numel())
            cut = torch.tensor(r * r, dtype=torch.float32)
            for i in idx:
                drop[i] = v[i] <= cut
        return drop


def resume_and_train(model, opt, comm, args, after_step=None,
                     set_to_none=lambda step: False):
    """The loop of the optimizers' checkpoint tests: loads args["load"]
    (a path written by a save: model, optimizer, step) if given, then
    trains on grads_of up to args["steps"], saving {step: path} of
    args["save"] after those steps (path.RANK). after_step(out) runs after
    each step. Returns rank, first, digests, losses and, when the load
    failed, load_error; closes opt and comm."""
    out = {"rank": comm.rank, "digests": [], "losses": [], "first": 0}
    try:
        if args.get("load"):
            ck = torch.load(args["load"] + f".{comm.rank}")
            model.load_state_dict(ck["model"])
            try:
                opt.load_state_dict(ck["opt"])
            except obcomm.ObcommError as e:
                out["load_error"] = _error(e)
                return out
            out["first"] = ck["step"]
        for step in range(out["first"], args["steps"]):
            opt.zero_grad(set_to_none=set_to_none(step))
            loss = grads_of(model, comm.rank, step)
            loss.backward()
            opt.step()
            out["losses"].append(loss.item())
            out["digests"].append(digest(model))
            if after_step is not None:
                after_step(out)
            path = args.get("save", {}).get(step + 1)
            if path:
                torch.save({"model": model.state_dict(),
                            "opt": opt.state_dict(), "step": step + 1},
                           path + f".{comm.rank}")
        return out
    finally:
        opt.close()
        comm.close()


def failed_op(args):
    """Ops 0 .. bad-1 are good allreduces (checked); op `bad` is an
    allreduce whose count differs on the last rank; then an allreduce, a
    1-bit allreduce (key 7) and a barrier. Returns the ObcommError
    ({"code", "message"}) or None of the bad op ("first") and of each
    later op ("later": [(name, error or None)])."""
    out = {}
    with obcomm.Communicator(timeout_ms=args["timeout_ms"]) as comm:
        out["rank"] = comm.rank
        for _ in range(args["bad"]):
            t = torch.full((16,), float(comm.rank + 1))
            comm.allreduce(t)
            assert torch.equal(t, torch.full((16,), float(
                comm.size * (comm.size + 1) // 2))), t
        n = 17 if comm.rank == comm.size - 1 else 16
        try:
            comm.allreduce(torch.ones(n))
            out["first"] = None
        except obcomm.ObcommError as e:
            out["first"] = _error(e)
        node = comm.rank // comm.local_size
        later = [
            ("allreduce", lambda: comm.allreduce(torch.ones(16))),
            ("allreduce_1bit", lambda: comm.allreduce_1bit(
                7, onebit_input(node, comm.local_rank, comm.local_size))),
            ("barrier", comm.barrier),
        ]
        out["later"] = []
        for name, op in later:
            try:
                op()
                out["later"].append((name, None))
            except obcomm.ObcommError as e:
                out["later"].append((name, _error(e)))
    return out


def healthy_ops(args):
    """A fresh run's ops: an allreduce (returned) and two 1-bit allreduces
    on key 7 with onebit_input (returned: they show whether the error
    feedback started at zero), then a barrier."""
    out = {}
    with obcomm.Communicator(timeout_ms=args["timeout_ms"]) as comm:
        out["rank"] = comm.rank
        t = torch.full((16,), float(comm.rank + 1))
        comm.allreduce(t)
        out["allreduce"] = t.clone()
        node = comm.rank // comm.local_size
        out["1bit"] = []
        for _ in range(2):
            x = onebit_input(node, comm.local_rank, comm.local_size)
            comm.allreduce_1bit(7, x)
            out["1bit"].append(x.clone())
        comm.barrier()
    return out


def serve(functions):
    """A worker process's entry point (cluster.py runs it): argv names a
    function of `functions` (a worker module's globals()), a pickle of its
    arguments and where its pickled result goes (renamed into place, so
    the driver never reads half a file)."""
    func, argf, outf = sys.argv[1:4]
    with open(argf, "rb") as f:
        args = pickle.load(f)
    res = functions[func](args)
    with open(outf + ".tmp", "wb") as f:
        pickle.dump(res, f)
    os.rename(outf + ".tmp", outf)


if __name__ == "__main__":
    serve(globals())
