"""1-bit LAMB (Li et al. 2021, arXiv 2104.06069) over obcomm, as DeepSpeed's
OnebitLamb runs it (runtime/fp16/onebit/lamb.py), on CPU tensors: one C
optimizer of libobcomm (obcomm_lamb_*, client/lamb.c) per param group."""

import ctypes
import os
import shutil
import struct
import tempfile

import torch

from ._flat import FlatOptimizer, check_adam_args
from ._lib import lib, LambConfig

__all__ = ["OneBitLamb"]

# obcomm_lamb_save's file (include/obcomm.h): magic, version, header
# bytes, count, layers, step, key, 11 f32 of the config, stage,
# freeze_step, fp32 and 1-bit rounds, snapshot, part bytes, part's node, 0.
_HEADER = struct.Struct("<8sIIQQqQ11fIqqqQQII")
_MAGIC, _VERSION = b"OBCMLAMB", 1
_CONFIG = ("lr", "beta1", "beta2", "eps", "weight_decay", "max_coeff",
           "min_coeff", "coeff_beta", "factor_max", "factor_min",
           "factor_threshold")
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

    Parameters must be float32 CPU tensors; every rank constructs the
    optimizer with the same parameters and arguments (checked) and starts
    from rank 0's parameters; no DDP. The gradients are only read (the
    warm-up averages a copy). Only lr may change between steps; a param
    group added later starts its own warm-up. state_dict() and
    load_state_dict() are collectives with OneBitAdam's semantics: a
    resumed run continues bit for bit, or every rank raises."""

    C = "lamb"
    NAME = "OneBitLamb"
    AUTO_MASK_RATIO = 0.01  # OneBitAdam's (OBCOMM_ADAM_AUTO_MASK_RATIO)
    HYPER = ("betas", "eps", "weight_decay", "max_coeff", "min_coeff")

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
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_coeff=max_coeff,
                        min_coeff=min_coeff)
        super().__init__(params, defaults, comm, key)

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

    def _save_group(self, g, d, snapshot):
        """Group g's C state through obcomm_lamb_save_ex (naming the
        snapshot taken for the dict): each parameter's state, the step,
        the stage and the rounds."""
        path = os.path.join(d, f"group{g.key}.lamb")
        with self.comm._locked():
            self.comm._check(lib.obcomm_lamb_save_ex(g.handle, path.encode(),
                                                     snapshot))
        with open(path, "rb") as f:
            raw = f.read()
        (magic, version, hbytes, count, layers, step, _key, *rest) = \
            _HEADER.unpack_from(raw)
        stage, fp32, onebit = rest[11], rest[13], rest[14]
        hs, nl = _HEADER.size, layers
        off_end = hs + 8 * (nl + 1)
        lay_end = off_end + 24 * nl
        end = lay_end + 12 * count
        if (magic != _MAGIC or version != _VERSION or hbytes != hs or
                count != g.count or nl != len(g.offsets) - 1 or
                len(raw) < end):
            raise ValueError(f"{path}: not the optimizer's file")
        per = struct.unpack_from(f"<{3 * nl}d", raw, off_end)
        flat = torch.frombuffer(bytearray(raw[lay_end:end]),
                                dtype=torch.float32)
        m, v, fresh = flat[:count], flat[count:2 * count], flat[2 * count:]
        states = []
        for p, (o, n), li in zip(g.params, g.spans, g.layer):
            cf, last, scale = (0.0, 1.0, 1.0) if li is None else \
                (per[li], per[nl + li], per[2 * nl + li])
            states.append({
                "exp_avg": m[o:o + n].clone().view_as(p),
                "exp_avg_sq": v[o:o + n].clone().view_as(p),
                "exp_avg_sq_fresh": fresh[o:o + n].clone().view_as(p),
                "lamb_coeff_freeze": cf, "last_factor": last,
                "scaling_coeff": scale})
        return states, step, stage, [fp32, onebit]

    def state_dict(self):
        """torch's state dict with, per parameter, 'exp_avg', 'exp_avg_sq',
        'exp_avg_sq_fresh', 'lamb_coeff_freeze', 'last_factor' and
        'scaling_coeff' (DeepSpeed's names); "one_bit_lamb", the step, the
        stage and each group's rounds; and "obcomm", the snapshot set of
        the daemons' error feedback taken with it. A collective."""
        info = self._snapshot()
        d = tempfile.mkdtemp(prefix="obcomm-lamb-")
        try:
            saved = [self._save_group(g, d, info["snapshot"])
                     for g in self._groups]
        finally:
            shutil.rmtree(d, ignore_errors=True)
        try:
            for g, (states, *_rest) in zip(self._groups, saved):
                for p, st in zip(g.params, states):
                    self.state[p] = st
            sd = super().state_dict()
        finally:
            self.state.clear()
        _, step, stage, _ = saved[0]
        sd["one_bit_lamb"] = {"step": step, "frozen": stage != WARMUP,
                              "scaled": stage == COMPRESSING,
                              "rounds": [r for *_rest, r in saved]}
        sd["obcomm"] = info
        return sd

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
        step = int(own["step"])
        stage = WARMUP if not own["frozen"] else \
            COMPRESSING if own["scaled"] else FROZEN
        rounds = own.get("rounds") or [[0, 0]] * len(self._groups)
        snapshot = int(state_dict["obcomm"]["snapshot"])
        d = tempfile.mkdtemp(prefix="obcomm-lamb-")
        try:
            for g, group, st, r in zip(self._groups, self.param_groups,
                                       states, rounds):
                path = os.path.join(d, f"group{g.key}.lamb")
                self._write_group(g, group, st, path, step, stage, r,
                                  snapshot)
                # The daemons' set is restored already (_load_with).
                with self.comm._locked():
                    self.comm._check(lib.obcomm_lamb_load_ex(
                        g.handle, path.encode(), 0))
                g.hyper = self._hyper(group)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def _write_group(self, g, group, st, path, step, stage, rounds,
                     snapshot):
        """A file for obcomm_lamb_load_ex from a param group's state."""
        cfg = self._config(group)
        nl = len(g.offsets) - 1
        per = [[], [], []]
        for s, li in zip(st, g.layer):
            if li is not None:
                per[0].append(float(s["lamb_coeff_freeze"]))
                per[1].append(float(s["last_factor"]))
                per[2].append(float(s["scaling_coeff"]))
        h = _HEADER.pack(_MAGIC, _VERSION, _HEADER.size, g.count, nl, step,
                         g.key, *(getattr(cfg, k) for k in _CONFIG), stage,
                         cfg.freeze_step, int(rounds[0]), int(rounds[1]),
                         snapshot, 0, 0, 0)
        with open(path, "wb") as f:
            f.write(h)
            f.write(struct.pack(f"<{nl + 1}Q", *g.offsets))
            for xs in per:
                f.write(struct.pack(f"<{nl}d", *xs))
            for name in ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"):
                f.write(self._cat(st, name).numpy().tobytes())
