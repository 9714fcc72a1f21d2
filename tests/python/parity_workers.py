"""Trainers of test_parity.py: ZeroOneAdam and OneBitLamb on float32,
bfloat16 and float16 parameters, with and without max_grad_norm, fed
gradients set by hand (values exact in every dtype), so that runs can be
compared bit for bit."""

import os

import torch

import obcomm
import obcomm.torch
from workers import serve

SHAPES = [(8, 4), (4,), (3, 5)]


def _grads(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    # bfloat16 values (8 significant bits): exact in float16's range too.
    return [torch.randn(s, generator=g).to(torch.bfloat16).float()
            for s in SHAPES]


def train(args):
    """args: opt ("zoadam", "lamb"), dtype ("float32", "bfloat16",
    "float16"), clip (max_grad_norm), hand (a clip coefficient applied to
    the gradients here, computed as the optimizer would), steps. Returns
    the float32 weights (the masters of a float16/bfloat16 model, from
    state_dict()), the parameters as trained, and opt.stage."""
    rank = int(os.environ["RANK"])
    dtype = getattr(torch, args["dtype"])
    g0 = torch.Generator().manual_seed(7)
    params = [torch.nn.Parameter(
        torch.randn(s, generator=g0).to(torch.bfloat16).to(dtype))
        for s in SHAPES]
    comm = obcomm.Communicator(timeout_ms=20000)
    T = obcomm.torch
    kw = dict(comm=comm, lr=0.01, max_grad_norm=args["clip"])
    if args["opt"] == "zoadam":
        opt = T.ZeroOneAdam(params, var_update_scaler=1, var_freeze_step=4,
                            local_step_scaler=2, local_step_clipper=2, **kw)
    else:
        opt = T.OneBitLamb(params, freeze_step=3, **kw)
    for step in range(1, args["steps"] + 1):
        grads = _grads(rank, step)
        if args["hand"]:
            sumsq = sum(float(x.double().square().sum()) for x in grads)
            coef = args["hand"] / (sumsq ** 0.5 + 1e-6)
            if coef < 1.0:
                grads = [x.mul_(coef) for x in grads]
        for p, x in zip(params, grads):
            p.grad = x.to(dtype)
        opt.step()
    sd = opt.state_dict()
    if dtype == torch.float32:
        weights = [p.detach().clone() for p in params]
    else:
        weights = [sd["state"][i]["master"] for i in range(len(params))]
    out = {"weights": weights, "params": [p.detach().clone() for p in params],
           "stage": opt.stage}
    opt.close()
    comm.close()
    return out


if __name__ == "__main__":
    serve(globals())
