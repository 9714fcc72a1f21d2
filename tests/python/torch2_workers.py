"""Trainer processes of test_torch2.py: what torch 2 users reach for over
the backend "obcomm" (device-qualified init, DeviceMesh, functional
collectives, torch.compile under DDP). `torch2_workers.py FUNC ARGS.pickle
OUT.pickle` runs FUNC(args) with torchrun's environment (see
backend_workers.py)."""

import copy
import json
import os
import subprocess
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

import obcomm.torch  # noqa: F401  (registers the backend)
from obcomm.backend import ProcessGroupObcomm
from workers import COUNT, Net, batch, digest, serve, values

torch.set_num_threads(1)


def _ops_completed():
    """The ops this node's daemon completed (its metrics)."""
    r = subprocess.run([os.environ["OBCOMMCTL"], "-s",
                        os.environ["OBCOMM_SOCKET"], "--json", "metrics"],
                       capture_output=True, check=True, timeout=10)
    return {m["name"]: m["value"]
            for m in json.loads(r.stdout)["metrics"]}["ops_completed"]


def _done(t):
    return t.wait() if isinstance(t, fc.AsyncCollectiveTensor) else t


def registration(args):
    """init_process_group(args["spec"]) ("obcomm" or "cpu:obcomm"): what
    torch makes of the backend, one exact all_reduce, a DeviceMesh over
    the world and each functional collective on it, exact; the node's
    daemon's completed ops around the functional collectives."""
    dist.init_process_group(args["spec"])
    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    out = {"rank": rank, "size": size, "backend": dist.get_backend(),
           "capability": dist.Backend.backend_capability["obcomm"],
           "world_is_obcomm": isinstance(world, ProcessGroupObcomm),
           "group_name": world.group_name}
    t = values(rank, torch.float32)
    dist.all_reduce(t)
    out["all_reduce"] = t

    mesh = init_device_mesh("cpu", (size,))
    out["mesh_group_is_world"] = mesh.get_group() is world
    out["mesh_shape"] = tuple(mesh.shape)
    dist.barrier()
    before = _ops_completed() if os.environ["LOCAL_RANK"] == "0" else 0
    got = {}
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and not dt.is_floating_point:
                continue
            got[("all_reduce", str(dt), op)] = _done(
                fc.all_reduce(values(rank, dt), op, mesh))
        # all_gather_single and reduce_scatter_single are torch 2.13's
        # names of all_gather_tensor and reduce_scatter_tensor (which warn
        # that they are deprecated).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            got[("all_gather_tensor", str(dt))] = _done(
                fc.all_gather_tensor(values(rank, dt), 0, mesh))
            got[("reduce_scatter_tensor", str(dt))] = _done(
                fc.reduce_scatter_tensor(values(rank, dt, size * COUNT),
                                         "sum", 0, mesh))
        got[("all_gather_single", str(dt))] = _done(
            fc.all_gather_single(values(rank, dt), 0, mesh))
        got[("reduce_scatter_single", str(dt))] = _done(
            fc.reduce_scatter_single(values(rank, dt, size * COUNT), "sum",
                                     0, mesh))
    # Several in flight at once, waited for in reverse.
    pend = [fc.all_reduce(values(rank, torch.float32) * (i + 1), "sum",
                          world) for i in range(4)]
    got["in_flight"] = [_done(p) for p in reversed(pend)]
    out["functional"] = got
    out["functional_calls"] = len(got) - 1 + len(pend)
    dist.barrier()
    if os.environ["LOCAL_RANK"] == "0":
        out["ops_delta"] = _ops_completed() - before
    dist.destroy_process_group()
    return out


def compiled_ddp(args):
    """The same model trained with DDP over "obcomm" eagerly and as
    torch.compile(DDP(model)) (TorchDynamo's DDP optimizer splits the
    graph at the buckets), SGD with momentum; returns both final
    parameters and the start."""
    dist.init_process_group("obcomm")
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = Net()
    eager_m, comp_m = copy.deepcopy(base), copy.deepcopy(base)
    eager = DDP(eager_m)
    comp = torch.compile(DDP(comp_m),
                         backend=args["backend"])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            for m in (eager_m, comp_m)]
    for step in range(args["steps"]):
        x, y = batch(rank, step)
        for model, opt in zip((eager, comp), opts):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    out = {"rank": rank,
           "start": [p.detach().clone() for p in base.parameters()],
           "eager": [p.detach().clone() for p in eager_m.parameters()],
           "compiled": [p.detach().clone() for p in comp_m.parameters()],
           "compiled_digest": digest(comp_m)}
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    serve(globals())
