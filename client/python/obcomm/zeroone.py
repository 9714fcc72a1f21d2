"""0/1 Adam (Lu et al. 2022, arXiv 2202.06009) over obcomm, as DeepSpeed's
ZeroOneAdam runs it (runtime/fp16/onebit/zoadam.py), on CPU tensors."""

import hashlib

import torch

from .comm import Communicator, ObcommError, E_MISMATCH

__all__ = ["ZeroOneAdam"]

# OneBitAdam's (OBCOMM_ADAM_AUTO_MASK_RATIO of include/obcomm.h).
AUTO_MASK_RATIO = 0.01

# The schedule's counters, saved in the state dict's "zero_one" entry.
_COUNTERS = ("step", "var_interval", "var_counter", "local_step_interval",
             "local_step_counter", "frozen")


class _Group:
    """A param group's flat float32 buffers. p and g are in shared memory
    (the parameters and gradients are views into them); u, the updates
    accumulated since the last synchronization, too, since it is what the
    1-bit allreduce of the local-step stage averages."""

    def __init__(self):
        self.params = []
        self.spans = []     # (offset, numel) per parameter
        self.count = 0
        self.p = self.g = self.m = self.v = self.u = self.x = None
        self.denom = None   # sqrt(v) + eps once v is frozen
        self.drop = None    # the mask: True where a coordinate is held
        self.key = 0
        self.lrs = 0.0      # the learning rates summed since the last sync


class ZeroOneAdam(torch.optim.Optimizer):
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
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        if not eps > 0.0:
            raise ValueError(f"invalid eps {eps}")
        if not weight_decay >= 0.0 or not var_freeze_step >= 0:
            raise ValueError("invalid weight_decay or var_freeze_step")
        for name, val in (("var_update_scaler", var_update_scaler),
                          ("local_step_scaler", local_step_scaler),
                          ("local_step_clipper", local_step_clipper)):
            if int(val) != val or val < 1:
                raise ValueError(f"invalid {name} {val} (an integer >= 1)")
        self.comm = comm._share() if comm is not None else Communicator()
        self.key = int(key)
        self.var_freeze_step = int(var_freeze_step)
        self.var_update_scaler = int(var_update_scaler)
        self.local_step_scaler = int(local_step_scaler)
        self.local_step_clipper = int(local_step_clipper)
        self.rounds = {"fp32": 0, "1bit": 0}
        self._auto_ratio = AUTO_MASK_RATIO
        self._groups = []
        self._c = dict(step=0, var_interval=1, var_counter=0,
                       local_step_interval=1, local_step_counter=0,
                       frozen=False)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._setup(self.param_groups[-1])

    def _setup(self, group):
        g = _Group()
        for p in group["params"]:
            if p.device.type != "cpu" or p.dtype != torch.float32:
                raise TypeError(f"ZeroOneAdam: parameters must be float32 "
                                f"CPU tensors, not {p.dtype} on {p.device}")
            g.params.append(p)
            g.spans.append((g.count, p.numel()))
            g.count += p.numel()
        if g.count == 0:
            raise ValueError("ZeroOneAdam: a param group with no elements")
        g.key = self.key + len(self._groups)
        self._agree(g)
        comm = self.comm
        g.p, g.g, g.u = (comm.empty(g.count), comm.empty(g.count),
                         comm.empty(g.count))
        g.m, g.v = torch.zeros(g.count), torch.zeros(g.count)
        with torch.no_grad():
            for p, (o, n) in zip(g.params, g.spans):
                g.p[o:o + n].copy_(p.reshape(-1))
        comm.broadcast(g.p, root=0)
        for p, (o, n) in zip(g.params, g.spans):
            if p.grad is not None:
                g.g[o:o + n].copy_(p.grad.reshape(-1))
            p.data = g.p[o:o + n].view_as(p)
            p.grad = g.g[o:o + n].view_as(p)
        if self._c["frozen"]:
            self._freeze(g, group)
        self._mask(g)
        self._groups.append(g)

    def _agree(self, g):
        """Every rank must build the same groups (the daemons match a job's
        ops in the order they are issued): ObcommError on every rank
        naming the ranks whose parameter shapes or key differ."""
        desc = repr((g.key, [tuple(p.shape) for p in g.params])).encode()
        mine = torch.tensor([int.from_bytes(
            hashlib.blake2b(desc, digest_size=8).digest(), "little",
            signed=True)], dtype=torch.int64)
        every = torch.zeros(self.comm.size, dtype=torch.int64)
        self.comm._iallgather(every, mine, None).future.wait()
        differ = [r for r in range(self.comm.size) if every[r] != every[0]]
        if differ:
            raise ObcommError(
                E_MISMATCH,
                f"ZeroOneAdam: param group {len(self._groups)} on rank(s) "
                f"{differ} differs from rank 0's (rank {self.comm.rank}: "
                f"{len(g.params)} parameters, {g.count} elements, key "
                f"{g.key}); every rank must construct the optimizer with "
                f"the same parameters, param groups and key")

    def _gather_grads(self, g):
        """Points every p.grad back into g.g (copying a gradient that
        torch put elsewhere, e.g. after zero_grad(set_to_none=True))."""
        with torch.no_grad():
            for p, (o, n) in zip(g.params, g.spans):
                view = g.g[o:o + n]
                if p.grad is None:
                    view.zero_()
                elif p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad.reshape(-1))
                else:
                    continue
                p.grad = view.view_as(p)

    def set_auto_mask(self, ratio):
        """The automatic mask's ratio (AUTO_MASK_RATIO by default); 0
        masks only coordinates whose variance is exactly 0, a negative
        ratio turns the mask off."""
        self._auto_ratio = float(ratio)
        for g in self._groups:
            self._mask(g)

    def masked(self):
        """Coordinates the mask holds now."""
        return sum(int(g.drop.sum()) for g in self._groups
                   if g.drop is not None)

    def _mask(self, g):
        r = self._auto_ratio
        if r < 0.0 or self._c["step"] == 0:
            g.drop = None   # off, or no variance yet
            return
        s = g.v.sqrt()
        g.drop = s <= r * g.v.mean().sqrt().item()

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

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (their views into the shared
        buffer stay); set_to_none=True sets them to None as torch does."""
        for g in self._groups:
            if set_to_none:
                for p in g.params:
                    p.grad = None
            else:
                g.g.zero_()
                for p, (o, n) in zip(g.params, g.spans):
                    p.grad = g.g[o:o + n].view_as(p)

    # -- checkpoints ------------------------------------------------------

    def state_dict(self):
        """torch's state dict with, per parameter, 'exp_avg',
        'exp_avg_sq', 'momentum_accumulator' and, once the variance is
        frozen, 'sync_param' (the parameters at the last synchronization);
        "zero_one", the schedule's counters; and "obcomm", the snapshot
        set of the daemons' error feedback taken with it (and this node's
        part of it when its daemon keeps no state_dir). A collective."""
        snapshot = self.comm.save_1bit()
        info = {"snapshot": int(snapshot), "job": self.comm.job,
                "keys": [g.key for g in self._groups]}
        part = self.comm._export_1bit(snapshot)
        if part is not None:
            info["part"], info["node"] = part
        for g in self._groups:
            for p, (o, n) in zip(g.params, g.spans):
                st = {"exp_avg": g.m[o:o + n].clone().view_as(p),
                      "exp_avg_sq": g.v[o:o + n].clone().view_as(p),
                      "momentum_accumulator": g.u[o:o + n].clone().view_as(p)}
                if g.x is not None:
                    st["sync_param"] = g.x[o:o + n].clone().view_as(p)
                self.state[p] = st
        try:
            sd = super().state_dict()
        finally:
            self.state.clear()
        sd["zero_one"] = dict(self._c, lrs=[g.lrs for g in self._groups])
        sd["obcomm"] = info
        return sd

    def load_state_dict(self, state_dict):
        """Restores the moments, the accumulated updates, the schedule and
        the daemons' error feedback of the snapshot the dict names; the
        parameters come from the model's own state dict, as with any torch
        optimizer. Every rank calls it; it raises ObcommError on every rank
        when a node lacks the snapshot or holds it damaged."""
        info = state_dict.get("obcomm")
        sched = state_dict.get("zero_one")
        if not isinstance(info, dict) or not info.get("snapshot") or \
                not isinstance(sched, dict):
            raise ValueError("load_state_dict: not a ZeroOneAdam state dict "
                             "(no \"obcomm\" snapshot or \"zero_one\")")
        if list(info.get("keys", [])) != [g.key for g in self._groups]:
            raise ValueError(
                f"load_state_dict: the state dict was saved with keys "
                f"{info.get('keys')}, this optimizer has "
                f"{[g.key for g in self._groups]}")
        saved = state_dict["state"]
        ids = [i for grp in state_dict["param_groups"] for i in grp["params"]]
        super().load_state_dict({"state": {},
                                 "param_groups": state_dict["param_groups"]})
        frozen = bool(sched["frozen"])
        byp = {id(p): saved.get(i, {}) for p, i in zip(
            (p for grp in self.param_groups for p in grp["params"]), ids)}
        for g in self._groups:
            st = [byp[id(p)] for p in g.params]
            need = ["exp_avg", "exp_avg_sq", "momentum_accumulator"] + (
                ["sync_param"] if frozen else [])
            if not all(k in s for s in st for k in need):
                raise ValueError("load_state_dict: a parameter lacks "
                                 f"{need} (not a ZeroOneAdam state)")
            for dst, k in ((g.m, "exp_avg"), (g.v, "exp_avg_sq"),
                           (g.u, "momentum_accumulator")):
                dst.copy_(torch.cat([s[k].reshape(-1).float() for s in st]))
        part = info.get("part")
        self.comm._restore_1bit(int(info["snapshot"]), part,
                                info.get("node"))
        self._c = {k: sched[k] for k in _COUNTERS}
        for g, group, lrs in zip(self._groups, self.param_groups,
                                 sched["lrs"]):
            g.lrs = float(lrs)
            g.denom = g.x = None
            if frozen:
                g.denom = g.v.sqrt().add_(group["eps"])
                g.x = torch.cat([byp[id(p)]["sync_param"].reshape(-1).float()
                                 for p in g.params])
            self._mask(g)
        self.state.clear()

    def close(self):
        """Lets go of the optimizer's share of the connection."""
        if self.comm is not None:
            self.comm.close()
            self.comm = None
