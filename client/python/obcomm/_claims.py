"""What an obcomm optimizer holds alone, and the checks that refuse a second
user of it, each naming what to do instead:

- its parameters: a second optimizer (obcomm's or torch's) on them would
  update them twice per step;
- its keys on the daemons (one error feedback per job and key): a second
  optimizer or a Communicator's allreduce_1bit / reset_1bit on one of them
  corrupts both;
- its gradients: the optimizer averages them itself, so DDP (with any comm
  hook, obcomm.torch.allreduce_hook too) or a Communicator collective on
  them averages twice, and DDP's copy races the optimizer's sends.

Every check is local and sees the same thing on every rank of a job that
runs one script (DDP cannot wrap the model on some ranks only: its
constructor is a collective), so every rank refuses at the same call."""

import gc
import threading
import weakref

from ._lazy import torch

_lock = threading.Lock()
_owners = {}  # id(parameter) -> (weakref to it, its Claim)


class Claim:
    """One optimizer's parameters, keys and gradient buffers."""

    def __init__(self, opt, name):
        self.opt = weakref.ref(opt)
        self.name = name
        self.params = []  # ids of the parameters claimed
        self.keys = []    # the daemons' keys, in order
        self.grads = []   # (first byte, end byte) of each gradient buffer
        self.conn = None
        self.checked = False  # the first step's scan ran

    def alive(self):
        return self.opt() is not None

    def describe(self):
        keys = self.keys
        if not keys:
            return self.name
        span = f"key {keys[0]}" if len(keys) == 1 else \
            f"keys {keys[0]}..{keys[-1]}"
        return f"{self.name} ({span})"


def _shape(p):
    return tuple(p.shape)


def take(conn, claim, params, keys):
    """Claims `params` and the daemons' `keys` of the connection's job for
    `claim`; ValueError, claiming nothing, when another live optimizer
    holds one of them."""
    keys = list(keys)
    with _lock:
        for i, p in enumerate(params):
            held = _owners.get(id(p))
            if held is None or held[0]() is not p or not held[1].alive() \
                    or held[1] is claim:
                continue
            raise ValueError(
                f"{claim.name}: parameter {i} ({_shape(p)}) is already "
                f"trained by {held[1].describe()}; each parameter needs one "
                f"obcomm optimizer, or two would update it and average its "
                f"gradient twice per step: close() the other optimizer "
                f"first, or give each its own parameters")
        live = [c for c in conn.claims if c.alive() and c is not claim]
        for c in live:
            both = sorted(set(keys) & set(c.keys))
            if both:
                free = max(k for x in live for k in x.keys) + 1
                raise ValueError(
                    f"{claim.name}: key {both[0]} of job {conn.job!r} is "
                    f"already {c.describe()}'s; the daemons keep one error "
                    f"feedback per job and key, which two optimizers would "
                    f"corrupt: construct this one with key={free} or above "
                    f"(it takes {len(keys)} key(s) from there)")
        for p in params:
            _owners[id(p)] = (weakref.ref(p), claim)
            claim.params.append(id(p))
        conn.claims = live + [claim]
        claim.conn = conn
        claim.keys.extend(keys)


def claim_grads(claim, t):
    """Claims the memory of gradient buffer t (contiguous)."""
    start = t.data_ptr()
    claim.grads.append((start, start + t.numel() * t.element_size()))


def release(claim):
    """Lets go of everything `claim` holds. Idempotent."""
    with _lock:
        for i in claim.params:
            held = _owners.get(i)
            if held is not None and held[1] is claim:
                del _owners[i]
        claim.params = []
        if claim.conn is not None:
            claim.conn.claims = [c for c in claim.conn.claims
                                 if c is not claim]
            claim.conn = None
        claim.grads = []


def _span(t):
    """[first byte, end byte) of what t's elements cover."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def check_tensor(conn, t, what):
    """ValueError when collective `what` of a Communicator would write t,
    which lies in a live optimizer's gradients."""
    claims = conn.claims
    if not claims or not isinstance(t, torch.Tensor) or \
            t.device.type != "cpu":
        return
    lo, hi = _span(t)
    for c in claims:
        if c.alive() and any(lo < e and s < hi for s, e in c.grads):
            raise ValueError(
                f"obcomm: {what} on a gradient of {c.describe()}: the "
                f"optimizer averages its gradients itself in step(), so "
                f"this would average them twice; drop this collective "
                f"(to accumulate gradients over several backward passes "
                f"use the optimizer alone, or OneBitAdam's no_sync())")


def check_key(conn, key, what):
    """ValueError when `what` (allreduce_1bit, reset_1bit) names a key a
    live optimizer of the job holds."""
    for c in conn.claims:
        if c.alive() and int(key) in c.keys:
            raise ValueError(
                f"obcomm: {what} with key {int(key)} of job {conn.job!r}, "
                f"which is {c.describe()}'s: the daemons keep one error "
                f"feedback per job and key, and this would corrupt the "
                f"optimizer's; use a key outside every optimizer's range")


def _is_allreduce_hook(hook):
    hook = getattr(hook, "func", hook)  # a functools.partial
    return getattr(hook, "__module__", None) == "obcomm.torch" and \
        getattr(hook, "__name__", None) == "allreduce_hook"


def check_first_step(claim, params):
    """Once, at the optimizer's first step (or first gradient hook): raises
    RuntimeError when DDP wraps a module with one of `params`, or another
    torch optimizer holds one. gc.get_objects() is scanned once: 80 ms
    for the 165 000 objects of a process with torch 2.13 imported, on a
    busy 2-core machine."""
    if claim.checked:
        return
    claim.checked = True
    ids = {id(p) for p in params}
    opt = claim.opt()
    ddp_type = torch.nn.parallel.DistributedDataParallel
    # type(o), not isinstance: the latter reads o.__class__, which some
    # objects compute (torch.distributed.reduce_op warns that it is
    # deprecated). Each type is judged once: a process holds a few hundred
    # types over a hundred thousand objects.
    kinds = {}
    for o in gc.get_objects():
        t = type(o)
        kind = kinds.get(t)
        if kind is None:
            kind = kinds[t] = "ddp" if issubclass(t, ddp_type) else \
                "opt" if issubclass(t, torch.optim.Optimizer) else ""
        if not kind:
            continue
        if kind == "ddp":
            mod = getattr(o, "module", None)
            if mod is None or not any(
                    id(p) in ids for p in mod.parameters()):
                continue
            hooks = [h for h, _ in getattr(o, "_comm_hooks", ())]
            if any(_is_allreduce_hook(h) for h in hooks):
                how = ("torch.nn.parallel.DistributedDataParallel with "
                       "obcomm.torch.allreduce_hook")
                fix = ("allreduce_hook is for DDP with torch's own "
                       "optimizers (torch.optim.Adam); with "
                       f"{claim.name} drop DDP and its hook")
            else:
                how = "torch.nn.parallel.DistributedDataParallel"
                fix = "drop the DDP wrapper"
            raise RuntimeError(
                f"{claim.name}: the model is wrapped in {how}, which "
                f"averages the gradients that {claim.name} averages itself: "
                f"every step would average them twice, and DDP's copy into "
                f"the gradients races the optimizer's sends. {fix[0].upper()}"
                f"{fix[1:]} and pass the bare model's parameters to "
                f"{claim.name} (it starts every rank from rank 0's "
                f"parameters, as DDP does; accumulate gradients with "
                f"OneBitAdam's no_sync() or by calling step() less often)")
        if kind == "opt" and o is not opt and \
                getattr(o, "_claim", None) is None:
            groups = getattr(o, "param_groups", ())
            if any(id(p) in ids for g in groups for p in g["params"]):
                raise RuntimeError(
                    f"{claim.name}: its parameters are also in the param "
                    f"groups of {type(o).__name__}, which would update them "
                    f"a second time each step; give every parameter one "
                    f"optimizer (build the other over the parameters "
                    f"{claim.name} does not train)")


def check_hook_bucket(bucket):
    """RuntimeError when a DDP bucket handed to allreduce_hook holds a
    parameter that an obcomm optimizer trains (see check_first_step)."""
    try:
        params = bucket.parameters()
    except (AttributeError, RuntimeError):
        return
    with _lock:
        for p in params:
            held = _owners.get(id(p))
            if held is not None and held[0]() is p and held[1].alive():
                name = held[1].name
                raise RuntimeError(
                    f"obcomm.torch.allreduce_hook: the DDP bucket holds a "
                    f"parameter that {held[1].describe()} trains; "
                    f"{name} averages its gradients itself, so DDP would "
                    f"average them twice and race its sends. "
                    f"allreduce_hook is for DDP with torch's own "
                    f"optimizers (torch.optim.Adam); with {name} drop DDP "
                    f"and its hook and pass the bare model's parameters "
                    f"to {name}")
