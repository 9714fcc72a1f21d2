"""Trainer processes of test_onebit_mixed.py (run as workers.py is, by
cluster.Cluster.run(..., script=mixed_workers.WORKERS)): OneBitAdam over
float16 and bfloat16 models, and gradient clipping."""

import hashlib
import os

import torch

import obcomm
import obcomm.torch

from overlap_workers import _log_starts
from workers import serve, sqrt

WORKERS = os.path.abspath(__file__)

# Buckets of at least 4 KiB of float32 (1024 elements): Mlp gets two,
# [fc2, fc3] and [fc1].
CAP_MB = 4096 / 2**20

DTYPES = {"float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


class Mlp(torch.nn.Module):
    """Three linear layers computing in float32 whatever the parameters'
    dtype (torch 1.13 has no float16 matmul on the CPU): the casts' backward
    rounds each gradient to the parameter's dtype, as a float16/bfloat16
    model's gradients are."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 48)
        self.fc2 = torch.nn.Linear(48, 32)
        self.fc3 = torch.nn.Linear(32, 10)

    def forward(self, x):
        for i, fc in enumerate((self.fc1, self.fc2, self.fc3)):
            x = torch.nn.functional.linear(x, fc.weight.float(),
                                           fc.bias.float())
            if i < 2:
                x = torch.relu(x)
        return x


def batch(rank, step, n=16):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,),
                                                          generator=g)


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x), y)


def masters(opt):
    """The optimizer's float32 parameters, flat, over its param groups
    (the test reads the optimizer's own buffers)."""
    return torch.cat([g.p.clone() for g in opt._groups])


def model_flat(model):
    return torch.cat([p.detach().reshape(-1).clone()
                      for p in model.parameters()])


def digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def train(args):
    """Mlp in args["dtype"] (init_dtype: a float32 model starting from
    the parameters rounded to that dtype) with OneBitAdam (lr 1e-2,
    freeze, max_grad_norm, overlap) for steps [first, until); save/load a
    checkpoint (model and optimizer). Returns after every step the digest
    of masters and model, whether the model is the masters rounded to its
    dtype bitwise, the masters, and the bucket starts."""
    rank = int(os.environ["RANK"])
    torch.manual_seed(args.get("seed", 0) + rank)
    model = Mlp()
    if "init_dtype" in args:
        model = model.to(DTYPES[args["init_dtype"]])
    dtype = DTYPES[args.get("dtype", "float32")]
    model = model.to(dtype)
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.OneBitAdam(
        model.parameters(), lr=args.get("lr", 1e-2),
        freeze_step=args["freeze"], comm=comm,
        overlap=args.get("overlap", True), bucket_cap_mb=CAP_MB,
        max_grad_norm=args.get("max_grad_norm", 0.0))
    out = {"rank": comm.rank, "digests": [], "rounded": [], "masters": [],
           "starts": [], "buckets": len(opt.buckets)}
    first = 0
    if args.get("load"):
        ck = torch.load(args["load"] + f".{comm.rank}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        first = ck["step"]
    out["start_rounded"] = torch.equal(
        masters(opt).to(dtype).view(torch.uint8),
        model_flat(model).view(torch.uint8))
    out["start_digest"] = digest(masters(opt), model_flat(model))
    log = _log_starts(opt)
    for step in range(first, args["until"]):
        opt.zero_grad()
        loss_of(model, comm.rank, step).backward()
        assert all(p.grad.dtype == dtype for p in model.parameters())
        opt.step()
        assert all(p.dtype == dtype for p in model.parameters())
        ms, mf = masters(opt), model_flat(model)
        out["digests"].append(digest(ms, mf))
        out["rounded"].append(torch.equal(ms.to(dtype).view(torch.uint8),
                                          mf.view(torch.uint8)))
        out["masters"].append(ms)
        out["starts"].append(list(log))
        log.clear()
    out["steps"] = opt.steps
    if args.get("save"):
        sd = opt.state_dict()
        out["state_keys"] = sorted(sd["state"][0])
        out["state_dtypes"] = sorted({str(v.dtype) for s in
                                      sd["state"].values()
                                      for k, v in s.items() if k != "step"})
        torch.save({"model": model.state_dict(), "opt": sd,
                    "step": args["until"]}, args["save"] + f".{comm.rank}")
    opt.close()
    comm.close()
    return out


def clip_reference(args):
    """One node, float32 with max_grad_norm, freeze at args["freeze"]:
    after every step the parameters against a reference computed here
    from the parameters before the step, from both ranks' gradients on a
    copy of the model, with DeepSpeed's clip coefficient
    max_norm / (norm + 1e-6) from the norm in double, rounded to float32
    as the C library takes it. Warm-up: the coefficient of the float32
    average (the daemon's sum / 2) scales the average, then 1-bit Adam's
    warm-up update without bias correction. Compression stage: each rank's
    coefficient of its own gradient scales that gradient, each rank's
    momentum b1*m + (1-b1)*g is averaged (exactly: one node's 1-bit op is
    the plain average), and the update divides by the frozen
    sqrt(v) + eps (the automatic mask off, so no coordinate is held).
    Returns the max abs difference per step, the coefficients (warm-up:
    one; compression: one per rank) and the digests."""
    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)
    model = Mlp()
    comm = obcomm.Communicator(timeout_ms=20000)
    max_norm, lr, b1, b2, eps = args["max_grad_norm"], 1e-2, 0.9, 0.999, 1e-8
    freeze = args.get("freeze", 100)
    opt = obcomm.torch.OneBitAdam(
        model.parameters(), lr=lr, freeze_step=freeze, comm=comm,
        bucket_cap_mb=CAP_MB, max_grad_norm=max_norm)
    opt.set_auto_mask(False)

    # The constants as the C library rounds them: beta and 1 - beta in
    # float32 (a frozen v amplifies any difference).
    def f32(x):
        return float(torch.tensor(x, dtype=torch.float32))
    f1, f2 = f32(b1), f32(b2)
    c1, c2 = f32(1.0 - f1), f32(1.0 - f2)

    def coef_of(grads):
        norm = sum(float(g.double().square().sum()) for g in grads) ** 0.5
        coef = max_norm / (norm + 1e-6)
        return float(torch.tensor(coef, dtype=torch.float32)) \
            if coef < 1 else 1.0

    ref = Mlp()
    ms = [torch.zeros_like(p) for p in model.parameters()]
    vs = [torch.zeros_like(p) for p in model.parameters()]
    out = {"diffs": [], "digests": [], "coefs": []}
    for step in range(args["until"]):
        with torch.no_grad():
            for q, p in zip(ref.parameters(), model.parameters()):
                q.copy_(p)
        gs = []
        for r in range(comm.size):
            ref.zero_grad()
            loss_of(ref, r, step).backward()
            gs.append([q.grad.clone() for q in ref.parameters()])
        want = []
        if step >= freeze:
            coefs = [coef_of(g) for g in gs]
            out["coefs"].append(coefs)
            for j, (p, m, v) in enumerate(zip(model.parameters(), ms, vs)):
                moms = [f1 * m + c1 * (g[j] * c) for g, c in zip(gs, coefs)]
                m.copy_((moms[0] + moms[1]) / 2)
                d = 1 / (sqrt(v) + eps)  # frozen: the C library's factor
                want.append(p.detach() - lr * (m * d))
        else:
            avg = [(a + b) / 2 for a, b in zip(*gs)]
            coef = coef_of(avg)
            out["coefs"].append([coef])
            for p, g, m, v in zip(model.parameters(), avg, ms, vs):
                g = g * coef if coef != 1.0 else g
                m.copy_(f1 * m + c1 * g)
                v.copy_(f2 * v + (c2 * g) * g)
                want.append(p.detach() - lr * (m / (sqrt(v) + eps)))
        opt.zero_grad()
        loss_of(model, comm.rank, step).backward()
        opt.step()
        out["diffs"].append(max(float((p.detach() - w).abs().max())
                                for p, w in zip(model.parameters(), want)))
        out["digests"].append(digest(model_flat(model)))
    opt.close()
    comm.close()
    return out


def dtype_errors(args):
    """The constructor's errors for parameters it cannot train."""
    cases = {
        "mixed": [torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16)],
        "float64": [torch.zeros(3, dtype=torch.float64)],
        "device": [torch.zeros(3, device="meta")],
    }
    out = {}
    with obcomm.Communicator(timeout_ms=20000) as comm:
        for name, params in cases.items():
            try:
                obcomm.torch.OneBitAdam(params, comm=comm)
                out[name] = None
            except TypeError as e:
                out[name] = str(e)
        try:
            obcomm.torch.OneBitAdam([torch.zeros(3)], comm=comm,
                                    max_grad_norm=-1.0)
            out["clip"] = None
        except ValueError as e:
            out["clip"] = str(e)
    return out


if __name__ == "__main__":
    serve(globals())
