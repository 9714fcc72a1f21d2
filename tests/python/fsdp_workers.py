"""Trainer processes of test_fsdp.py: FSDP2 (fully_shard) of a small
transformer over the backend "obcomm" and over Gloo, the same model and
data. `fsdp_workers.py FUNC ARGS.pickle OUT.pickle` runs FUNC(args) with
torchrun's environment (see backend_workers.py)."""

import copy
import json
import os
import subprocess

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import obcomm.torch  # noqa: F401  (registers the backend)
from workers import serve

torch.set_num_threads(1)

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 12


class Transformer(torch.nn.Module):
    """A small language model: embedding, LAYERS encoder layers (causal
    mask, no dropout), a head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(DIM, HEADS, 2 * DIM,
                                             dropout=0.0, batch_first=True)
            for _ in range(LAYERS))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(
            x.shape[1])
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(h)


def tokens(rank, step, n=8):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)


def _ops_completed():
    r = subprocess.run([os.environ["OBCOMMCTL"], "-s",
                        os.environ["OBCOMM_SOCKET"], "--json", "metrics"],
                       capture_output=True, check=True, timeout=10)
    return {m["name"]: m["value"]
            for m in json.loads(r.stdout)["metrics"]}["ops_completed"]


def _count_ops(comm):
    """Counts the daemon ops comm issues (every ProcessGroupObcomm path
    ends in one of these)."""
    counter = {"n": 0}
    for name in ("_iallreduce", "_iallgather", "_ireduce_scatter",
                 "_ibroadcast", "_ibarrier"):
        f = getattr(comm, name)

        def counted(*a, _f=f, **k):
            counter["n"] += 1
            return _f(*a, **k)
        setattr(comm, name, counted)
    return counter


def _train(base, mesh, mp, steps, rank):
    """fully_shard of each layer and of the whole model on mesh, then
    SGD with momentum; returns the model and the losses."""
    model = copy.deepcopy(base)
    kw = {"mesh": mesh}
    if mp is not None:
        kw["mp_policy"] = mp
    for layer in model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        t = tokens(rank, step)
        opt.zero_grad()
        out = model(t[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            out.float().reshape(-1, VOCAB), t[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def fsdp_vs_gloo(args):
    """Trains the same transformer with fully_shard over a DeviceMesh of
    obcomm's world group, then over a Gloo group of the same processes;
    args: steps, bf16 (MixedPrecisionPolicy(param_dtype=bfloat16,
    reduce_dtype=float32)). Returns both runs' full parameters and
    losses, the start, the daemon ops this rank issued in obcomm's run
    and (local rank 0) what its node's daemon completed meanwhile."""
    dist.init_process_group("obcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    mesh_ob = init_device_mesh("cpu", (size,))
    mesh_gloo = DeviceMesh.from_group(gloo, "cpu")
    mp = None
    if args["bf16"]:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                  reduce_dtype=torch.float32)
    torch.manual_seed(0)
    base = Transformer()
    out = {"rank": rank, "start": {k: v.clone() for k, v in
                                   base.state_dict().items()}}
    counter = _count_ops(dist.group.WORLD.comm)
    dist.barrier()
    local0 = os.environ["LOCAL_RANK"] == "0"
    before = _ops_completed() if local0 else 0
    counter["n"] = 0
    model, out["obcomm_losses"] = _train(base, mesh_ob, mp, args["steps"],
                                         rank)
    out["issued"] = counter["n"]
    dist.barrier()
    if local0:
        out["daemon_ops"] = _ops_completed() - before - 1  # the barrier
    out["obcomm"] = {k: v.full_tensor() for k, v in
                     model.state_dict().items()}
    model, out["gloo_losses"] = _train(base, mesh_gloo, mp, args["steps"],
                                       rank)
    out["gloo"] = {k: v.full_tensor() for k, v in
                   model.state_dict().items()}
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    serve(globals())
