"""Trainer processes of test_zero_one_adam.py (cluster.py runs them with
torchrun's environment): obcomm.torch.ZeroOneAdam on workers.Net."""

import json
import os
import subprocess

import torch

import obcomm
import obcomm.torch
import cluster
from workers import (Net, SimulatedRanks, grads_of, resume_and_train,
                     serve, sqrt)

torch.set_num_threads(1)

# A schedule short enough to reach every branch in a few dozen steps:
# the variance interval doubles after 2 updates (steps 1, 2, 4, 6, 10,
# 14, ...), the variance freezes after step 12, local steps double every
# 3 steps up to 4.
SCHEDULE = dict(var_freeze_step=12, var_update_scaler=2, local_step_scaler=3,
                local_step_clipper=4)
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-4, weight_decay=0.01)


def _groups(model):
    """Two param groups, the second with half the learning rate, so that
    both keys and the per-group sums of learning rates are exercised."""
    ps = list(model.parameters())
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": HYPER["lr"] / 2}]


def f32(x):
    """x rounded to float32."""
    return torch.tensor(x, dtype=torch.float32).item()


class Reference(SimulatedRanks):
    """0/1 Adam written out for `size` ranks of one node, where obcomm's
    1-bit allreduce is the exact average: per rank its own parameters,
    momentum and accumulated update; one variance."""

    def __init__(self, model, size, lrs):
        super().__init__(model, size)
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

    @torch.no_grad()
    def step(self, step):
        # The constants as libobcomm rounds them: the betas to float32,
        # then 1 - beta in float32 (exact), not torch's float32(1 - beta).
        b1, b2 = (f32(b) for b in HYPER["betas"])
        c1, c2 = f32(1.0 - b1), f32(1.0 - b2)
        eps, wd = HYPER["eps"], HYPER["weight_decay"]
        self.t += 1
        grads = self.grads(step)
        sync = self.frozen and self.t % self.li == 0
        full = not self.frozen and self.t % self.vi == 0
        for i in range(len(self.v)):
            lr = self.lr[i]
            if not self.frozen:
                g = self.avg([gr[i] for gr in grads])
                if self.t % self.vi == 0:
                    self.v[i] = b2 * self.v[i] + c2 * g * g
                else:
                    g[self.drop[i]] = 0.0
                for r in range(self.size):
                    m = self.m[r][i] = b1 * self.m[r][i] + c1 * g
                    p = self.params[r][i]
                    p -= lr * (m / (sqrt(self.v[i]) + eps) + wd * p)
                continue
            d = sqrt(self.v[i]) + eps
            for r in range(self.size):
                m = self.m[r][i] = b1 * self.m[r][i] + c1 * grads[r][i]
                self.lrsum[r][i] += lr
                p = self.params[r][i]
                upd = m / d + wd * p
                p -= lr * upd
                self.u[r][i] -= lr * upd
            if sync:
                avg = self.avg([self.u[r][i] * d for r in range(self.size)])
                avg[self.drop[i]] = 0.0
                for r in range(self.size):
                    self.m[r][i] = -avg / self.lrsum[r][i]
                    self.params[r][i].copy_(self.x[i] + avg / d)
                    self.u[r][i].zero_()
                    self.lrsum[r][i] = 0.0
                self.x[i] = self.params[0][i].clone()
        if full:
            self.drop = self.group_mask(self.v, ([0, 1], [2, 3, 4, 5]),
                                        ratio=0.03)
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
    diffs = ref.follow(model, opt, comm.rank, args["steps"])
    out = {"rank": comm.rank, "diffs": diffs, "rounds": dict(opt.rounds),
           "masked": opt.masked()}
    opt.close()
    comm.close()
    return out


def settings_change(args):
    """Changes a param group's betas after a step: the next step and a
    load of a dict saved with other betas must raise, since the C
    optimizer keeps the betas it was made with. Returns the messages."""
    torch.manual_seed(0)
    model = Net()
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.ZeroOneAdam(_groups(model), **HYPER, **SCHEDULE,
                                   comm=comm)
    grads_of(model, comm.rank, 0).backward()
    opt.step()
    sd = opt.state_dict()
    out = {}
    opt.param_groups[1]["betas"] = (0.8, 0.999)
    try:
        opt.step()
    except ValueError as e:
        out["step"] = str(e)
    opt.param_groups[1]["betas"] = HYPER["betas"]
    sd["param_groups"][0]["betas"] = (0.8, 0.999)
    try:
        opt.load_state_dict(sd)
    except ValueError as e:
        out["load"] = str(e)
    out["steps"] = opt.steps
    opt.close()
    comm.close()
    return out


def train(args):
    """ZeroOneAdam on Net from a different model on every rank (the
    optimizer broadcasts rank 0's); args as workers.resume_and_train's,
    and status (then the daemon's 1-bit keys of the run at the end).
    Adds the rounds after each step; every fifth zero_grad sets the
    gradients to None."""
    torch.manual_seed(int(os.environ["RANK"]))
    model = Net()
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.ZeroOneAdam(_groups(model), **HYPER, **SCHEDULE,
                                   comm=comm)
    # A share of the connection that outlives the loop, for the query.
    keep = comm._share() if args.get("status") else None
    out = resume_and_train(
        model, opt, comm, args,
        after_step=lambda o: o.setdefault("rounds_at", []).append(
            dict(opt.rounds)),
        set_to_none=lambda step: step % 5 == 4)
    if keep is not None:
        # The daemon's 1-bit keys of this run, while it lasts.
        keep.barrier()
        st = json.loads(subprocess.run(
            [cluster.OBCOMMCTL, "-s", os.environ["OBCOMM_SOCKET"],
             "--json", "status"], capture_output=True, check=True,
            timeout=10).stdout)
        out["keys"] = {k["key"]: k for j in st["jobs"]
                       if j["name"] == keep.job for k in j["keys"]}
        keep.barrier()
        keep.close()
    return out


if __name__ == "__main__":
    serve(globals())
