"""Trainer processes of test_zero_one_adam.py (cluster.py runs them with
torchrun's environment): obcomm.torch.ZeroOneAdam on workers.Net."""

import json
import os
import subprocess

import torch

import obcomm
import obcomm.torch
import cluster
from workers import Net, digest, grads_of, serve

torch.set_num_threads(1)

# A schedule short enough to reach every branch in a few dozen steps:
# the variance interval doubles after 2 updates (steps 1, 2, 4, 6, 10,
# 14, ...), the variance freezes after step 12, local steps double every
# 3 steps up to 4.
SCHEDULE = dict(var_freeze_step=12, var_update_scaler=2, local_step_scaler=3,
                local_step_clipper=4)
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-4, weight_decay=0.01)


def _error(e):
    return {"code": e.code, "message": e.message}


def _groups(model):
    """Two param groups, the second with half the learning rate, so that
    both keys and the per-group sums of learning rates are exercised."""
    ps = list(model.parameters())
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": HYPER["lr"] / 2}]


class Reference:
    """0/1 Adam written out for `size` ranks of one node, where obcomm's
    1-bit allreduce is the exact average: per rank its own parameters,
    momentum and accumulated update; one variance."""

    def __init__(self, model, size, lrs):
        self.size = size
        self.models = [Net() for _ in range(size)]
        for m in self.models:
            m.load_state_dict(model.state_dict())
        self.params = [list(m.parameters()) for m in self.models]
        n = len(self.params[0])
        self.lr = lrs            # per parameter
        self.v = [torch.zeros_like(p) for p in self.params[0]]
        self.m = [[torch.zeros_like(p) for p in ps] for ps in self.params]
        self.u = [[torch.zeros_like(p) for p in ps] for ps in self.params]
        self.lrsum = [[0.0] * n for _ in range(size)]
        self.x = None
        self.drop = None         # per parameter, from its group's v
        self.t, self.vi, self.vc, self.li, self.lc = 0, 1, 0, 1, 0
        self.frozen = False

    def _avg(self, per_rank):
        acc = per_rank[0].clone()
        for x in per_rank[1:]:
            acc += x
        return acc / self.size

    def _mask(self):
        """OneBitAdam's automatic mask (ratio 0.01) over each param group
        (GROUPS of _groups)."""
        self.drop = [None] * len(self.v)
        for idx in ([0, 1], [2, 3, 4, 5]):
            flat = torch.cat([self.v[i].reshape(-1) for i in idx])
            cut = 0.01 * flat.mean().sqrt().item()
            for i in idx:
                self.drop[i] = self.v[i].sqrt() <= cut

    @torch.no_grad()
    def step(self, step):
        b1, b2 = HYPER["betas"]
        eps, wd = HYPER["eps"], HYPER["weight_decay"]
        self.t += 1
        grads = []
        for r, model in enumerate(self.models):
            model.zero_grad()
            with torch.enable_grad():
                grads_of(model, r, step).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        sync = self.frozen and self.t % self.li == 0
        full = not self.frozen and self.t % self.vi == 0
        for i in range(len(self.v)):
            lr = self.lr[i]
            if not self.frozen:
                g = self._avg([gr[i] for gr in grads])
                if self.t % self.vi == 0:
                    self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
                else:
                    g[self.drop[i]] = 0.0
                for r in range(self.size):
                    m = self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * g
                    p = self.params[r][i]
                    p -= lr * (m / (self.v[i].sqrt() + eps) + wd * p)
                continue
            d = self.v[i].sqrt() + eps
            for r in range(self.size):
                m = self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * grads[r][i]
                self.lrsum[r][i] += lr
                p = self.params[r][i]
                upd = m / d + wd * p
                p -= lr * upd
                self.u[r][i] -= lr * upd
            if sync:
                avg = self._avg([self.u[r][i] * d for r in range(self.size)])
                avg[self.drop[i]] = 0.0
                for r in range(self.size):
                    self.m[r][i] = -avg / self.lrsum[r][i]
                    self.params[r][i].copy_(self.x[i] + avg / d)
                    self.u[r][i].zero_()
                    self.lrsum[r][i] = 0.0
                self.x[i] = self.params[0][i].clone()
        if full:
            self._mask()
        if not self.frozen:
            if self.t % self.vi == 0:
                self.vc += 1
                if self.vc == SCHEDULE["var_update_scaler"]:
                    self.vc, self.vi = 0, self.vi * 2
        else:
            self.lc += 1
            if self.lc == SCHEDULE["local_step_scaler"]:
                self.lc = 0
                self.li = min(SCHEDULE["local_step_clipper"], self.li * 2)
        if not self.frozen and self.t > SCHEDULE["var_freeze_step"]:
            self.frozen = True
            self.x = [p.clone() for p in self.params[0]]


def against_reference(args):
    """One node: ZeroOneAdam against Reference through both stages.
    Returns this rank's largest difference per step."""
    torch.manual_seed(0)
    model = Net()
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.ZeroOneAdam(_groups(model), **HYPER, **SCHEDULE,
                                   comm=comm)
    lrs = [HYPER["lr"]] * 2 + [HYPER["lr"] / 2] * 4
    ref = Reference(model, comm.size, lrs)
    diffs = []
    for step in range(args["steps"]):
        opt.zero_grad()
        grads_of(model, comm.rank, step).backward()
        opt.step()
        ref.step(step)
        diffs.append(max((p - q).abs().max().item() for p, q in zip(
            model.parameters(), ref.params[comm.rank])))
    out = {"rank": comm.rank, "diffs": diffs, "rounds": dict(opt.rounds),
           "masked": opt.masked()}
    opt.close()
    comm.close()
    return out


def train(args):
    """ZeroOneAdam on Net from a different model on every rank (the
    optimizer broadcasts rank 0's); args: steps, and optionally save
    {step: path} / load path as workers.ckpt_train. Returns the digest of
    the parameters after each step, the rounds, and the metrics' bytes."""
    torch.manual_seed(int(os.environ["RANK"]))
    model = Net()
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.ZeroOneAdam(_groups(model), **HYPER, **SCHEDULE,
                                   comm=comm)
    out = {"rank": comm.rank, "digests": [], "rounds_at": [], "losses": []}
    first = 0
    try:
        if args.get("load"):
            ck = torch.load(args["load"] + f".{comm.rank}")
            model.load_state_dict(ck["model"])
            try:
                opt.load_state_dict(ck["opt"])
            except obcomm.ObcommError as e:
                out["load_error"] = _error(e)
                return out
            first = ck["step"]
        out["first"] = first
        for step in range(first, args["steps"]):
            opt.zero_grad(set_to_none=(step % 5 == 4))
            loss = grads_of(model, comm.rank, step)
            loss.backward()
            opt.step()
            out["losses"].append(loss.item())
            out["digests"].append(digest(model))
            out["rounds_at"].append(dict(opt.rounds))
            path = args.get("save", {}).get(step + 1)
            if path:
                torch.save({"model": model.state_dict(),
                            "opt": opt.state_dict(), "step": step + 1},
                           path + f".{comm.rank}")
        if args.get("status"):
            # The daemon's 1-bit keys of this run, while it lasts.
            comm.barrier()
            st = json.loads(subprocess.run(
                [cluster.OBCOMMCTL, "-s", os.environ["OBCOMM_SOCKET"],
                 "--json", "status"], capture_output=True, check=True,
                timeout=10).stdout)
            out["keys"] = {k["key"]: k for j in st["jobs"]
                           if j["name"] == comm.job for k in j["keys"]}
            comm.barrier()
        return out
    finally:
        opt.close()
        comm.close()


if __name__ == "__main__":
    serve(globals())
