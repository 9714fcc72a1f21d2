"""Trainer processes of test_onebit_lamb.py (cluster.py runs them with
torchrun's environment): obcomm.torch.OneBitLamb on workers.Net."""

import math
import os

import torch

import obcomm
import obcomm.torch
from workers import Net, SimulatedRanks, resume_and_train, serve, sqrt

torch.set_num_threads(1)

FREEZE = 6
HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.5,
             freeze_step=FREEZE)
LAMB = dict(max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9, factor_max=4.0,
            factor_min=0.5, factor_threshold=0.0003)


def _groups(model):
    """Two param groups, the second with half the learning rate."""
    ps = list(model.parameters())
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": HYPER["lr"] / 2}]


class Reference(SimulatedRanks):
    """1-bit LAMB written out layer by layer for `size` ranks of one node,
    where the 1-bit allreduce is the exact average of what the ranks
    send; params holds every rank's parameters."""

    GROUPS = ([0, 1], [2, 3, 4, 5])

    def __init__(self, model, size, lamb):
        super().__init__(model, size)
        self.lamb = lamb
        k = len(self.params[0])
        self.lr = [HYPER["lr"]] * 2 + [HYPER["lr"] / 2] * 4
        z = [torch.zeros_like(p) for p in self.params[0]]
        self.m = [[t.clone() for t in z] for _ in range(size)]
        self.v = [t.clone() for t in z]
        self.fresh = [t.clone() for t in z]
        self.cf, self.last, self.scale = [0.0] * k, [1.0] * k, None
        self.drop = None
        self.t = 0

    @torch.no_grad()
    def step(self, step):
        b1, b2 = HYPER["betas"]
        eps, wd = HYPER["eps"], HYPER["weight_decay"]
        self.t += 1
        grads = self.grads(step)
        k = len(self.v)
        if self.t <= FREEZE:
            for i in range(k):
                g = self.avg([gr[i] for gr in grads])
                for r in range(self.size):
                    self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * g
                self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
                if self.t == FREEZE:
                    self.fresh[i] = self.v[i].clone()
                upd = self.m[0][i] / (sqrt(self.v[i]) + eps) + \
                    wd * self.params[0][i]
                w = self.params[0][i].norm().item()
                un = upd.norm().item()
                c = 1.0
                if w != 0 and un != 0:
                    c = min(max(w / un, self.lamb["min_coeff"]),
                            self.lamb["max_coeff"])
                if c != 1.0:
                    self.cf[i] = 0.9 * self.cf[i] + 0.1 * c
                for r in range(self.size):
                    self.params[r][i] -= self.lr[i] * c * upd
            if self.t == FREEZE:
                self.drop = self.group_mask(self.v, self.GROUPS)
            return
        if self.scale is None:
            # Per param group: the mean RMS over the group's layers.
            rms = [(self.m[0][i].norm() / math.sqrt(self.m[0][i].numel()))
                   .item() for i in range(k)]
            self.scale = [None] * k
            for idx in self.GROUPS:
                united = sum(rms[i] for i in idx) / len(idx)
                for i in idx:
                    self.scale[i] = united / rms[i]
        for i in range(k):
            last_m = self.m[0][i].clone()
            sent = [(b1 * self.m[r][i] + (1 - b1) * grads[r][i]) *
                    self.scale[i] for r in range(self.size)]
            m = self.avg(sent) / self.scale[i]
            m[self.drop[i]] = 0.0
            for r in range(self.size):
                self.m[r][i] = m
            rec = (m - last_m * b1) / (1 - b1)
            self.fresh[i] = b2 * self.fresh[i] + (1 - b2) * rec * rec
            denom = sqrt(self.v[i]) + eps
            pre = m / denom
            upd = pre + wd * self.params[0][i]
            factor = (denom / (sqrt(self.fresh[i]) + eps)).max().item()
            ratio = min(1.0, pre.norm().item() / upd.norm().item())
            factor = factor * ratio + (1 - ratio)
            th = self.lamb["factor_threshold"]
            factor = min(max(factor, self.lamb["factor_min"]),
                         self.lamb["factor_max"])
            factor = min(max(factor, self.last[i] * (1 - th)),
                         self.last[i] * (1 + th))
            self.last[i] = factor
            for r in range(self.size):
                self.params[r][i] -= self.lr[i] * self.cf[i] * factor * upd


def against_reference(args):
    """One node: OneBitLamb against Reference through the warm-up and the
    compression stage, with LAMB's arguments updated by args["lamb"].
    Returns this rank's largest difference per step."""
    torch.manual_seed(0)
    model = Net()
    comm = obcomm.Communicator(timeout_ms=20000)
    lamb = dict(LAMB, **args.get("lamb", {}))
    opt = obcomm.torch.OneBitLamb(_groups(model), **HYPER, **lamb, comm=comm)
    ref = Reference(model, comm.size, lamb)
    diffs = ref.follow(model, opt, comm.rank, args["steps"])
    out = {"rank": comm.rank, "diffs": diffs, "masked": opt.masked()}
    opt.close()
    comm.close()
    return out


def train(args):
    """OneBitLamb on Net from a different model on every rank; args as
    workers.resume_and_train's."""
    torch.manual_seed(int(os.environ["RANK"]))
    model = Net()
    comm = obcomm.Communicator(timeout_ms=20000)
    opt = obcomm.torch.OneBitLamb(_groups(model), **HYPER, **LAMB, comm=comm)
    return resume_and_train(model, opt, comm, args)


if __name__ == "__main__":
    serve(globals())
