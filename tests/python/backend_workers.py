"""Trainer processes of test_torch_backend.py: torch.distributed over the
backend "obcomm". `backend_workers.py FUNC ARGS.pickle OUT.pickle` runs
FUNC(args) with torchrun's environment (cluster.Cluster.run sets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, OBCOMM_SOCKET and OBCOMM_JOB; the
test adds MASTER_ADDR and MASTER_PORT) and pickles its return value."""

import copy
import gc
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import obcomm
import obcomm.torch
from workers import (COUNT, DTYPES, Net, batch, digest, grads_of, serve,
                     values)

# 4 trainers and 2 daemons share the machine's cores.
torch.set_num_threads(1)

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG,
       "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _error(e):
    return {"code": e.code, "message": e.message, "type": type(e).__name__}


def collectives(args):
    """Every collective on every dtype through torch.distributed, blocking
    and with async_op=True (all ops of a round in flight at once, waited
    for newest first). Returns what each rank received per round."""
    dist.init_process_group("obcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    out = {"rank": rank, "size": size, "backend": dist.get_backend(),
           "work_types": set()}
    for mode in ("sync", "async"):
        a = mode == "async"
        works, got = [], {}

        def keep(key, w, result):
            if a:
                out["work_types"].add(type(w).__name__)
                works.append((key, w, result))
            else:
                assert w is None
                got[key] = copy.deepcopy(result)

        for dt in DTYPES:
            for name, op in OPS.items():
                for where in ("plain", "shm"):
                    x = values(rank, dt)
                    if where == "shm":  # in place, in the connection's memory
                        t = pg.comm.empty(x.shape, dtype=dt)
                        t.copy_(x)
                    else:
                        t = x.clone()
                    keep(("all_reduce", str(dt), name, where),
                         dist.all_reduce(t, op=op, async_op=a), t)
            for root in (0, size - 1):
                t = values(rank, dt) if rank == root else \
                    torch.zeros(COUNT, dtype=dt)
                keep(("broadcast", str(dt), root),
                     dist.broadcast(t, root, async_op=a), t)
            outs = [torch.zeros(COUNT, dtype=dt) for _ in range(size)]
            keep(("all_gather", str(dt)),
                 dist.all_gather(outs, values(rank, dt), async_op=a), outs)
            o = torch.zeros(size * COUNT, dtype=dt)
            keep(("all_gather_into_tensor", str(dt)),
                 dist.all_gather_into_tensor(o, values(rank, dt),
                                             async_op=a), o)
            for name, op in OPS.items():
                parts = list(values(rank, dt, size * COUNT).split(COUNT))
                o = torch.zeros(COUNT, dtype=dt)
                keep(("reduce_scatter", str(dt), name),
                     dist.reduce_scatter(o, parts, op=op, async_op=a), o)
                o = torch.zeros(COUNT, dtype=dt)
                keep(("reduce_scatter_tensor", str(dt), name),
                     dist.reduce_scatter_tensor(
                         o, values(rank, dt, size * COUNT), op=op,
                         async_op=a), o)
        # dtypes with no arithmetic in obcomm still gather (as bytes).
        b = values(rank, torch.int64) % 3 == 0
        outs = [torch.zeros(COUNT, dtype=torch.bool) for _ in range(size)]
        keep(("all_gather", "bool"), dist.all_gather(outs, b, async_op=a),
             outs)
        keep(("barrier",), dist.barrier(async_op=a), None)
        if a:
            first_future = works[0][1].get_future()
            for key, w, result in reversed(works):
                assert w.wait() is True
                assert w.is_completed() and w.is_success()
                got[key] = copy.deepcopy(result)
            # The future's value is the list of tensors, as Gloo's.
            out["future_value"] = first_future.wait()[0] is works[0][2]
        out[mode] = got
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
    out["objects"] = objs
    dist.destroy_process_group()
    return out


def ddp_vs_gloo(args):
    """The same model and data trained three ways in one process: DDP over
    "obcomm", DDP over a Gloo group of the same processes, and DDP over
    "obcomm" with obcomm.torch.allreduce_hook. Returns the start and the
    final parameters of each."""
    dist.init_process_group("obcomm")
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = Net()
    models = {k: copy.deepcopy(base) for k in ("obcomm", "gloo", "hook")}
    ddps = {"obcomm": DDP(models["obcomm"]),
            "gloo": DDP(models["gloo"], process_group=gloo),
            "hook": DDP(models["hook"])}
    ddps["hook"].register_comm_hook(None, obcomm.torch.allreduce_hook)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            for k, m in models.items()}
    for step in range(args["steps"]):
        x, y = batch(rank, step)
        for k, ddp in ddps.items():
            opts[k].zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opts[k].step()
    out = {"rank": rank,
           "start": [p.detach().clone() for p in base.parameters()]}
    for k, m in models.items():
        out[k] = [p.detach().clone() for p in m.parameters()]
    dist.destroy_process_group()
    return out


def killed_trainer(args):
    """The last rank SIGKILLs itself instead of submitting an all_reduce
    the others have in flight, so that op can never complete: their Work
    of it must raise ObcommError. (Killed right after submitting, its part
    is in shared memory and the op may complete before its death reaches
    the daemons, which is a right answer too.) Returns, per
    survivor, the error of wait() (with the seconds it took), of the
    future, of a DDP backward after it (its reducer waits in C++) and of
    a later op."""
    dist.init_process_group("obcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Net())
    t = torch.ones(16)
    for _ in range(3):
        dist.all_reduce(t)
    big = torch.ones(args["count"])
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    out = {"rank": rank}
    t0 = time.monotonic()
    w = dist.all_reduce(big, async_op=True)
    try:
        w.wait()
        out["wait"] = None
    except obcomm.ObcommError as e:
        out["wait"] = _error(e)
        out["seconds"] = time.monotonic() - t0
    try:
        w.get_future().wait()
        out["future"] = None
    except RuntimeError as e:
        out["future"] = {"type": type(e).__name__, "message": str(e)}
    try:
        grads_of(model, rank, 0).backward()
        out["ddp"] = None
    except Exception as e:
        out["ddp"] = {"type": type(e).__name__, "message": str(e)}
    try:
        dist.all_reduce(t)
        out["later"] = None
    except obcomm.ObcommError as e:
        out["later"] = _error(e)
    dist.destroy_process_group()
    return out


def hook_overlap(args):
    """Two DDP copies of one MLP over "obcomm", in several buckets: one with
    obcomm.torch.allreduce_hook, one with a hook that reduces the bucket
    before returning (Communicator.allreduce). Returns the time spent
    inside each hook's calls (backward is blocked only there), how many
    of allreduce_hook's futures were still running when it returned, and
    whether both copies got bitwise the same gradients."""
    dist.init_process_group("obcomm")
    rank = dist.get_rank()
    comm = dist.group.WORLD.comm
    width, layers = args["width"], args["layers"]
    torch.manual_seed(0)
    a = torch.nn.Sequential(*[torch.nn.Linear(width, width)
                              for _ in range(layers)])
    b = copy.deepcopy(a)
    da = DDP(a, bucket_cap_mb=args["bucket_mb"])
    db = DDP(b, bucket_cap_mb=args["bucket_mb"])
    spent = {"async": [], "blocking": []}
    running = [0]

    def blocking_hook(state, bucket):
        t = bucket.buffer()
        comm.allreduce(t, op="avg")
        fut = torch.futures.Future()
        fut.set_result(t)
        return fut

    def timed(hook, key):
        def h(state, bucket):
            t0 = time.perf_counter()
            fut = hook(state, bucket)
            spent[key].append(time.perf_counter() - t0)
            if key == "async" and not fut.done():
                running[0] += 1
            return fut
        return h

    da.register_comm_hook(None, timed(obcomm.torch.allreduce_hook, "async"))
    db.register_comm_hook(None, timed(blocking_hook, "blocking"))
    same = True
    g = torch.Generator().manual_seed(rank)
    for step in range(args["steps"]):
        if step == 1:  # DDP rebuilds its buckets after the first step
            spent = {"async": [], "blocking": []}
            running[0] = 0
        x = torch.randn(args["batch"], width, generator=g)
        for m in (da, db):
            m.zero_grad()
            m(x).square().mean().backward()
        same = same and all(torch.equal(p.grad, q.grad) for p, q in
                            zip(a.parameters(), b.parameters()))
    out = {"rank": rank, "same": same, "running": running[0],
           "calls": len(spent["async"]),
           "async": sum(spent["async"]), "blocking": sum(spent["blocking"])}
    dist.destroy_process_group()
    return out


def onebit_beside_pg(args):
    """OneBitAdam (comm=None) trained with or without a process group
    "obcomm" in the process (args["pg"]), with an all_reduce through the
    process group after every step; then the optimizer, the process group
    and a Communicator() are closed in the order args["order"][rank] names.
    Returns the parameter digests, whether everything shared one
    connection, and how many connections are open at the end."""
    use_pg = args["pg"]
    rank = int(os.environ["RANK"])
    if use_pg:
        dist.init_process_group("obcomm")
    torch.manual_seed(rank)
    model = Net()  # different on every rank: the optimizer broadcasts
    opt = obcomm.torch.OneBitAdam(model.parameters(), lr=1e-3,
                                  freeze_step=args["freeze"])
    comm = obcomm.Communicator()
    out = {"rank": opt.comm.rank, "digests": []}
    conns = {id(opt.comm._conn), id(comm._conn)}
    if use_pg:
        conns.add(id(dist.group.WORLD.comm._conn))
    out["connections"] = len(conns)
    for step in range(args["steps"]):
        opt.zero_grad()
        grads_of(model, rank, step).backward()
        opt.step()
        if use_pg:
            t = torch.tensor([float(step + rank)])
            dist.all_reduce(t)
            size = dist.get_world_size()
            assert t.item() == size * step + size * (size - 1) // 2, t
        out["digests"].append(digest(model))
    order = args["order"][rank] if use_pg else args["alone_order"][rank]
    for what in order:
        if what == "pg":
            dist.destroy_process_group()
        elif what == "opt":
            opt.close()
        elif what == "optcomm":
            # The optimizer's own share, closed under it: once the last
            # holder goes, the connection destroys the C optimizer before
            # its handle closes, and the parameters stay readable.
            opt.comm.close()
        else:
            comm.close()
    gc.collect()
    out["open"] = len(obcomm.comm._conns)
    out["c_optimizers_left"] = sum(g.handle is not None for g in opt._groups)
    out["final"] = digest(model)
    return out


def rank_mismatch(args):
    """init_process_group("obcomm") with torch ranks that are not obcomm's:
    on one node, local rank 0 says RANK 1 and local rank 1 RANK 0."""
    os.environ["RANK"] = str(1 - int(os.environ["LOCAL_RANK"]))
    try:
        dist.init_process_group("obcomm")
    except obcomm.ObcommError as e:
        return _error(e)
    return None


def create_waits(args):
    """obcomm.backend's constructor on a store made here as env:// makes
    it, with the torch ranks swapped as in rank_mismatch: torch rank 1
    comes 2 s late. Returns when this rank entered and left the
    constructor, and its error."""
    from datetime import timedelta
    import obcomm.backend
    rank = 1 - int(os.environ["LOCAL_RANK"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"],
                          int(os.environ["MASTER_PORT"]), 2, rank == 0,
                          timedelta(seconds=60))
    if rank == 1:
        time.sleep(2)
    out = {"rank": rank, "enter": time.time()}
    try:
        obcomm.backend._create(store, rank, 2, timedelta(seconds=60))
        out["error"] = None
    except obcomm.ObcommError as e:
        out["error"] = _error(e)
    out["leave"] = time.time()
    return out


def join_fails_on_one(args):
    """init_process_group("obcomm") where torch rank 0 names a socket with
    no daemon behind it: both ranks raise, neither waits."""
    if os.environ["RANK"] == "0":
        os.environ["OBCOMM_SOCKET"] = args
    try:
        dist.init_process_group("obcomm")
    except obcomm.ObcommError as e:
        return _error(e)
    return None


if __name__ == "__main__":
    serve(globals())
