"""What OneBitAdam, ZeroOneAdam and OneBitLamb share: each param group's
parameters and gradients in flat float32 shared-memory buffers (the tensors
re-pointed as views), the same construction checked on every rank, the
momentum mask, the C optimizers' lifetime, and checkpoints that pin the
daemons' error feedback (a snapshot set, its parts carried when the daemons
keep no state_dir)."""

import ctypes
import hashlib
import math
import weakref

import torch

from ._lib import lib
from .comm import Communicator, ObcommError, E_MISMATCH, E_NONFINITE
from . import _claims, _stage



# Steps after the freeze within which a NaN or Inf in a 1-bit average
# points to the freeze (docs/python.md, "When the 1-bit average meets a NaN").
NEAR_FREEZE = 500


def with_hint(err, hint):
    """err, or for a NaN/Inf in a 1-bit op an ObcommError of the same
    code whose message ends with `hint` (a string, or None for none)."""
    if err.code != E_NONFINITE or not hint:
        return err
    return ObcommError(err.code, f"{err.message}; {hint}")


def freeze_hint(name, step, freeze, arg="freeze_step"):
    """What a NaN/Inf in a 1-bit op at `step` suggests, when it is within
    NEAR_FREEZE steps of the freeze at `freeze`; else None."""
    after = step - freeze
    if not 0 < after <= NEAR_FREEZE:
        return None
    return (f"{name} step {step} is {after} step(s) after {arg} {freeze}: "
            f"the variance was likely frozen before it settled, or lr is "
            f"too high for this model; raise {arg} (a few hundred steps at "
            f"least) or lower lr")


def destroy_c(holders, comm):
    """Frees the C optimizer of each of `holders` (objects with handle,
    destroy and conn, as FlatOptimizer._own sets them; the connection
    destroys them itself when it closes first), then lets go of comm."""
    for h in holders:
        conn, h.conn = getattr(h, "conn", None), None
        if conn is None:
            continue
        with conn.lock:
            if h.handle is not None and conn.h is not None:
                h.destroy(h.handle)
            h.handle = None
            if h in conn.adams:
                conn.adams.remove(h)
    comm.close()


def release_on_collect(opt, holders, comm):
    """The finalizer of optimizer opt: destroy_c(holders, comm) at most
    once, when called (close()) or when opt is collected unclosed. An
    error in it, when run by the collector, is printed by weakref (never
    silently dropped). At exit the connections close on their own
    (comm.py's _close_all)."""
    fin = weakref.finalize(opt, destroy_c, holders, comm)
    fin.atexit = False
    return fin


# The parameter dtypes the optimizers train: float32 itself, float16 and bfloat16 over float32 master weights.
PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# DeepSpeed's (and torch.nn.utils.clip_grad_norm_'s) term in the clip
# coefficient max_grad_norm / (norm + 1e-6).
CLIP_EPS = 1e-6


def check_adam_args(lr, betas, eps, weight_decay, freeze_step, name):
    """ValueError for arguments no Adam-like optimizer takes (OneBitAdam,
    ZeroOneAdam, OneBitLamb); name is the freeze step's argument."""
    if not 0.0 <= lr:
        raise ValueError(f"invalid lr {lr}")
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ValueError(f"invalid betas {betas}")
    if not eps > 0.0:
        raise ValueError(f"invalid eps {eps}")
    if not weight_decay >= 0.0 or not freeze_step >= 0:
        raise ValueError(f"invalid weight_decay or {name}")


class Group:
    """A param group's flat buffers: p and g in shared memory, float32
    (the parameters and gradients are views into them, or, for a float16
    or bfloat16 model, p holds the master weights and m and gm the
    model's parameters and gradients in its dtype, and g their float32
    copy unless the optimizer's F32_GRADS is False); the optimizer adds
    its own."""

    def __init__(self):
        self.params = []
        self.spans = []     # (offset, numel) per parameter
        self.count = 0
        self.dtype = None   # the parameters' dtype, one per group
        self.p = self.g = None
        self.m = self.gm = None  # float16/bfloat16 model and gradients
        self.key = 0

    @property
    def mixed(self):
        return self.m is not None

    @property
    def model(self):
        """The flat buffer the parameters are views into."""
        return self.m if self.mixed else self.p

    @property
    def grads(self):
        """The flat buffer the gradients are views into."""
        return self.gm if self.mixed else self.g


class FlatOptimizer(torch.optim.Optimizer):
    """The base of OneBitAdam, ZeroOneAdam and OneBitLamb (not an
    optimizer alone): subclasses set NAME and C (libobcomm's optimizer:
    "adam", "zoadam", "lamb") and define _init_group(g, group), which
    creates the group's C optimizers and hands each to _own()."""

    NAME = "FlatOptimizer"
    C = None
    AUTO_MASK_RATIO = None  # the C optimizer's default
    # A param group's settings that the C optimizer takes at construction:
    # lr alone may change between steps.
    HYPER = ("betas", "eps", "weight_decay")
    # Whether a float16/bfloat16 group also keeps its gradients as float32
    # in shared memory (g.g), for a C optimizer that reads float32 only.
    F32_GRADS = True

    def __init__(self, params, defaults, comm, key, max_grad_norm=0.0):
        if not 0.0 <= max_grad_norm < math.inf:
            raise ValueError(f"invalid max_grad_norm {max_grad_norm}")
        self.max_grad_norm = float(max_grad_norm)
        # The optimizer holds its own share of the connection, so that it
        # outlives whichever of the process group, the caller's
        # Communicator and this optimizer is closed first.
        self.comm = comm._share() if comm is not None else Communicator()
        self.key = int(key)
        self._auto_ratio = self.AUTO_MASK_RATIO
        self._groups = []
        self._owned = []  # what holds a C optimizer (_own), in key order
        # close(), or the collection of an optimizer never closed, frees
        # the C optimizers and lets go of the connection.
        self._release = release_on_collect(self, self._owned, self.comm)
        self._claim = _claims.Claim(self, self.NAME)
        self._stage = _stage.track(self, self.NAME, *self._freeze())
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._setup(self.param_groups[-1])

    def _check_param(self, p):
        """TypeError for a parameter the optimizer does not train."""
        if p.device.type != "cpu" or p.dtype not in PARAM_DTYPES:
            raise TypeError(f"{self.NAME}: parameters must be float32, "
                            f"float16 or bfloat16 CPU tensors, not "
                            f"{p.dtype} on {p.device}")

    def _keys(self, g):
        """The daemons' keys of group g (sets g.key): one per group."""
        g.key = self.key + len(self._groups)
        return [g.key]

    def _setup(self, group):
        g = Group()
        for p in group["params"]:
            self._check_param(p)
            if g.dtype is None:
                g.dtype = p.dtype
            elif p.dtype != g.dtype:
                raise TypeError(
                    f"{self.NAME}: param group {len(self._groups)} mixes "
                    f"{g.dtype} and {p.dtype} (parameter {len(g.params)}); "
                    f"all parameters of a param group must share one dtype")
            g.params.append(p)
            g.spans.append((g.count, p.numel()))
            g.count += p.numel()
        if g.count == 0:
            raise ValueError(f"{self.NAME}: a param group with no elements")
        keys = self._keys(g)
        # Refused on every rank alike, before the first collective.
        _claims.take(self.comm._c(), self._claim, g.params, keys)
        self._agree(g)
        comm = self.comm
        # The parameters (masters) in shared memory, float32; a
        # float16/bfloat16 model and its gradients in private memory of
        # their own dtype.
        g.p = comm.empty(g.count)
        if g.dtype == torch.float32 or self.F32_GRADS:
            g.g = comm.empty(g.count)
        if g.dtype != torch.float32:
            g.m = torch.empty(g.count, dtype=g.dtype)
            g.gm = torch.zeros(g.count, dtype=g.dtype)
        _claims.claim_grads(self._claim, g.grads)
        with torch.no_grad():
            for p, (o, n) in zip(g.params, g.spans):
                g.p[o:o + n].copy_(p.reshape(-1))
        # Every rank starts from rank 0's parameters (as DDP does); a
        # float16/bfloat16 value converts exactly to float32 and back.
        comm.broadcast(g.p, root=0)
        if g.mixed:
            with torch.no_grad():
                g.m.copy_(g.p)
        for p, (o, n) in zip(g.params, g.spans):
            if p.grad is not None:
                g.grads[o:o + n].copy_(p.grad.reshape(-1))
            p.data = g.model[o:o + n].view_as(p)
            p.grad = g.grads[o:o + n].view_as(p)
        g.hyper = self._hyper(group)
        self._init_group(g, group)
        self._groups.append(g)

    def _differ(self, desc):
        """One allgather of a digest of desc (bytes): the ranks whose desc
        differs from rank 0's, the same list on every rank."""
        mine = torch.tensor([int.from_bytes(
            hashlib.blake2b(desc, digest_size=8).digest(), "little",
            signed=True)], dtype=torch.int64)
        every = torch.zeros(self.comm.size, dtype=torch.int64)
        self.comm._iallgather(every, mine, None).future.wait()
        return [r for r in range(self.comm.size) if every[r] != every[0]]

    def _agree(self, g):
        """Every rank must build the same groups (the daemons match a job's
        ops in the order they are issued): ObcommError on every rank
        naming the ranks whose parameter shapes or key differ."""
        differ = self._differ(repr((self.NAME, g.key, [
            tuple(p.shape) for p in g.params])).encode())
        if differ:
            raise ObcommError(
                E_MISMATCH,
                f"{self.NAME}: param group {len(self._groups)} on rank(s) "
                f"{differ} differs from rank 0's (rank {self.comm.rank}: "
                f"{len(g.params)} parameters, {g.count} elements, key "
                f"{g.key}); every rank must construct the optimizer with "
                f"the same parameters, param groups and key")

    def _gather_grads(self, g):
        """Points every p.grad back into g.grads (copying a gradient that
        torch put elsewhere, e.g. after zero_grad(set_to_none=True)); a
        float16/bfloat16 group's gradients then go into g.g as float32."""
        with torch.no_grad():
            self._gather(g)
            if g.mixed:
                g.g.copy_(g.gm)

    def _gather(self, g):
        with torch.no_grad():
            for p, (o, n) in zip(g.params, g.spans):
                view = g.grads[o:o + n]
                if p.grad is None:
                    view.zero_()
                elif p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad.reshape(-1))
                else:
                    continue
                p.grad = view.view_as(p)

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (their views into the shared
        buffer stay); set_to_none=True sets them to None as torch does."""
        for g in self._groups:
            if set_to_none:
                for p in g.params:
                    p.grad = None
            else:
                g.grads.zero_()
                for p, (o, n) in zip(g.params, g.spans):
                    p.grad = g.grads[o:o + n].view_as(p)

    # -- the step -----------------------------------------------------------

    def _hyper(self, group):
        return tuple(tuple(group[k]) if k == "betas" else group[k]
                     for k in self.HYPER)

    def _check_hyper(self, groups):
        """ValueError unless `groups` (param groups, or a state dict's)
        hold the settings the C optimizers were made with."""
        for g, group in zip(self._groups, groups):
            now = self._hyper(group)
            if now != g.hyper:
                raise ValueError(
                    f"{self.NAME}: only lr may change after construction "
                    f"({dict(zip(self.HYPER, g.hyper))} became "
                    f"{dict(zip(self.HYPER, now))})")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._claim.checked:
            _claims.check_first_step(
                self._claim, [p for g in self._groups for p in g.params])
        self._check_hyper(self.param_groups)
        comm = self.comm
        step = self.steps + 1
        for g in self._groups:
            self._gather_grads(g)
        if self.max_grad_norm > 0:
            self._clip()
        for g, group in zip(self._groups, self.param_groups):
            self._c("set_lr")(g.handle, float(group["lr"]))
            try:
                with comm._locked():
                    comm._check(self._c("step")(
                        g.handle, ctypes.c_void_p(g.p.data_ptr()),
                        ctypes.c_void_p(g.g.data_ptr())))
            except ObcommError as e:
                raise with_hint(e, self._nonfinite_hint(step)) from None
            if g.mixed:
                g.m.copy_(g.p)  # rounded to nearest even
        self._stage.update(step, self.stage, self._stage_text)
        return loss

    def _clip(self):
        """DeepSpeed's gradient_clipping on this rank's own gradient (the
        optimizer averages inside its step, so there is no average
        before it): coef = max_grad_norm / (norm + 1e-6) over every param
        group's float32 gradient (sums of squares in double, in group
        order), applied when below 1."""
        sumsq = sum(float(g.g.double().square().sum()) for g in self._groups)
        coef = self.max_grad_norm / (math.sqrt(sumsq) + CLIP_EPS)
        if coef < 1.0:
            for g in self._groups:
                g.g.mul_(coef)

    def _freeze(self):
        """(the name of the freeze argument, its value), for the
        never-compressed warning."""
        raise NotImplementedError

    def _nodes(self):
        return self.comm.size // self.comm.local_size

    def _bytes(self, fn):
        """fn(count, nodes) summed over the groups (one op each)."""
        return sum(fn(g.count, self._nodes()) for g in self._groups)

    def _nonfinite_hint(self, step):
        """What a NaN or Inf in step `step`'s 1-bit average suggests, or
        None (the subclass's)."""
        return None

    # -- what the C optimizers count and mask -----------------------------

    def _c(self, name):
        """libobcomm's function `name` of the subclass's optimizer
        (obcomm_<C>_<name>)."""
        return getattr(lib, f"obcomm_{self.C}_{name}")

    @property
    def steps(self):
        """Steps taken."""
        first = self._owned[0] if self._owned else None
        if first is None or first.handle is None:
            return 0
        return self._c("steps")(first.handle)

    @property
    def rounds(self):
        """The collectives the steps issued over every param group:
        {"fp32": n, "1bit": n}."""
        f, o = ctypes.c_long(), ctypes.c_long()
        out = {"fp32": 0, "1bit": 0}
        for g in self._groups:
            self._c("rounds")(g.handle, ctypes.byref(f), ctypes.byref(o))
            out["fp32"] += f.value
            out["1bit"] += o.value
        return out

    def set_auto_mask(self, ratio):
        """The automatic mask's ratio (the class's AUTO_MASK_RATIO by
        default, as the C optimizer's): after each variance update
        (ZeroOneAdam) or from the frozen variance (OneBitLamb) coordinate
        i of a param group is held when v_i <= (ratio * sqrt(mean v))^2;
        0 masks only coordinates whose variance is exactly 0, a negative
        ratio turns the mask off."""
        self._auto_ratio = float(ratio)
        for g in self._groups:
            self._mask(g)

    def _mask(self, g):
        self._c("set_auto_mask")(g.handle, self._auto_ratio)

    def masked(self):
        """Coordinates the mask holds now."""
        return sum(self._c("masked")(h.handle) for h in self._owned
                   if h.handle is not None)

    # -- checkpoints ------------------------------------------------------

    def _layout(self):
        """The "obcomm" entry's description of the C optimizers: the
        keys, one per group."""
        return "keys", [g.key for g in self._groups]

    def _snapshot(self):
        """A collective: every daemon saves the run's error feedback; the
        dict's "obcomm" entry naming it (with this node's part when its
        daemon keeps no state_dir)."""
        snapshot = self.comm.save_1bit()
        name, layout = self._layout()
        info = {"snapshot": int(snapshot), "job": self.comm.job,
                name: layout}
        part = self.comm._export_1bit(snapshot)
        if part is not None:
            info["part"], info["node"] = part
        return info

    def _state_dict_with(self, per_param, extra):
        """torch's state dict with per_param(g, i, o, n) -> {name: tensor}
        as each parameter's state, "obcomm" (a snapshot, taken here) and
        the optimizer's own entries `extra`. A run still in the warm-up is
        told so (one WARNING on logger "obcomm")."""
        self._stage.warmup_note("state_dict() taken")
        info = self._snapshot()
        for g in self._groups:
            for i, (p, (o, n)) in enumerate(zip(g.params, g.spans)):
                self.state[p] = per_param(g, i, o, n)
                if g.mixed:
                    self.state[p]["master"] = \
                        g.p[o:o + n].clone().view_as(p)
        try:
            sd = super().state_dict()
        finally:
            self.state.clear()
        sd.update(extra)
        sd["obcomm"] = info
        return sd

    def _load_with(self, state_dict, entry):
        """The first half of load_state_dict: checks the dict, loads the
        param groups, restores the daemons' error feedback of the dict's
        snapshot (raising on every rank if a node lacks it) and returns,
        per group, each parameter's saved state and the dict's `entry`."""
        info = state_dict.get("obcomm")
        own = state_dict.get(entry)
        if not isinstance(info, dict) or not info.get("snapshot") or \
                not isinstance(own, dict):
            raise ValueError(f"load_state_dict: not a {self.NAME} state "
                             f"dict (no \"obcomm\" snapshot or \"{entry}\")")
        if list(info.get("keys", [])) != [g.key for g in self._groups]:
            raise ValueError(
                f"load_state_dict: the state dict was saved with keys "
                f"{info.get('keys')}, this optimizer has "
                f"{[g.key for g in self._groups]}")
        states = self._load_groups(state_dict)
        self.comm._restore_1bit(int(info["snapshot"]), info.get("part"),
                                info.get("node"))
        for g, st in zip(self._groups, states):
            if g.mixed:
                self._load_masters(g, st)
        return states, own

    def _load_groups(self, state_dict):
        """Loads the dict's param groups and returns, per group, each
        parameter's saved state (a dict). torch's own load would cast the
        state to each parameter's dtype (rounding a bfloat16 model's
        float32 moments and masters) and re-key it: only the param groups
        go through it."""
        saved = state_dict["state"]
        ids = [i for grp in state_dict["param_groups"] for i in grp["params"]]
        super().load_state_dict({"state": {},
                                 "param_groups": state_dict["param_groups"]})
        byp = {id(p): saved.get(i, {}) for p, i in zip(
            (p for grp in self.param_groups for p in grp["params"]), ids)}
        return [[byp[id(p)] for p in g.params] for g in self._groups]

    @staticmethod
    def _load_masters(g, st):
        """A float16/bfloat16 group's masters from the state ('master'),
        the model rounded from them; without masters in the dict (saved
        from a float32 model) they become the current parameters."""
        with torch.no_grad():
            if all("master" in s for s in st):
                g.p.copy_(torch.cat([s["master"].reshape(-1).float()
                                     for s in st]))
            else:
                g.p.copy_(g.m)
            g.m.copy_(g.p)

    @staticmethod
    def _cat(states, name):
        return torch.cat([s[name].reshape(-1).float() for s in states])

    # -- lifetime ---------------------------------------------------------

    def _own(self, g, handle, destroy):
        """g's (a group's or a bucket's) C optimizer `handle`, freed by
        `destroy`: by the optimizer's close() or finalizer, or by the
        connection before its handle closes (whichever holder closes it
        last)."""
        g.handle, g.destroy, g.conn = handle, destroy, self.comm._c()
        with g.conn.lock:
            g.conn.adams.append(g)
        self._owned.append(g)

    def close(self):
        """Frees the C optimizers and lets go of the optimizer's share of
        the connection. The parameters keep their values: they are copied
        out of shared memory first. Idempotent."""
        if self.comm is None:
            return
        self._stage.at_end()
        _claims.release(self._claim)
        with torch.no_grad():
            for g in self._groups:
                for p in g.params:
                    p.data = p.data.clone()
                    p.grad = None
        self._release()
        self.comm = None
