"""1-bit LAMB (Li et al. 2021, arXiv 2104.06069) over obcomm, as DeepSpeed's
OnebitLamb runs it (runtime/fp16/onebit/lamb.py), on CPU tensors: one C
optimizer of libobcomm (obcomm_lamb_*, client/lamb.c) per param group."""

import ctypes

import torch

from ._flat import FlatOptimizer, check_adam_args, freeze_hint
from . import _stage
from ._lib import lib, LambConfig, LambState, constant

__all__ = ["OneBitLamb"]

WARMUP, FROZEN, COMPRESSING = 0, 1, 2   # the C optimizer's stages


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
    gradient; each layer's momentum is scaled by the mean over the layers
    of its param group of the momenta's RMS over its own (fixed at the
    first compressed step), so that one 1-bit scale fits all, averaged by
    the 1-bit allreduce, and scaled back. The gradient reconstructed from
    the averaged momentum, (m - beta1 * m_previous) / (1 - beta1), feeds
    the fresh variance; a layer's trust ratio is its warm-up average
    times a factor, max(frozen denominator / fresh denominator) blended by
    the share of weight decay in the update, clipped to [factor_min,
    factor_max] and to +-factor_threshold of its previous value.

    Each param group is one C optimizer (obcomm_lamb_*, the arithmetic
    of include/obcomm.h: norms and per-layer ratios in double); group g's
    1-bit state is the daemons' key `key + g`, one 1-bit allreduce per
    group per step, and its layer scales are over its own layers
    (DeepSpeed fuses all groups into one buffer and scales over all
    layers alike). The update is DeepSpeed's (no bias correction).
    OneBitAdam's automatic momentum mask, from the frozen variance of the
    param group, holds coordinates whose variance is tiny after each
    1-bit average (set_auto_mask, masked; DeepSpeed asks the user for an
    exp_avg_mask). Where DeepSpeed divides by zero (a layer whose momentum
    is 0 at the freeze, an update whose norm is 0) this takes the scale
    and the ratio as 1.

    Parameters are CPU tensors, float32, or float16 or bfloat16 over
    float32 master weights (as OneBitAdam's and ZeroOneAdam's); every rank
    constructs the optimizer with the same parameters and arguments
    (checked) and starts from rank 0's parameters; no DDP. The gradients
    are only read (the warm-up averages a copy), except that
    max_grad_norm > 0 clips them in place as ZeroOneAdam does (DeepSpeed's
    gradient_clipping, by the norm of this rank's own gradient). Only lr
    may change between steps; a param group added later starts its own
    warm-up. state_dict() and
    load_state_dict() are collectives with OneBitAdam's semantics: a
    resumed run continues bit for bit, or every rank raises."""

    C = "lamb"
    NAME = "OneBitLamb"
    # OneBitAdam's, OBCOMM_ADAM_AUTO_MASK_RATIO of the library.
    AUTO_MASK_RATIO = constant("OBCOMM_ADAM_AUTO_MASK_RATIO")
    HYPER = ("betas", "eps", "weight_decay", "max_coeff", "min_coeff")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, freeze_step=100000, max_coeff=10.0,
                 min_coeff=0.01, coeff_beta=0.9, factor_max=4.0,
                 factor_min=0.5, factor_threshold=0.1, comm=None, key=1,
                 max_grad_norm=0.0):
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
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_coeff=max_coeff,
                        min_coeff=min_coeff)
        super().__init__(params, defaults, comm, key, max_grad_norm)

    def _nonfinite_hint(self, step):
        return freeze_hint(self.NAME, step, self.freeze_step)

    @property
    def stage(self):
        """"warmup" (LAMB on fp32-averaged gradients; also before the first
        step) or "compressed" (from the step after freeze_step: 1-bit
        momentum)."""
        if not self._groups:
            return "warmup"
        st = self._state(self._groups[0])[0]
        # FROZEN: the variance frozen by the last warm-up step, the first
        # compressed step not taken yet.
        return "compressed" if st.stage == COMPRESSING else "warmup"

    def _freeze(self):
        return "freeze_step", self.freeze_step

    def _stage_text(self):
        n = self._nodes()
        return (f"OneBitLamb: step {self.steps} was the first compressed step "
                f"(freeze_step {self.freeze_step}): a step now sends "
                f"{self._bytes(_stage.onebit_bytes)} bytes per node instead "
                f"of about {self._bytes(_stage.fp32_bytes)} (1-bit momentum "
                f"instead of fp32 gradients; {len(self._groups)} param "
                f"group(s), {n} node(s))")

    def _config(self, group):
        k = LambConfig()
        k.lr = group["lr"]
        k.beta1, k.beta2 = group["betas"]
        k.eps = group["eps"]
        k.weight_decay = group["weight_decay"]
        k.max_coeff = group["max_coeff"]
        k.min_coeff = group["min_coeff"]
        k.coeff_beta = self.coeff_beta
        k.factor_max = self.factor_max
        k.factor_min = self.factor_min
        k.factor_threshold = self.factor_threshold
        k.freeze_step = self.freeze_step
        return k

    def _init_group(self, g, group):
        # The layers are the parameters with elements; the C optimizer
        # keeps m, v, v' and the per-layer ratios and scales.
        g.layer = []
        offsets = []
        for o, n in g.spans:
            g.layer.append(len(offsets) if n else None)
            if n:
                offsets.append(o)
        offsets.append(g.count)
        g.offsets = offsets
        arr = (ctypes.c_size_t * len(offsets))(*offsets)
        cfg = self._config(group)
        h = ctypes.c_void_p()
        with self.comm._locked() as ch:
            self.comm._check(lib.obcomm_lamb_create(
                ch, g.key, g.count, len(offsets) - 1, arr, ctypes.byref(cfg),
                ctypes.byref(h)))
        self._own(g, h, lib.obcomm_lamb_destroy)
        lib.obcomm_lamb_set_auto_mask(h, self._auto_ratio)

    # -- checkpoints ------------------------------------------------------

    def _state(self, g):
        """Group g's C state: its LambState, m, v, v' (float32 views of
        its memory) and per layer c_avg, the last factor and s (lists)."""
        st = LambState()
        ptrs = [ctypes.c_void_p() for _ in range(6)]
        lib.obcomm_lamb_get_state(g.handle, ctypes.byref(st),
                                  *(ctypes.byref(q) for q in ptrs))
        arrays = [torch.frombuffer(
            (ctypes.c_float * g.count).from_address(q.value),
            dtype=torch.float32) for q in ptrs[:3]]
        nl = len(g.offsets) - 1
        per = [list((ctypes.c_double * nl).from_address(q.value))
               for q in ptrs[3:]]
        return st, arrays, per

    def state_dict(self):
        """torch's state dict with, per parameter, 'exp_avg', 'exp_avg_sq',
        'exp_avg_sq_fresh', 'lamb_coeff_freeze', 'last_factor' and
        'scaling_coeff' (DeepSpeed's names); "one_bit_lamb", the step, the
        stage and each group's rounds; and "obcomm", the snapshot set of
        the daemons' error feedback taken with it. A collective."""
        states = {id(g): self._state(g) for g in self._groups}

        def per_param(g, i, o, n):
            p, li = g.params[i], g.layer[i]
            _, (m, v, fresh), (cf, last, scale) = states[id(g)]
            return {"exp_avg": m[o:o + n].clone().view_as(p),
                    "exp_avg_sq": v[o:o + n].clone().view_as(p),
                    "exp_avg_sq_fresh": fresh[o:o + n].clone().view_as(p),
                    "lamb_coeff_freeze": 0.0 if li is None else cf[li],
                    "last_factor": 1.0 if li is None else last[li],
                    "scaling_coeff": 1.0 if li is None else scale[li]}
        st = states[id(self._groups[0])][0]
        return self._state_dict_with(per_param, {"one_bit_lamb": {
            "step": st.step, "frozen": st.stage != WARMUP,
            "scaled": st.stage == COMPRESSING,
            "rounds": [[s.rounds_fp32, s.rounds_1bit]
                       for s, _, _ in states.values()]}})

    def load_state_dict(self, state_dict):
        """Restores the moments, the per-layer ratios and scales, the step
        and the daemons' error feedback of the snapshot the dict names.
        Every rank calls it; it raises ObcommError on every rank when a
        node lacks the snapshot or holds it damaged."""
        # The C optimizers keep the settings they were made with.
        self._check_hyper(state_dict.get("param_groups", []))
        states, own = self._load_with(state_dict, "one_bit_lamb")
        need = ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh",
                "lamb_coeff_freeze", "last_factor", "scaling_coeff")
        for st in states:
            if not all(k in s for s in st for k in need):
                raise ValueError(f"load_state_dict: a parameter lacks one "
                                 f"of {need} (not a OneBitLamb state)")
        stage = WARMUP if not own["frozen"] else \
            COMPRESSING if own["scaled"] else FROZEN
        rounds = own.get("rounds") or [[0, 0]] * len(self._groups)
        for g, st, r in zip(self._groups, states, rounds):
            c = LambState(step=int(own["step"]), stage=stage,
                          rounds_fp32=int(r[0]), rounds_1bit=int(r[1]))
            arrays = [self._cat(st, k).contiguous() for k in need[:3]]
            if any(t.numel() != g.count for t in arrays):
                raise ValueError(f"load_state_dict: param group of {g.count} "
                                 f"elements, state of "
                                 f"{[t.numel() for t in arrays]}")
            per = [(ctypes.c_double * (len(g.offsets) - 1))(*(
                float(s[k]) for s, li in zip(st, g.layer) if li is not None))
                for k in need[3:]]
            rc = lib.obcomm_lamb_set_state(
                g.handle, ctypes.byref(c), *(t.data_ptr() for t in arrays),
                *(ctypes.addressof(x) for x in per))
            if rc != 0:
                raise ValueError(f"load_state_dict: step {c.step} at stage "
                                 f"{stage} with these per-layer values is "
                                 f"not a state a run reaches")
