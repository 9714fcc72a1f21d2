"""Trainers of test_misuse.py: obcomm's optimizers combined with something
else that averages or updates the same gradients, or uses the same keys;
each case returns the error every rank got (or None when nothing was
refused)."""

import os

import torch
import torch.distributed as dist

import obcomm
import obcomm.torch
from workers import serve


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(),
                               torch.nn.Linear(4, 2))


def _loss(model, rank):
    g = torch.Generator().manual_seed(100 + rank)
    return model(torch.randn(16, 8, generator=g)).square().sum()


def _error(fn):
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def misuse(args):
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args['port']}", rank=rank,
        world_size=size)
    comm = obcomm.Communicator(timeout_ms=20000)
    T = obcomm.torch
    out = {}

    def ddp_case(make, hook=False):
        model = _model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if hook:
            ddp.register_comm_hook(comm, T.allreduce_hook)
        opt = make(model.parameters())

        def train():
            _loss(ddp, rank).backward()
            opt.step()
        try:
            return _error(train)
        finally:
            opt.close()

    out["ddp_onebit_adam"] = ddp_case(
        lambda ps: T.OneBitAdam(ps, comm=comm, key=10, freeze_step=5))
    out["ddp_onebit_adam_no_overlap"] = ddp_case(
        lambda ps: T.OneBitAdam(ps, comm=comm, key=10, freeze_step=5,
                                overlap=False))
    out["ddp_zero_one_adam"] = ddp_case(
        lambda ps: T.ZeroOneAdam(ps, comm=comm, key=10, var_freeze_step=5))
    out["ddp_onebit_lamb"] = ddp_case(
        lambda ps: T.OneBitLamb(ps, comm=comm, key=10, freeze_step=5))
    out["ddp_hook_onebit_adam"] = ddp_case(
        lambda ps: T.OneBitAdam(ps, comm=comm, key=10, freeze_step=5,
                                overlap=False), hook=True)

    # Two obcomm optimizers on the same parameters; a torch optimizer too.
    model = _model()
    a = T.OneBitAdam(model.parameters(), comm=comm, key=20)
    out["same_params"] = _error(
        lambda: T.ZeroOneAdam(model.parameters(), comm=comm, key=30))
    # The same key on other parameters.
    other = _model(1)
    out["same_key"] = _error(
        lambda: T.OneBitLamb(other.parameters(), comm=comm, key=20))
    # A Communicator collective on the optimizer's gradients, and on its key.
    _loss(model, rank).backward()
    grad = next(model.parameters()).grad
    out["allreduce_grad"] = _error(lambda: comm.allreduce(grad, op="avg"))
    out["allreduce_1bit_key"] = _error(
        lambda: comm.allreduce_1bit(20, torch.zeros(8)))
    out["reset_1bit_key"] = _error(lambda: comm.reset_1bit(20))
    a.step()
    a.zero_grad()
    a.close()
    # Closed, it holds nothing: another optimizer may take over.
    b = T.ZeroOneAdam(model.parameters(), comm=comm, key=20)
    _loss(model, rank).backward()
    b.step()
    out["after_close"] = b.steps
    b.close()

    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    c = T.OneBitAdam(model.parameters(), comm=comm, key=40, overlap=False)
    _loss(model, rank).backward()
    out["torch_optimizer"] = _error(c.step)
    c.close()
    del sgd

    comm.close()
    dist.destroy_process_group()
    return out


def nan_near_freeze(args):
    """Trains args["opt"] with its freeze at step 3 (ZeroOneAdam: after 2
    variance updates); from step 4 on rank 0's gradients are NaN, which
    the first 1-bit average meets: returns str() of the ObcommError and the
    step it came from."""
    T = obcomm.torch
    rank = int(os.environ["RANK"])
    comm = obcomm.Communicator(timeout_ms=20000)
    model = _model()
    ps = model.parameters()
    opt = {"adam": lambda: T.OneBitAdam(ps, comm=comm, freeze_step=3),
           "lamb": lambda: T.OneBitLamb(ps, comm=comm, freeze_step=3),
           "zoadam": lambda: T.ZeroOneAdam(ps, comm=comm,
                                           var_update_scaler=2)}[
        args["opt"]]()
    out = None
    for step in range(1, 40):
        opt.zero_grad()
        loss = _loss(model, rank)
        if step >= 4 and rank == 0:
            loss = loss * float("nan")
        loss.backward()
        try:
            opt.step()
        except obcomm.ObcommError as e:
            out = {"step": step, "code": e.code, "str": str(e)}
            break
    opt.close()
    comm.close()
    return out


def subgroup(args):
    """new_group of some ranks over obcomm: every rank, member or not,
    gets the same ValueError at once; a group of the whole world and a
    subgroup over Gloo still work."""
    import time
    dist.init_process_group("obcomm")
    t0 = time.monotonic()
    out = {"error": _error(lambda: dist.new_group(ranks=[0, 1]))}
    out["error_kw"] = _error(
        lambda: dist.new_group([0, 1], backend="obcomm"))
    out["seconds"] = time.monotonic() - t0
    gloo = dist.new_group(ranks=[0, 1], backend="gloo")
    t = torch.ones(3)
    if dist.get_rank() in (0, 1):
        dist.all_reduce(t, group=gloo)
    out["gloo"] = t.tolist()
    t = torch.ones(3)
    dist.all_reduce(t)
    out["world"] = t.tolist()
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    serve(globals())
