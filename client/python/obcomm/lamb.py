"""1-bit LAMB (Li et al. 2021, arXiv 2104.06069) over obcomm, as DeepSpeed's
OnebitLamb runs it (runtime/fp16/onebit/lamb.py), on CPU tensors."""

import math

import torch

from ._flat import FlatOptimizer, check_adam_args

__all__ = ["OneBitLamb"]


class OneBitLamb(FlatOptimizer):
    """1-bit LAMB: LAMB in a warm-up, then only the momentum crosses the
    network, 1 bit per element plus a scale, with the layer-wise trust
    ratios carried on from the warm-up.

    Warm-up, steps 1 .. freeze_step: the gradients are averaged in full
    precision; m and v as Adam's; each parameter tensor (a "layer") moves
    by lr * c * (m / (sqrt(v) + eps) + weight_decay * p), where its trust
    ratio c = ||p|| / ||update|| is clipped to [min_coeff, max_coeff] (1
    when either norm is 0), and an exponential moving average of c
    (coeff_beta) is kept per layer. At freeze_step the variance is frozen
    and copied into a fresh one.

    Compression stage: each rank updates its momentum with its own
    gradient; each layer's momentum is scaled by the mean over all layers
    of the momenta's RMS over its own (fixed at the first compressed
    step), so that one 1-bit scale fits all, averaged by the 1-bit
    allreduce, and scaled back. The gradient reconstructed from the
    averaged momentum, (m - beta1 * m_previous) / (1 - beta1), feeds the
    fresh variance; a layer's trust ratio is its warm-up average times a
    factor, max(frozen denominator / fresh denominator) blended by the
    share of weight decay in the update, clipped to [factor_min,
    factor_max] and to +-factor_threshold of its previous value.

    The update is DeepSpeed's (no bias correction). Param group g's 1-bit
    state is the daemons' key `key + g`, one 1-bit allreduce per group per
    step (DeepSpeed fuses all groups into one buffer; the layer scaling is
    over all groups alike). OneBitAdam's automatic momentum mask, from the
    frozen variance, holds coordinates whose variance is tiny after each
    1-bit average (set_auto_mask, masked; DeepSpeed asks the user for an
    exp_avg_mask). Where DeepSpeed divides by zero (a layer whose momentum
    is 0 at the freeze, an update whose norm is 0) this takes the scale
    and the ratio as 1.

    Parameters must be float32 CPU tensors; every rank constructs the
    optimizer with the same parameters and arguments (checked) and starts
    from rank 0's parameters; no DDP. state_dict() and load_state_dict()
    are collectives with OneBitAdam's semantics: a resumed run continues
    bit for bit, or every rank raises."""

    NAME = "OneBitLamb"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, freeze_step=100000, max_coeff=10.0,
                 min_coeff=0.01, coeff_beta=0.9, factor_max=4.0,
                 factor_min=0.5, factor_threshold=0.1, comm=None, key=1):
        check_adam_args(lr, betas, eps, weight_decay, freeze_step,
                        "freeze_step")
        if not 0.0 < min_coeff <= max_coeff:
            raise ValueError(f"invalid min_coeff {min_coeff} / max_coeff "
                             f"{max_coeff}")
        if not 0.0 < factor_min <= factor_max:
            raise ValueError(f"invalid factor_min {factor_min} / factor_max "
                             f"{factor_max}")
        if not 0.0 <= coeff_beta < 1.0 or not 0.0 <= factor_threshold:
            raise ValueError("invalid coeff_beta or factor_threshold")
        self.freeze_step = int(freeze_step)
        self.coeff_beta = float(coeff_beta)
        self.factor_max = float(factor_max)
        self.factor_min = float(factor_min)
        self.factor_threshold = float(factor_threshold)
        self._step = 0
        self._frozen = False
        self._scaled = False     # the layer scales are fixed
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_coeff=max_coeff,
                        min_coeff=min_coeff)
        super().__init__(params, defaults, comm, key)

    def _init_group(self, g, group):
        # m in shared memory (the 1-bit allreduce averages it); v, and the
        # fresh variance of the compression stage; per layer the trust
        # ratio's average, the last factor and the momentum's scale.
        g.m = self.comm.empty(g.count)
        g.v, g.v_fresh = torch.zeros(g.count), torch.zeros(g.count)
        g.denom = None
        k = len(g.params)
        g.coeff_freeze, g.last_factor, g.scale = [0.0] * k, [1.0] * k, [1.0] * k
        if self._frozen:
            self._freeze(g, group)

    def _mask(self, g):
        self._mask_from(g, g.v if self._frozen else None)

    def _freeze(self, g, group):
        g.denom = g.v.sqrt().add_(group["eps"])
        self._mask(g)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step += 1
        if not self._frozen:
            for g, group in zip(self._groups, self.param_groups):
                self._gather_grads(g)
                self._warmup_step(g, group)
            if self._step >= self.freeze_step:
                self._frozen = True
                for g, group in zip(self._groups, self.param_groups):
                    self._freeze(g, group)
            return loss
        if not self._scaled:
            self._fix_scales()
        for g, group in zip(self._groups, self.param_groups):
            self._gather_grads(g)
            self._compressed_step(g, group)
        return loss

    def _warmup_step(self, g, group):
        beta1, beta2 = group["betas"]
        self.comm.allreduce(g.g, "avg")
        g.m.mul_(beta1).add_(g.g, alpha=1 - beta1)
        g.v.mul_(beta2).addcmul_(g.g, g.g, value=1 - beta2)
        if self._step == self.freeze_step:
            g.v_fresh.copy_(g.v)
        update = g.m / (g.v.sqrt() + group["eps"])
        if group["weight_decay"] > 0.0:
            update.add_(g.p, alpha=group["weight_decay"])
        for i, (o, n) in enumerate(g.spans):
            p, u = g.p[o:o + n], update[o:o + n]
            w, un = p.norm().item(), u.norm().item()
            coeff = 1.0
            if w != 0.0 and un != 0.0:
                coeff = min(max(w / un, group["min_coeff"]),
                            group["max_coeff"])
            if coeff != 1.0:
                g.coeff_freeze[i] = (self.coeff_beta * g.coeff_freeze[i] +
                                     (1 - self.coeff_beta) * coeff)
            p.add_(u, alpha=-group["lr"] * coeff)

    def _fix_scales(self):
        """At the first compressed step: each layer's momentum scale, the
        mean over all layers of the momenta's RMS over its own."""
        rms = [[(g.m[o:o + n].norm() / math.sqrt(n)).item()
                for o, n in g.spans] for g in self._groups]
        flat = [r for rs in rms for r in rs]
        united = sum(flat) / len(flat)
        for g, rs in zip(self._groups, rms):
            g.scale = [united / r if r > 0.0 else 1.0 for r in rs]
        self._scaled = True

    def _compressed_step(self, g, group):
        beta1, beta2 = group["betas"]
        m_last = g.m.clone()
        g.m.mul_(beta1).add_(g.g, alpha=1 - beta1)
        for (o, n), s in zip(g.spans, g.scale):
            g.m[o:o + n].mul_(s)
        self.comm.allreduce_1bit(g.key, g.m)
        for (o, n), s in zip(g.spans, g.scale):
            g.m[o:o + n].div_(s)
        if g.drop is not None:
            g.m.masked_fill_(g.drop, 0.0)
        rec = (g.m - m_last * beta1) / (1 - beta1)
        g.v_fresh.mul_(beta2).addcmul_(rec, rec, value=1 - beta2)
        pre = g.m / g.denom
        wd = group["weight_decay"]
        for i, (o, n) in enumerate(g.spans):
            p, u_pre = g.p[o:o + n], pre[o:o + n]
            u = u_pre + p * wd if wd > 0.0 else u_pre
            un = u.norm().item()
            real = g.v_fresh[o:o + n].sqrt().add_(group["eps"])
            factor = (g.denom[o:o + n] / real).max().item()
            if wd > 0.0:
                ratio = min(1.0, u_pre.norm().item() / un) if un > 0 else 1.0
                factor = factor * ratio + (1.0 - ratio)
            factor = min(max(factor, self.factor_min), self.factor_max)
            last = g.last_factor[i]
            factor = min(max(factor, last * (1.0 - self.factor_threshold)),
                         last * (1.0 + self.factor_threshold))
            g.last_factor[i] = factor
            p.add_(u, alpha=-group["lr"] * g.coeff_freeze[i] * factor)

    # -- checkpoints ------------------------------------------------------

    def state_dict(self):
        """torch's state dict with, per parameter, 'exp_avg', 'exp_avg_sq',
        'exp_avg_sq_fresh', 'lamb_coeff_freeze', 'last_factor' and
        'scaling_coeff' (DeepSpeed's names); "one_bit_lamb", the step and
        the stage; and "obcomm", the snapshot set of the daemons' error
        feedback taken with it. A collective."""
        def per_param(g, i, o, n):
            p = g.params[i]
            return {"exp_avg": g.m[o:o + n].clone().view_as(p),
                    "exp_avg_sq": g.v[o:o + n].clone().view_as(p),
                    "exp_avg_sq_fresh": g.v_fresh[o:o + n].clone().view_as(p),
                    "lamb_coeff_freeze": g.coeff_freeze[i],
                    "last_factor": g.last_factor[i],
                    "scaling_coeff": g.scale[i]}
        return self._state_dict_with(per_param, {"one_bit_lamb": {
            "step": self._step, "frozen": self._frozen,
            "scaled": self._scaled}})

    def load_state_dict(self, state_dict):
        """Restores the moments, the per-layer ratios and scales, the step
        and the daemons' error feedback of the snapshot the dict names.
        Every rank calls it; it raises ObcommError on every rank when a
        node lacks the snapshot or holds it damaged."""
        states, own = self._load_with(state_dict, "one_bit_lamb")
        need = ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh",
                "lamb_coeff_freeze", "last_factor", "scaling_coeff")
        for st in states:
            if not all(k in s for s in st for k in need):
                raise ValueError(f"load_state_dict: a parameter lacks one "
                                 f"of {need} (not a OneBitLamb state)")
        self._step = int(own["step"])
        self._frozen = bool(own["frozen"])
        self._scaled = bool(own["scaled"])
        for g, group, st in zip(self._groups, self.param_groups, states):
            g.m.copy_(self._cat(st, "exp_avg"))
            g.v.copy_(self._cat(st, "exp_avg_sq"))
            g.v_fresh.copy_(self._cat(st, "exp_avg_sq_fresh"))
            g.coeff_freeze = [float(s["lamb_coeff_freeze"]) for s in st]
            g.last_factor = [float(s["last_factor"]) for s in st]
            g.scale = [float(s["scaling_coeff"]) for s in st]
            g.denom = None
            if self._frozen:
                self._freeze(g, group)
            else:
                self._mask(g)
