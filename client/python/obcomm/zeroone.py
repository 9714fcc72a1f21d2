"""0/1 Adam (Lu et al. 2022, arXiv 2202.06009) over obcomm, as DeepSpeed's
ZeroOneAdam runs it (runtime/fp16/onebit/zoadam.py), on CPU tensors."""

import torch

from ._flat import FlatOptimizer, check_adam_args

__all__ = ["ZeroOneAdam"]

# The schedule's counters, saved in the state dict's "zero_one" entry.
_COUNTERS = ("step", "var_interval", "var_counter", "local_step_interval",
             "local_step_counter", "frozen")


class ZeroOneAdam(FlatOptimizer):
    """0/1 Adam: Adam whose variance is updated on ever rarer steps, with
    1-bit communication in between, then local steps whose accumulated
    update is synchronized, 1 bit per element, every few steps.

    Stage 1, step t <= var_freeze_step. The variance is updated on the
    steps where t % var_interval == 0: there the gradients are averaged in
    full precision (an fp32 allreduce) and both moments are updated. On
    the other steps the gradients are averaged by the 1-bit allreduce (with
    the daemons' error feedback) and only the momentum is updated.
    var_interval starts at 1 and doubles after every var_update_scaler
    variance updates.

    Stage 2, t > var_freeze_step: the variance is frozen. Each rank
    updates its momentum with its own gradient and takes a local step;
    every local_step_interval steps the updates accumulated since the last
    synchronization, scaled back by sqrt(v) + eps, are averaged by the
    1-bit allreduce, and every rank sets its parameters to the last
    synchronized ones plus that average (divided again by sqrt(v) + eps)
    and its momentum to minus the average over the summed learning rates.
    local_step_interval starts at 1 and doubles every local_step_scaler
    steps up to local_step_clipper. Steps in between communicate nothing.

    The update is DeepSpeed's: no bias correction, weight decay added to
    m / (sqrt(v) + eps). Param group g's 1-bit state is the daemons' key
    `key + g`; it is reset on every node (obcomm_reset_1bit) on the step
    both stages meet, since its error feedback then starts to compress
    another quantity (accumulated updates instead of gradients).

    The momentum mask (as OneBitAdam's, docs/convergence.md): the 1-bit
    average gives every coordinate of a chunk the same magnitude, so a
    coordinate whose variance is 0 or tiny would move by up to
    lr * scale / eps. After each variance update, coordinate i is masked
    when sqrt(v_i) <= ratio * sqrt(mean v) over its param group
    (set_auto_mask; ratio 0.01 by default, 0 masks only v_i == 0, < 0
    turns it off); a masked coordinate's 1-bit averaged gradient (stage 1)
    and synchronized update (stage 2) are set to 0, as DeepSpeed's
    exp_avg_mask does with a mask the user builds.

    Where this differs from DeepSpeed's: a synchronization sets the
    parameters from a copy of the last synchronized ones instead of
    subtracting the accumulated updates, so every rank ends with the same
    bits (the subtraction rounds differently on each rank); it costs one
    more float32 copy of the parameters. There is no warm-up call that
    skips the first step, and a learning rate summed to 0 over an interval
    leaves the momentum as it was instead of dividing by 0.

    Parameters must be float32 CPU tensors; every rank constructs the
    optimizer with the same parameters and arguments (checked) and starts
    from rank 0's parameters. p.grad becomes a view into the optimizer's
    shared gradient buffer (a gradient set otherwise is copied in by
    step()). No DDP: the optimizer averages the gradients itself. `rounds`
    counts the collectives step() issued, {"fp32": n, "1bit": n}.

    state_dict() and load_state_dict() are collectives, with OneBitAdam's
    semantics: the dict names a snapshot set of the daemons' error
    feedback ("obcomm"), so a resumed run continues bit for bit or every
    rank raises."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, var_freeze_step=100000,
                 var_update_scaler=16, local_step_scaler=32678,
                 local_step_clipper=16, comm=None, key=1):
        check_adam_args(lr, betas, eps, weight_decay, var_freeze_step,
                        "var_freeze_step")
        for name, val in (("var_update_scaler", var_update_scaler),
                          ("local_step_scaler", local_step_scaler),
                          ("local_step_clipper", local_step_clipper)):
            if int(val) != val or val < 1:
                raise ValueError(f"invalid {name} {val} (an integer >= 1)")
        self.var_freeze_step = int(var_freeze_step)
        self.var_update_scaler = int(var_update_scaler)
        self.local_step_scaler = int(local_step_scaler)
        self.local_step_clipper = int(local_step_clipper)
        self.rounds = {"fp32": 0, "1bit": 0}
        self._c = dict(step=0, var_interval=1, var_counter=0,
                       local_step_interval=1, local_step_counter=0,
                       frozen=False)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults, comm, key)

    def _init_group(self, g, group):
        # m, v; u, the updates accumulated since the last synchronization,
        # in shared memory (the 1-bit allreduce of stage 2 averages it);
        # x, the parameters at the last synchronization, and denom,
        # sqrt(v) + eps, once v is frozen; lrs, the learning rates summed
        # since the last synchronization.
        g.m, g.v = torch.zeros(g.count), torch.zeros(g.count)
        g.u = self.comm.empty(g.count)
        g.x = g.denom = None
        g.lrs = 0.0
        if self._c["frozen"]:
            self._freeze(g, group)
        self._mask(g)

    def _mask(self, g):
        self._mask_from(g, g.v if self._c["step"] > 0 else None)

    def _freeze(self, g, group):
        g.denom = g.v.sqrt().add_(group["eps"])
        g.x = g.p.clone()
        g.u.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        c = self._c
        c["step"] += 1
        t = c["step"]
        full = not c["frozen"] and t % c["var_interval"] == 0
        sync = c["frozen"] and t % c["local_step_interval"] == 0
        for g, group in zip(self._groups, self.param_groups):
            self._gather_grads(g)
            if c["frozen"]:
                self._local_step(g, group, sync)
            else:
                self._stage1_step(g, group, full)
        # The schedules, as DeepSpeed advances them after the update.
        if not c["frozen"]:
            if full:
                c["var_counter"] += 1
                if c["var_counter"] == self.var_update_scaler:
                    c["var_counter"] = 0
                    c["var_interval"] *= 2
        else:
            c["local_step_counter"] += 1
            if c["local_step_counter"] == self.local_step_scaler:
                c["local_step_counter"] = 0
                c["local_step_interval"] = min(
                    self.local_step_clipper, c["local_step_interval"] * 2)
        if not c["frozen"] and t > self.var_freeze_step:
            c["frozen"] = True
            for g, group in zip(self._groups, self.param_groups):
                # Both error buffers of the key start again at zero on
                # every node: from here on they compress accumulated
                # updates, not gradients.
                self.comm.reset_1bit(g.key)
                self._freeze(g, group)
        return loss

    def _stage1_step(self, g, group, full):
        beta1, beta2 = group["betas"]
        if full:
            self.comm.allreduce(g.g, "avg")
            self.rounds["fp32"] += 1
            g.v.mul_(beta2).addcmul_(g.g, g.g, value=1 - beta2)
            self._mask(g)
        else:
            self.comm.allreduce_1bit(g.key, g.g)
            self.rounds["1bit"] += 1
            if g.drop is not None:
                g.g.masked_fill_(g.drop, 0.0)
        g.m.mul_(beta1).add_(g.g, alpha=1 - beta1)
        update = g.m / (g.v.sqrt() + group["eps"])
        if group["weight_decay"] > 0.0:
            update.add_(g.p, alpha=group["weight_decay"])
        g.p.add_(update, alpha=-group["lr"])

    def _local_step(self, g, group, sync):
        beta1 = group["betas"][0]
        lr = group["lr"]
        g.m.mul_(beta1).add_(g.g, alpha=1 - beta1)
        g.lrs += lr
        update = g.m / g.denom
        if group["weight_decay"] > 0.0:
            update.add_(g.p, alpha=group["weight_decay"])
        g.p.add_(update, alpha=-lr)
        g.u.add_(update, alpha=-lr)
        if not sync:
            return
        g.u.mul_(g.denom)
        self.comm.allreduce_1bit(g.key, g.u)
        self.rounds["1bit"] += 1
        if g.drop is not None:
            g.u.masked_fill_(g.drop, 0.0)
        if g.lrs > 0.0:
            torch.div(g.u, -g.lrs, out=g.m)
        torch.addcdiv(g.x, g.u, g.denom, out=g.p)
        g.x.copy_(g.p)
        g.u.zero_()
        g.lrs = 0.0

    # -- checkpoints ------------------------------------------------------

    def state_dict(self):
        """torch's state dict with, per parameter, 'exp_avg',
        'exp_avg_sq', 'momentum_accumulator' and, once the variance is
        frozen, 'sync_param' (the parameters at the last synchronization);
        "zero_one", the schedule's counters and each group's summed
        learning rates; and "obcomm", the snapshot set of the daemons'
        error feedback taken with it (and this node's part of it when its
        daemon keeps no state_dir). A collective."""
        def per_param(g, i, o, n):
            p = g.params[i]
            st = {"exp_avg": g.m[o:o + n].clone().view_as(p),
                  "exp_avg_sq": g.v[o:o + n].clone().view_as(p),
                  "momentum_accumulator": g.u[o:o + n].clone().view_as(p)}
            if g.x is not None:
                st["sync_param"] = g.x[o:o + n].clone().view_as(p)
            return st
        return self._state_dict_with(per_param, {"zero_one": dict(
            self._c, lrs=[g.lrs for g in self._groups])})

    def load_state_dict(self, state_dict):
        """Restores the moments, the accumulated updates, the schedule and
        the daemons' error feedback of the snapshot the dict names; the
        parameters come from the model's own state dict, as with any torch
        optimizer. Every rank calls it; it raises ObcommError on every rank
        when a node lacks the snapshot or holds it damaged."""
        states, sched = self._load_with(state_dict, "zero_one")
        frozen = bool(sched["frozen"])
        need = ["exp_avg", "exp_avg_sq", "momentum_accumulator"] + (
            ["sync_param"] if frozen else [])
        for st in states:
            if not all(k in s for s in st for k in need):
                raise ValueError(f"load_state_dict: a parameter lacks one "
                                 f"of {need} (not a ZeroOneAdam state)")
        self._c = {k: sched[k] for k in _COUNTERS}
        for g, group, st, lrs in zip(self._groups, self.param_groups, states,
                                     sched["lrs"]):
            g.m.copy_(self._cat(st, "exp_avg"))
            g.v.copy_(self._cat(st, "exp_avg_sq"))
            g.u.copy_(self._cat(st, "momentum_accumulator"))
            g.lrs = float(lrs)
            g.denom = g.x = None
            if frozen:
                g.denom = g.v.sqrt().add_(group["eps"])
                g.x = self._cat(st, "sync_param")
            self._mask(g)
