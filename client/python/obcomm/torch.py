"""obcomm for PyTorch: OneBitAdam, a torch.optim.Optimizer over libobcomm's
1-bit Adam; allreduce_hook, a DDP communication hook; and, registered by
importing this module, the torch.distributed backend "obcomm"
(backend.py)."""

import ctypes
import os
import shutil
import struct
import tempfile

import torch

from ._lib import lib, AdamConfig
from .comm import Communicator, ObcommError, E_INVAL
from .backend import ProcessGroupObcomm, process_group

# The header of obcomm_adam_save's file, field by field at fixed offsets,
# little-endian (client/adam.c and obcomm.h give the layout): magic,
# version, header bytes, count, step, key, lr, beta1, beta2, eps,
# weight_decay, bias_correction, freeze_step, snapshot, part bytes, part's
# node, reserved. No native struct: the file is a format, not memory.
_ADAM_HEADER = struct.Struct("<8sIIQqQfffffIqQQII")
_ADAM_MAGIC, _ADAM_VERSION = b"OBCMADAM", 3
assert _ADAM_HEADER.size == 96

__all__ = ["OneBitAdam", "allreduce_hook", "ProcessGroupObcomm"]

# OBCOMM_ADAM_AUTO_MASK_RATIO of include/obcomm.h.
AUTO_MASK_RATIO = 0.01

_HYPER = ("betas", "eps", "weight_decay", "freeze_step", "bias_correction")


class _Group:
    """One param group's flat shared buffers and its C optimizer."""

    def __init__(self):
        self.params = []     # the group's parameters, in order
        self.spans = []      # (offset, numel) of each in the flat buffers
        self.count = 0
        self.flat_p = None   # shared memory: the parameters
        self.flat_g = None   # shared memory: the gradients
        self.keep = None     # explicit mask (uint8 tensor) or None
        self.handle = None   # obcomm_adam_t *
        self.key = 0
        self.hyper = None    # the hyperparameters the C optimizer has
        self.conn = None     # the connection the C optimizer borrows


class OneBitAdam(torch.optim.Optimizer):
    """1-bit Adam (Tang et al. 2021) as DeepSpeed runs it, over obcomm.

    Warm-up (step < freeze_step): gradients are averaged over all ranks in
    full precision, then Adam. From freeze_step on the variance is frozen
    and only the momentum crosses the network, 1 bit per element plus a
    scale, with error feedback kept by the daemons. As DeepSpeed: no bias
    correction unless asked, weight decay added to the update. Coordinates
    whose frozen variance is 0 (their gradient was exactly 0 through the
    warm-up) or tiny have their momentum masked to 0 in the compression
    stage, so that with eps = 1e-8 they do not move by lr * scale / eps
    (set_auto_mask, set_mask; docs/convergence.md has the measurements).

    comm=None uses obcomm.Communicator(): the process's connection, shared
    with the process group when torch.distributed.init_process_group
    ("obcomm") ran. Construct it on every rank with the same parameters
    (shapes) and arguments; it broadcasts rank 0's parameters so every
    rank starts equal, and it averages the gradients itself (no DDP
    needed). Each param
    group's parameters and gradients are moved into one flat float32
    shared-memory buffer each and re-pointed as views into it; the
    gradients stay those views (zero_grad zeroes them in place).

    Only lr may change between steps (schedulers work); the other
    hyperparameters are fixed at construction or by load_state_dict.
    state_dict() and load_state_dict() are collectives: every rank calls
    them. state_dict() has every daemon save the run's error feedback as a
    snapshot set and names it in the dict ("obcomm": {"snapshot", "job"});
    load_state_dict() brings every daemon back to that set, so a resumed
    run continues bit for bit, or raises on every rank naming the node
    that lacks it or holds it damaged. Without a state_dir the daemons
    keep only the newest set of a job, in memory, until they restart.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, freeze_step=100000, bias_correction=False,
                 comm=None, key=1):
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        if not eps > 0.0:
            raise ValueError(f"invalid eps {eps}")
        if not weight_decay >= 0.0 or not freeze_step >= 0:
            raise ValueError("invalid weight_decay or freeze_step")
        # The optimizer holds its own share of the connection, so that it
        # outlives whichever of the process group, the caller's
        # Communicator and this optimizer is closed first.
        self.comm = comm._share() if comm is not None else Communicator()
        self.key = int(key)
        self._groups = []
        self._auto_ratio = AUTO_MASK_RATIO
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, freeze_step=int(freeze_step),
                        bias_correction=bool(bias_correction))
        super().__init__(params, defaults)

    # -- setup ----------------------------------------------------------------

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._setup(self.param_groups[-1])

    def _config(self, group):
        k = AdamConfig()
        k.lr = group["lr"]
        k.beta1, k.beta2 = group["betas"]
        k.eps = group["eps"]
        k.weight_decay = group["weight_decay"]
        k.freeze_step = int(group["freeze_step"])
        k.bias_correction = int(bool(group["bias_correction"]))
        return k

    def _setup(self, group):
        g = _Group()
        g.key = self.key + len(self._groups)
        for p in group["params"]:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError("OneBitAdam: parameters must be float32 CPU "
                                f"tensors, not {p.dtype} on {p.device}")
            g.params.append(p)
            g.spans.append((g.count, p.numel()))
            g.count += p.numel()
        if g.count == 0:
            raise ValueError("OneBitAdam: a param group with no elements")
        comm = self.comm
        g.flat_p = comm.empty(g.count)
        g.flat_g = comm.empty(g.count)
        with torch.no_grad():
            for p, (o, n) in zip(g.params, g.spans):
                g.flat_p[o:o + n].copy_(p.reshape(-1))
                if p.grad is not None:
                    g.flat_g[o:o + n].copy_(p.grad.reshape(-1))
        # Every rank starts from rank 0's parameters (as DDP does).
        comm.broadcast(g.flat_p, root=0)
        for p, (o, n) in zip(g.params, g.spans):
            p.data = g.flat_p[o:o + n].view_as(p)
            p.grad = g.flat_g[o:o + n].view_as(p)
        h = ctypes.c_void_p()
        cfg = self._config(group)
        with comm._locked() as ch:
            comm._check(lib.obcomm_adam_create(ch, g.key, g.count,
                                               ctypes.byref(cfg),
                                               ctypes.byref(h)))
        g.handle = h
        g.conn = comm._c()
        with g.conn.lock:
            g.conn.adams.append(g)
        g.hyper = tuple(group[k] for k in _HYPER)
        lib.obcomm_adam_set_auto_mask(h, self._auto_ratio)
        self._groups.append(g)

    def _repoint(self, g):
        """Puts parameters and gradients back into the flat buffers if the
        user replaced a .data or a .grad (one copy each, then views again)."""
        with torch.no_grad():
            for p, (o, n) in zip(g.params, g.spans):
                pv = g.flat_p[o:o + n]
                if p.data_ptr() != pv.data_ptr():
                    pv.copy_(p.reshape(-1))
                    p.data = pv.view_as(p)
                gv = g.flat_g[o:o + n]
                if p.grad is None:
                    gv.zero_()
                    p.grad = gv.view_as(p)
                elif p.grad.data_ptr() != gv.data_ptr():
                    gv.copy_(p.grad.reshape(-1))
                    p.grad = gv.view_as(p)

    # -- the optimizer ----------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        comm = self.comm
        for g, group in zip(self._groups, self.param_groups):
            hyper = tuple(group[k] for k in _HYPER)
            if hyper != g.hyper:
                raise ValueError(
                    "OneBitAdam: only lr may change after construction "
                    f"({dict(zip(_HYPER, g.hyper))} became "
                    f"{dict(zip(_HYPER, hyper))})")
            self._repoint(g)
            lib.obcomm_adam_set_lr(g.handle, float(group["lr"]))
            with comm._locked():
                comm._check(lib.obcomm_adam_step(
                    g.handle, ctypes.c_void_p(g.flat_p.data_ptr()),
                    ctypes.c_void_p(g.flat_g.data_ptr())))
        return loss

    def zero_grad(self, set_to_none=False):
        """Zeroes every gradient in place (one memset per group); the
        gradients stay views into the shared buffer whatever set_to_none
        says."""
        for g in self._groups:
            g.flat_g.zero_()
            for p, (o, n) in zip(g.params, g.spans):
                if p.grad is None or p.grad.data_ptr() != g.flat_g[o].data_ptr():
                    p.grad = g.flat_g[o:o + n].view_as(p)

    @property
    def steps(self):
        """Steps taken (the C optimizer's count, the same in every group)."""
        return lib.obcomm_adam_steps(self._groups[0].handle) if self._groups else 0

    # -- the mask ---------------------------------------------------------------

    def set_auto_mask(self, ratio):
        """The automatic mask: a coordinate is masked in the compression
        stage when sqrt(v) <= ratio * sqrt(mean v) over its group's frozen
        v. True: the default ratio (AUTO_MASK_RATIO, as the C library);
        a number: that ratio (0 masks only v == 0); False: no automatic
        mask (the ablation). An explicit mask (set_mask) still applies."""
        if ratio is True:
            ratio = AUTO_MASK_RATIO
        elif ratio is False or ratio is None:
            ratio = -1.0
        self._auto_ratio = float(ratio)
        for g in self._groups:
            lib.obcomm_adam_set_auto_mask(g.handle, self._auto_ratio)

    def set_mask(self, param, keep):
        """An explicit mask for `param` (DeepSpeed's exp_avg_mask): `keep`
        has param's shape, nonzero keeps a coordinate, 0 holds its momentum
        at 0 in the compression stage. The rest of the param group is kept
        (the automatic mask is then off for that group). keep=None returns
        the group to the automatic mask. Every rank sets the same mask."""
        for g in self._groups:
            for p, (o, n) in zip(g.params, g.spans):
                if p is not param:
                    continue
                if keep is None:
                    g.keep = None
                    with self.comm._locked():
                        self.comm._check(lib.obcomm_adam_set_mask(g.handle,
                                                                  None))
                    return
                keep = torch.as_tensor(keep)
                if keep.shape != p.shape:
                    raise ValueError(f"set_mask: mask shape {tuple(keep.shape)}"
                                     f" is not the parameter's {tuple(p.shape)}")
                if g.keep is None:
                    g.keep = torch.ones(g.count, dtype=torch.uint8)
                g.keep[o:o + n] = (keep.reshape(-1) != 0).to(torch.uint8)
                with self.comm._locked():
                    self.comm._check(lib.obcomm_adam_set_mask(
                        g.handle, ctypes.c_void_p(g.keep.data_ptr())))
                return
        raise ValueError("set_mask: not a parameter of this optimizer")

    def masked(self):
        """Coordinates held at 0 by the mask in the compression stage."""
        return sum(lib.obcomm_adam_masked(g.handle) for g in self._groups)

    # -- checkpoints ------------------------------------------------------------

    def _save_group(self, g, d):
        path = os.path.join(d, f"group{g.key}.adam")
        with self.comm._locked():
            self.comm._check(lib.obcomm_adam_save(g.handle, path.encode()))
        with open(path, "rb") as f:
            raw = f.read()
        hs = _ADAM_HEADER.size
        (magic, version, hbytes, count, step, _key, *_cfg, snapshot,
         part_bytes, part_node, _reserved) = _ADAM_HEADER.unpack_from(raw)
        end = hs + 8 * g.count
        if (magic != _ADAM_MAGIC or version != _ADAM_VERSION or
                hbytes != hs or count != g.count or
                len(raw) != end + part_bytes):
            raise ObcommError(E_INVAL, f"{path}: not the optimizer's file")
        flat = torch.frombuffer(bytearray(raw[hs:end]), dtype=torch.float32)
        part = raw[end:] if part_bytes else None
        return (step, flat[:g.count], flat[g.count:], snapshot, part,
                part_node)

    def state_dict(self):
        """torch's state dict, per parameter 'step', 'exp_avg' and
        'exp_avg_sq', plus "obcomm": the snapshot set of the daemons' error
        feedback taken with it ({"snapshot": id, "job": name}), and, when
        this node's daemon keeps no state_dir, this node's part of it
        ("part": bytes, "node": its node), which a load after a restart of
        the daemons needs. A collective; raises on every rank unless every
        node saved."""
        d = tempfile.mkdtemp(prefix="obcomm-adam-")
        snapshot, part, node = 0, None, 0
        try:
            for g in self._groups:
                step, m, v, snapshot, part, node = self._save_group(g, d)
                for p, (o, n) in zip(g.params, g.spans):
                    self.state[p] = {
                        "step": torch.tensor(float(step)),
                        "exp_avg": m[o:o + n].clone().view_as(p),
                        "exp_avg_sq": v[o:o + n].clone().view_as(p)}
        finally:
            shutil.rmtree(d, ignore_errors=True)
        sd = super().state_dict()
        # The last group's snapshot holds every key of the job.
        sd["obcomm"] = {"snapshot": int(snapshot), "job": self.comm.job}
        if part is not None:
            sd["obcomm"]["part"] = part
            sd["obcomm"]["node"] = int(node)
        return sd

    def load_state_dict(self, state_dict):
        """Restores step, momentum, variance and hyperparameters of every
        group, and the daemons' error feedback of the snapshot the dict
        names: the run continues bit for bit. Every rank calls it; it
        raises ObcommError on every rank when a node lacks the snapshot or
        holds it damaged (the run's error feedback then restarts at zero
        on every node, and the run cannot continue)."""
        info = state_dict.get("obcomm")
        if not isinstance(info, dict) or not info.get("snapshot"):
            raise ValueError("load_state_dict: no \"obcomm\" snapshot in the "
                             "state dict (not saved by OneBitAdam.state_dict)")
        snapshot = int(info["snapshot"])
        part = info.get("part")
        state_dict = {k: v for k, v in state_dict.items() if k != "obcomm"}
        super().load_state_dict(state_dict)
        d = tempfile.mkdtemp(prefix="obcomm-adam-")
        try:
            for g, group in zip(self._groups, self.param_groups):
                st = [self.state.get(p, {}) for p in g.params]
                if not all("exp_avg" in s for s in st):
                    raise ValueError("load_state_dict: a parameter has no "
                                     "exp_avg (not a OneBitAdam state)")
                steps = {int(s["step"]) for s in st}
                if len(steps) != 1:
                    raise ValueError(f"load_state_dict: steps differ {steps}")
                cfg = self._config(group)
                h = _ADAM_HEADER.pack(
                    _ADAM_MAGIC, _ADAM_VERSION, _ADAM_HEADER.size, g.count,
                    steps.pop(), g.key, cfg.lr, cfg.beta1, cfg.beta2,
                    cfg.eps, cfg.weight_decay, cfg.bias_correction,
                    cfg.freeze_step, snapshot,
                    len(part) if part is not None else 0,
                    int(info["node"]) if part is not None else 0, 0)
                m = torch.cat([s["exp_avg"].reshape(-1).float() for s in st])
                v = torch.cat([s["exp_avg_sq"].reshape(-1).float() for s in st])
                path = os.path.join(d, f"group{g.key}.adam")
                with open(path, "wb") as f:
                    f.write(h)
                    f.write(m.numpy().tobytes())
                    f.write(v.numpy().tobytes())
                    if part is not None:
                        f.write(part)
                with self.comm._locked():
                    self.comm._check(lib.obcomm_adam_load(g.handle,
                                                          path.encode()))
                g.hyper = tuple(group[k] for k in _HYPER)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        # The C optimizer holds the state; the per-parameter copies only
        # exist to be saved.
        self.state.clear()

    # -- lifetime -----------------------------------------------------------------

    def close(self):
        """Frees the C optimizers and lets go of the connection (which
        stays open while the process group or a Communicator holds it).
        Parameters keep their values: they are copied out of shared memory
        first. Idempotent."""
        for g in self._groups:
            if g.handle is not None:
                with torch.no_grad():
                    for p in g.params:
                        p.data = p.data.clone()
                        p.grad = None
                self._destroy(g)
        self._groups = []
        self.comm.close()

    def _destroy(self, g):
        # The connection destroys its C optimizers before its handle
        # closes (g.handle is None then), whichever holder closed it.
        conn = g.conn
        with conn.lock:
            if g.handle is not None and conn.h is not None:
                lib.obcomm_adam_destroy(g.handle)
            g.handle = None
            if g in conn.adams:
                conn.adams.remove(g)

    def __del__(self):
        try:
            for g in self._groups:
                if g.handle is not None:
                    self._destroy(g)
            self.comm.close()
        except Exception:
            pass


def _hook_comm(state):
    if isinstance(state, Communicator):
        return state
    if isinstance(state, ProcessGroupObcomm):
        return state.comm
    if state is None:
        pg = process_group()
        if pg is not None:
            return pg.comm
        raise ValueError("allreduce_hook: with state None it needs "
                         "torch.distributed.init_process_group(\"obcomm\"); "
                         "else pass an obcomm.Communicator as the state")
    raise TypeError(f"allreduce_hook: the state is {type(state).__name__}; "
                    "want None, the obcomm process group or an "
                    "obcomm.Communicator")


def allreduce_hook(state, bucket):
    """DDP communication hook: averages each gradient bucket over obcomm
    (fp32 ring between the nodes, exact inside a node) without blocking:
    it returns as soon as the bucket is sent, and the connection's progress
    thread completes the future when the daemon answers, so buckets cross
    the network while backward computes the next ones.

        model.register_comm_hook(None, obcomm.torch.allreduce_hook)

    state: None or the obcomm process group (its connection), or an
    obcomm.Communicator (DDP over another backend, e.g. Gloo). The bucket
    is staged through a shared-memory buffer of the connection.
    """
    comm = _hook_comm(state)
    t = bucket.buffer()
    return comm._iallreduce(t, "avg", t).future
