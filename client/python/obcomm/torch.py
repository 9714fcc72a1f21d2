"""obcomm for PyTorch: OneBitAdam, a torch.optim.Optimizer over libobcomm's
1-bit Adam; ZeroOneAdam (zeroone.py) and OneBitLamb (lamb.py);
allreduce_hook, a DDP communication hook; and, registered by importing
this module, the torch.distributed backend "obcomm" (backend.py)."""

import contextlib
import ctypes
import enum
import functools
import math
import os
import weakref

import torch
from torch.autograd import Variable

from ._lib import lib, AdamConfig, constant
from .comm import Communicator, ObcommError, E_MISMATCH, DTYPES
from .backend import ProcessGroupObcomm, _value_or_raise, process_group
from ._flat import (FlatOptimizer, check_adam_args, with_hint, freeze_hint,
                    CLIP_EPS, PARAM_DTYPES)
from . import _claims, _stage, _subgroups
from .zeroone import ZeroOneAdam
from .lamb import OneBitLamb

_subgroups.install()

__all__ = ["OneBitAdam", "ZeroOneAdam", "OneBitLamb", "allreduce_hook",
           "ProcessGroupObcomm"]

# OBCOMM_ADAM_AUTO_MASK_RATIO of the library (as a double).
AUTO_MASK_RATIO = constant("OBCOMM_ADAM_AUTO_MASK_RATIO")

_HYPER = ("betas", "eps", "weight_decay", "freeze_step", "bias_correction")

# OBCOMM_ADAM_MAX_THREADS of the library.
ADAM_MAX_THREADS = int(constant("OBCOMM_ADAM_MAX_THREADS"))

# DDP's default bucket size (MiB).
BUCKET_CAP_MB = 25


class _State(enum.Enum):
    """Where a bucket is in the current step."""
    IDLE = "idle"        # nothing sent since the last step()
    STARTED = "started"  # obcomm_adam_start_ex succeeded: the op is out
    FAILED = "failed"    # obcomm_adam_start_ex failed: step() raises its error


class _Bucket:
    """A contiguous slice of its group's flat buffers, parameters
    [first, last) of the group (elements [off, off + count)), with its own
    C optimizer and key: its own error feedback in the daemons, its own
    1-bit chunks and scales, its own automatic mask threshold."""

    def __init__(self, group, first, last, key):
        self.group = group
        self.first, self.last = first, last
        self.off = group.spans[first][0]
        self.count = sum(n for _, n in group.spans[first:last])
        self.key = key
        self.handle = None   # obcomm_adam_t * (FlatOptimizer._own)
        self.conn = None     # the connection the C optimizer borrows
        self.hooked = 0      # parameters whose gradient hook counts
        self.fired = set()   # of those, the ones whose gradient arrived
        self.state = _State.IDLE
        self.error = None    # the ObcommError of a failed start


def _plan(numels, cap_bytes):
    """A group's buckets as parameter index ranges [first, last), in start
    order: filled from the group's last parameter backwards (the reverse
    of the order of use, as DDP approximates it), a bucket closed once it
    holds at least cap_bytes of float32. A remainder without elements
    joins the bucket before it (a C optimizer needs at least one)."""
    out = []
    last, nbytes = len(numels), 0
    for i in reversed(range(len(numels))):
        nbytes += 4 * numels[i]
        if nbytes >= cap_bytes:
            out.append((i, last))
            last, nbytes = i, 0
    if last > 0:
        if nbytes > 0 or not out:
            out.append((0, last))
        else:
            out[-1] = (0, out[-1][1])
    return out


def _grad_ready(wself, bucket, i, *_):
    """The hook on parameter i's AccumulateGrad node (weak: the node lives
    as long as the parameter, the optimizer need not)."""
    opt = wself()
    if opt is not None:
        opt._grad_ready(bucket, i)


def _grad_arriving(wself, bucket, i, grad):
    """The hook on parameter i's gradient before AccumulateGrad adds it
    into p.grad: refuses a second backward pass before anything is added,
    so a bucket whose gradients the daemons are averaging in place is never
    written while in flight."""
    opt = wself()
    if opt is not None:
        opt._check_arrival(bucket, i)
    return None


class OneBitAdam(FlatOptimizer):
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
    (shapes) and arguments; it checks that every rank planned the same
    buckets and broadcasts rank 0's parameters so every rank starts equal,
    and it averages the gradients itself (no DDP needed). Each param
    group's parameters and gradients are moved into one flat float32
    shared-memory buffer each and re-pointed as views into it; the
    gradients stay those views (zero_grad zeroes them in place). In the
    warm-up the daemons average float32 gradients where they are, without
    a copy: after step() they hold the average, as DDP leaves them, and
    from the moment a bucket starts (in backward, with overlap) until
    step() returns its gradients must not be touched. The compression
    stage only reads them.

    threads: threads for the optimizer's own passes over each bucket
    (obcomm_adam_set_threads; buckets under 128 Ki elements use one); None
    takes torch.get_num_threads(), as torch's own optimizers use the
    intra-op threads. Results are bit-identical for any value.

    Mixed precision (as DeepSpeed's fp16/bf16 training): the parameters
    of a param group may instead all be float16 or all bfloat16 (CPU
    tensors only; CUDA is not supported). The optimizer then keeps the
    float32 master weights in the shared buffer, and the parameters and
    their gradients become views into flat buffers of the model's dtype;
    each step updates the masters and writes them, rounded to nearest
    even, into the parameters. The masters are the optimizer's: a change
    made to a float16/bfloat16 parameter in place is overwritten by the
    next step (load the model through load_state_dict, which restores the
    masters, to resume).

    max_grad_norm > 0 clips the gradient as DeepSpeed's
    gradient_clipping: coef = max_grad_norm / (norm + 1e-6), applied when
    below 1. In the warm-up the norm is that of the averaged gradient over
    every bucket (the same on every rank); in the compression stage that
    of this rank's own gradient over every bucket, so buckets start in
    step(), after backward, not from the gradient hooks.

    Buckets (as DDP's): each group's flat buffers are cut into contiguous
    buckets of at least bucket_cap_mb MiB, filled from the group's last
    parameter backwards; each bucket is its own C optimizer with its own
    key. Bucket j (counted over the groups in order, within a group from
    its last parameters on) has key `key + j`, so the optimizer uses keys
    key .. key + len(buckets) - 1. Buckets are always started in one
    order, the same on every rank: the groups from the last to the first,
    within a group from its last parameters on.

    overlap=True (the default): a hook on each parameter's gradient
    accumulation starts a bucket's step (its collective) as soon as all of
    its gradients arrived in backward and every bucket before it has
    started, so communication runs during the rest of backward; at the end
    of a backward pass, buckets whose gradients did not all arrive (unused
    parameters) start with the gradients they hold; step() starts what is
    left (gradients set by hand), waits for every bucket in order and
    applies the updates. A backward pass (outside no_sync()) commits the
    step: gradients changed after it are not seen (clip with
    max_grad_norm, not clip_grad_norm_), and a second backward before
    step() raises; accumulate over several backward passes
    inside `with opt.no_sync():` (as DDP's) or with overlap=False, where
    step() starts and finishes every bucket.

    Only lr may change between steps (schedulers work); the other
    hyperparameters are fixed at construction or by load_state_dict.
    state_dict() and load_state_dict() are collectives: every rank calls
    them. state_dict() has every daemon save the run's error feedback as a
    snapshot set and names it in the dict ("obcomm": {"snapshot", "job",
    "buckets"}); load_state_dict() brings every daemon back to that set,
    so a resumed run continues bit for bit, or raises on every rank naming
    the node that lacks it or holds it damaged. Without a state_dir the
    daemons keep only the newest set of a job, in memory, until they
    restart.
    """

    NAME = "OneBitAdam"
    C = "adam"
    AUTO_MASK_RATIO = AUTO_MASK_RATIO
    HYPER = _HYPER
    # obcomm_adam_start_ex converts a float16/bfloat16 gradient itself.
    F32_GRADS = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, freeze_step=100000, bias_correction=False,
                 comm=None, key=1, bucket_cap_mb=BUCKET_CAP_MB, overlap=True,
                 max_grad_norm=0.0, threads=None):
        check_adam_args(lr, betas, eps, weight_decay, freeze_step,
                        "freeze_step")
        if not bucket_cap_mb > 0:
            raise ValueError(f"invalid bucket_cap_mb {bucket_cap_mb}")
        if not 0.0 <= max_grad_norm < math.inf:
            raise ValueError(f"invalid max_grad_norm {max_grad_norm}")
        if threads is None:
            threads = torch.get_num_threads()
        if not 1 <= int(threads) <= ADAM_MAX_THREADS:
            raise ValueError(f"invalid threads {threads} "
                             f"(1 to {ADAM_MAX_THREADS})")
        self.freeze_step = int(freeze_step)
        self.overlap = bool(overlap)
        self.threads = int(threads)
        self.bucket_cap_mb = bucket_cap_mb
        self._cap_bytes = max(1, int(bucket_cap_mb * 1024 * 1024))
        self._buckets = []   # by key: _buckets[j] has key self.key + j
        self._order = []     # the start order
        self._next = 0       # _order[_next] is the next bucket to start
        self._sync = True    # False inside no_sync()
        self._in_backward = False  # an end-of-backward callback is queued
        self._accs = []      # the AccumulateGrad nodes we hook (kept alive)
        self._hooks = []     # their hooks' handles
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, freeze_step=int(freeze_step),
                        bias_correction=bool(bias_correction))
        super().__init__(params, defaults, comm, key, max_grad_norm)

    # -- setup ----------------------------------------------------------------

    def add_param_group(self, param_group):
        if any(b.state is not _State.IDLE for b in self._buckets):
            raise RuntimeError("OneBitAdam.add_param_group: a step is started "
                               "(backward ran); call step() first")
        super().add_param_group(param_group)
        self._order = [b for grp in reversed(self._groups)
                       for b in grp.buckets]

    def _freeze(self):
        return "freeze_step", self.freeze_step

    def _check_param(self, p):
        if p.device.type != "cpu":
            raise TypeError(
                f"OneBitAdam: parameters must be CPU tensors, not on "
                f"{p.device}: obcomm's optimizer does not support CUDA "
                f"tensors")
        if p.dtype not in PARAM_DTYPES:
            raise TypeError(
                f"OneBitAdam: parameters must be float32, float16 or "
                f"bfloat16, not {p.dtype}")

    def _keys(self, g):
        """Plans group g's buckets (g.plan, g.first_key): one key each."""
        g.plan = _plan([n for _, n in g.spans], self._cap_bytes)
        g.first_key = self.key + len(self._buckets)
        g.buckets = []
        g.keep = None        # explicit mask (uint8 tensor) or None
        return range(g.first_key, g.first_key + len(g.plan))

    def _init_group(self, g, group):
        """A C optimizer per bucket of g, and the gradient hooks."""
        cfg = self._config(group)
        comm = self.comm
        for j, (first, last) in enumerate(g.plan):
            b = _Bucket(g, first, last, g.first_key + j)
            h = ctypes.c_void_p()
            with comm._locked() as ch:
                comm._check(lib.obcomm_adam_create(ch, b.key, b.count,
                                                   ctypes.byref(cfg),
                                                   ctypes.byref(h)))
            self._own(b, h, lib.obcomm_adam_destroy)
            lib.obcomm_adam_set_auto_mask(h, self._auto_ratio)
            lib.obcomm_adam_set_threads(h, self.threads)  # checked in __init__
            g.buckets.append(b)
            self._buckets.append(b)
        if self.overlap:
            self._hook(g)

    def _config(self, group):
        k = AdamConfig()
        k.lr = group["lr"]
        k.beta1, k.beta2 = group["betas"]
        k.eps = group["eps"]
        k.weight_decay = group["weight_decay"]
        k.freeze_step = int(group["freeze_step"])
        k.bias_correction = int(bool(group["bias_correction"]))
        return k

    def _agree(self, g):
        """Every rank must plan the same buckets (the daemons match a
        job's ops in the order they are issued): one allgather of a digest
        of the group's parameter shapes, bucket ranges and keys, and
        ObcommError on every rank naming the ranks that differ."""
        plan, first_key = g.plan, g.first_key
        differ = self._differ(repr((first_key, [
            tuple(p.shape) for p in g.params], plan)).encode())
        if differ:
            counts = [sum(n for _, n in g.spans[f:l]) for f, l in plan]
            raise ObcommError(
                E_MISMATCH,
                f"OneBitAdam: param group {len(self._groups)}'s buckets on "
                f"rank(s) {differ} differ from rank 0's (rank "
                f"{self.comm.rank}: {len(g.params)} parameters, "
                f"{len(plan)} bucket(s) of {counts} elements, keys "
                f"{first_key}..{first_key + len(plan) - 1}); every rank "
                f"must construct the optimizer with the same parameters, "
                f"param groups, key and bucket_cap_mb")

    def _hook(self, g):
        """Hooks every parameter of g that requires a gradient: its
        AccumulateGrad node (torch 1.13 has no post-accumulate hook; DDP
        hooks the same node) calls _grad_ready once the gradient is in
        p.grad. A parameter holds its node only weakly, so we keep it."""
        wself = weakref.ref(self)
        with torch.enable_grad():
            for b in g.buckets:
                for i in range(b.first, b.last):
                    p = g.params[i]
                    if not p.requires_grad:
                        continue
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._accs.append(acc)
                    self._hooks.append(acc.register_hook(
                        functools.partial(_grad_ready, wself, b, i)))
                    self._hooks.append(p.register_hook(
                        functools.partial(_grad_arriving, wself, b, i)))
                    b.hooked += 1

    def _grad_view(self, g, i):
        """Parameter i's gradient back into the flat buffer if it is not
        the view there (None: zeros; another tensor: one copy)."""
        p, (o, n) = g.params[i], g.spans[i]
        gv = g.grads[o:o + n]
        with torch.no_grad():
            if p.grad is None:
                gv.zero_()
                p.grad = gv.view_as(p)
            elif n and p.grad.data_ptr() != gv.data_ptr():
                gv.copy_(p.grad.reshape(-1))
                p.grad = gv.view_as(p)

    def _data_view(self, g, i):
        """Parameter i's values back into the flat buffer if the user
        replaced p.data (one copy, then a view again; the masters of a
        float16/bfloat16 model then take the new values)."""
        p, (o, n) = g.params[i], g.spans[i]
        pv = (g.m if g.mixed else g.p)[o:o + n]
        if n and p.data_ptr() != pv.data_ptr():
            with torch.no_grad():
                pv.copy_(p.reshape(-1))
                if g.mixed:
                    g.p[o:o + n].copy_(pv)
            p.data = pv.view_as(p)

    # -- starting buckets -----------------------------------------------------

    def _check_arrival(self, b, i):
        """Parameter i of bucket b is about to receive a gradient: a
        second backward pass (outside no_sync) raises here, before torch
        adds anything to the gradients the first one sent. The first
        gradient of the run checks that nothing else averages or updates
        the parameters (DDP, another optimizer)."""
        if not self._claim.checked:
            self._first_step()
        if not self._sync or b.handle is None:
            return
        if b.state is not _State.IDLE or i in b.fired:
            p = b.group.params[i]
            raise RuntimeError(
                f"OneBitAdam: a second backward pass reached a parameter "
                f"({tuple(p.shape)}, bucket key {b.key}) before step(); "
                "with overlap=True the first backward pass already sent its "
                "gradients. Accumulate gradients with `with opt.no_sync():` "
                "around all but the last backward pass (as with DDP), or "
                "construct the optimizer with overlap=False")

    def _grad_ready(self, b, i):
        """Parameter i of bucket b has its gradient of this backward pass."""
        if not self._sync or b.handle is None:
            return
        self._check_arrival(b, i)
        self._grad_view(b.group, i)
        b.fired.add(i)
        if not self._in_backward:
            self._in_backward = True
            Variable._execution_engine.queue_callback(self._backward_done)
        self._start_ready(everything=False)

    def _backward_done(self):
        """The end of a backward pass that reached our parameters: buckets
        whose gradients did not all arrive (parameters this pass did not
        use) start now with the gradients they hold."""
        self._in_backward = False
        if self._sync:
            self._start_ready(everything=True)

    def _compressing(self, b):
        """Whether bucket b's next step is in the compression stage."""
        return lib.obcomm_adam_steps(b.handle) >= b.group.hyper[3]

    def _held(self, b):
        """Whether bucket b must wait for step(): with clipping, a
        compression step scales the local gradient by a coefficient from
        the norm of all of this rank's gradients, known only then."""
        return self.max_grad_norm > 0 and self._compressing(b)

    def _clip_scale(self, sumsq):
        """DeepSpeed's clip coefficient from a sum of squares, or 1."""
        coef = self.max_grad_norm / (math.sqrt(sumsq) + CLIP_EPS)
        return coef if coef < 1.0 else 1.0

    def _start_ready(self, everything, local_scale=None):
        """Starts buckets in start order, as far as they are ready (all of
        their hooked gradients arrived and not held for clipping), or all
        of them (step() alone, with the local clip scale: local_scale)."""
        while self._next < len(self._order):
            b = self._order[self._next]
            if local_scale is None and self._held(b):
                return
            if not everything and len(b.fired) < b.hooked:
                return
            self._start(b, local_scale if self._held(b) else 1.0)
            self._next += 1

    def _start(self, b, scale):
        """obcomm_adam_start_ex on bucket b: reads its gradients (in the
        model's dtype) times scale, submits its collective. A failure is
        kept for step() to raise, so a backward pass never ends in a
        half-started step."""
        g = b.group
        for i in range(b.first, b.last):
            if i not in b.fired:
                self._grad_view(g, i)
        item = g.grads.element_size()
        grads = ctypes.c_void_p(g.grads.data_ptr() + item * b.off)
        try:
            with self.comm._locked():
                if g.mixed:
                    rc = lib.obcomm_adam_start_ex(b.handle, grads,
                                                  DTYPES[g.dtype], scale)
                else:  # float32 in shared memory: averaged in place
                    rc = lib.obcomm_adam_start_inplace(b.handle, grads, scale)
                self.comm._check(rc)
            b.state = _State.STARTED
        except ObcommError as e:
            b.state, b.error = _State.FAILED, e

    def _local_scale(self):
        """The compression stage's clip scale: from the norm of this
        rank's gradients over every bucket it clips (each bucket's sum of
        squares in double, summed in bucket order), or 1."""
        sumsq = 0.0
        for b in self._buckets:
            if not self._held(b):
                continue
            g = b.group
            for i in range(b.first, b.last):
                self._grad_view(g, i)
            gv = g.grads[b.off:b.off + b.count]
            sumsq += float(gv.double().square().sum())
        return self._clip_scale(sumsq)

    def _avg_scale(self, warm):
        """The warm-up's clip scale: ends the collectives of the started
        warm-up buckets (obcomm_adam_wait) and clips by the norm of the
        average over all of them (obcomm_adam_grad_sumsq, summed in bucket
        order: the same on every rank). A failed wait or sum leaves 1 and
        is kept for step() to raise (finish_ex fails the bucket alike)."""
        sumsq, part = 0.0, ctypes.c_double()
        for b in warm:
            try:
                with self.comm._locked():
                    self.comm._check(lib.obcomm_adam_wait(b.handle))
                    self.comm._check(lib.obcomm_adam_grad_sumsq(
                        b.handle, ctypes.byref(part)))
            except ObcommError as e:
                return 1.0, e
            sumsq += part.value
        return self._clip_scale(sumsq), None

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside the block only accumulate gradients
        (DDP's no_sync): the first backward pass after it, or step(),
        sends the sum. A no-op with overlap=False."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # -- the optimizer ----------------------------------------------------------

    def _first_step(self):
        _claims.check_first_step(
            self._claim, [p for g in self._groups for p in g.params])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._claim.checked:
            self._first_step()
        self._check_hyper(self.param_groups)
        first = None
        step = self.steps + 1
        try:
            for g, group in zip(self._groups, self.param_groups):
                for b in g.buckets:
                    lib.obcomm_adam_set_lr(b.handle, float(group["lr"]))
            clip = self.max_grad_norm > 0
            local = self._local_scale() if clip else 1.0
            self._start_ready(everything=True, local_scale=local)
            # Clipping in the warm-up: the norm of the average, over the
            # buckets in bucket (key) order.
            warm = {b for b in self._buckets if not self._compressing(b)}
            avg = 1.0
            if clip and warm:
                avg, first = self._avg_scale(
                    [b for b in self._buckets
                     if b in warm and b.state is _State.STARTED])
            # Every started bucket is finished, also after a failure, so
            # that none stays in flight into the next step.
            for b in self._order:
                if b.state is _State.FAILED:
                    first = first or b.error
                    continue
                g = b.group
                for i in range(b.first, b.last):
                    self._data_view(g, i)
                params = ctypes.c_void_p(g.p.data_ptr() + 4 * b.off)
                model = None
                if g.mixed:
                    model = ctypes.c_void_p(g.m.data_ptr() +
                                            g.m.element_size() * b.off)
                try:
                    with self.comm._locked():
                        self.comm._check(lib.obcomm_adam_finish_ex(
                            b.handle, params, model, DTYPES[g.dtype],
                            avg if b in warm else 1.0))
                except ObcommError as e:
                    first = first or e
        finally:
            for b in self._order:
                b.state, b.error, b.fired = _State.IDLE, None, set()
            self._next = 0
            self._in_backward = False
        if first is not None:
            freeze = min(g.hyper[3] for g in self._groups)
            raise with_hint(first, freeze_hint("OneBitAdam", step, freeze))
        self._stage.update(step, self.stage, self._stage_text)
        return loss

    @property
    def stage(self):
        """The stage of the last step: "warmup" (full-precision gradients;
        also before the first step) or "compressed" (1-bit momentum), once
        every param group's step passed its freeze_step."""
        t = self.steps
        if self._groups and all(t > g.hyper[3] for g in self._groups):
            return "compressed"
        return "warmup"

    def _stage_text(self):
        nodes = self.comm.size // self.comm.local_size
        before = sum(_stage.fp32_bytes(b.count, nodes) for b in self._buckets)
        after = sum(_stage.onebit_bytes(b.count, nodes)
                    for b in self._buckets)
        freeze = max(g.hyper[3] for g in self._groups)
        return (f"OneBitAdam: step {self.steps} was the first compressed "
                f"step (freeze_step {freeze}): a step now sends {after} "
                f"bytes per node instead of about {before} (1-bit momentum "
                f"instead of fp32 gradients; {len(self._buckets)} "
                f"bucket(s), {nodes} node(s))")

    def zero_grad(self, set_to_none=False):
        """Zeroes every gradient in place (one memset per group); the
        gradients stay views into the group's flat buffer whatever
        set_to_none says. With overlap, after a backward pass (outside no_sync) only
        step() may come: its gradients are already sent."""
        if any(b.state is not _State.IDLE for b in self._buckets):
            raise RuntimeError(
                "OneBitAdam.zero_grad: a backward pass already started this "
                "step (overlap=True sends gradients during backward); call "
                "step() first, run backward passes whose gradients may be "
                "dropped inside `with opt.no_sync():`, or construct the "
                "optimizer with overlap=False")
        for g in self._groups:
            g.grads.zero_()
            for i in range(len(g.params)):
                self._grad_view(g, i)

    @property
    def buckets(self):
        """The buckets by key: (key, parameters, elements) of each, bucket
        j with key `key + j`."""
        return [(b.key, [b.group.params[i] for i in range(b.first, b.last)],
                 b.count) for b in self._buckets]

    # -- the mask ---------------------------------------------------------------

    def set_auto_mask(self, ratio):
        """The automatic mask: a coordinate is masked in the compression
        stage when sqrt(v) <= ratio * sqrt(mean v) over its bucket's frozen
        v. True: the default ratio (AUTO_MASK_RATIO, as the C library);
        a number: that ratio (0 masks only v == 0); False: no automatic
        mask (the ablation). An explicit mask (set_mask) still applies."""
        if ratio is True:
            ratio = AUTO_MASK_RATIO
        elif ratio is False or ratio is None:
            ratio = -1.0
        self._auto_ratio = float(ratio)
        for b in self._buckets:
            lib.obcomm_adam_set_auto_mask(b.handle, self._auto_ratio)

    def set_mask(self, param, keep):
        """An explicit mask for `param` (DeepSpeed's exp_avg_mask): `keep`
        has param's shape, nonzero keeps a coordinate, 0 holds its momentum
        at 0 in the compression stage. The rest of the param group is kept
        (the automatic mask is then off for that group, in every bucket).
        keep=None returns the group to the automatic mask. Every rank sets
        the same mask."""
        for g in self._groups:
            for p, (o, n) in zip(g.params, g.spans):
                if p is not param:
                    continue
                if keep is None:
                    g.keep = None
                else:
                    keep = torch.as_tensor(keep)
                    if keep.shape != p.shape:
                        raise ValueError(
                            f"set_mask: mask shape {tuple(keep.shape)} is "
                            f"not the parameter's {tuple(p.shape)}")
                    if g.keep is None:
                        g.keep = torch.ones(g.count, dtype=torch.uint8)
                    g.keep[o:o + n] = (keep.reshape(-1) != 0).to(torch.uint8)
                for b in g.buckets:
                    mask = None if g.keep is None else \
                        ctypes.c_void_p(g.keep.data_ptr() + b.off)
                    with self.comm._locked():
                        self.comm._check(lib.obcomm_adam_set_mask(b.handle,
                                                                  mask))
                return
        raise ValueError("set_mask: not a parameter of this optimizer")

    # -- checkpoints ------------------------------------------------------------

    def _bucket_state(self, b):
        """Bucket b's C state: (step, m, v), m and v float32 views of the C
        optimizer's memory (valid until its next step or load)."""
        step, m, v = ctypes.c_long(), ctypes.c_void_p(), ctypes.c_void_p()
        with self.comm._locked():
            self.comm._check(lib.obcomm_adam_get_state(
                b.handle, ctypes.byref(step), ctypes.byref(m),
                ctypes.byref(v)))
        return step.value, *(torch.frombuffer(
            (ctypes.c_float * b.count).from_address(q.value),
            dtype=torch.float32) for q in (m, v))

    def _layout(self):
        """The "obcomm" entry's description of the C optimizers: the
        buckets, [key, elements] each."""
        return "buckets", [[b.key, b.count] for b in self._buckets]

    def state_dict(self):
        """torch's state dict, per parameter 'step', 'exp_avg' and
        'exp_avg_sq' (float32), and for a float16/bfloat16 parameter its
        float32 master weights, 'master'; plus "obcomm": the snapshot set
        of the daemons' error feedback taken with it ({"snapshot": id,
        "job": name, "buckets": [[key, elements], ...]}), and, when this
        node's daemon keeps no state_dir, this node's part of it ("part":
        bytes, "node": its node), which a load after a restart of the
        daemons needs. A collective (one snapshot set for all buckets);
        raises on every rank unless every node saved, and when a step is
        started (backward ran). A run still in the warm-up is told so
        (one WARNING on logger "obcomm")."""
        self._stage.warmup_note("state_dict() taken")
        # Refused while a step is started, before the daemons save.
        states = [self._bucket_state(b) for b in self._buckets]
        info = self._snapshot()
        for b, (step, m, v) in zip(self._buckets, states):
            g = b.group
            for i in range(b.first, b.last):
                p, (o, n) = g.params[i], g.spans[i]
                o -= b.off
                self.state[p] = {
                    "step": torch.tensor(float(step)),
                    "exp_avg": m[o:o + n].clone().view_as(p),
                    "exp_avg_sq": v[o:o + n].clone().view_as(p)}
                if g.mixed:
                    o += b.off
                    self.state[p]["master"] = \
                        g.p[o:o + n].clone().view_as(p)
        try:
            sd = torch.optim.Optimizer.state_dict(self)
        finally:
            self.state.clear()
        sd["obcomm"] = info
        return sd

    def load_state_dict(self, state_dict):
        """Restores step, momentum, variance and hyperparameters of every
        bucket, the masters of float16/bfloat16 parameters (and the
        parameters as their rounding; a dict without masters takes them
        from the current parameters), and the daemons' error feedback of
        the snapshot the dict names: the run continues bit for bit. The buckets must be those the
        dict was saved with (ValueError otherwise). Every rank calls it; it
        raises ObcommError on every rank when a node lacks the snapshot or
        holds it damaged (the run's error feedback then restarts at zero
        on every node, and the run cannot continue)."""
        info = state_dict.get("obcomm")
        if not isinstance(info, dict) or not info.get("snapshot"):
            raise ValueError("load_state_dict: no \"obcomm\" snapshot in the "
                             "state dict (not saved by OneBitAdam.state_dict)")
        saved = info.get("buckets")
        layout = self._layout()[1]
        if saved is not None and [list(x) for x in saved] != layout:
            raise ValueError(
                f"load_state_dict: the state dict was saved with buckets "
                f"(key, elements) {[tuple(x) for x in saved]}, this optimizer "
                f"has {[tuple(x) for x in layout]}: construct it "
                f"with the same key and bucket_cap_mb")
        snapshot = int(info["snapshot"])
        part = info.get("part")
        states = []
        for g, st in zip(self._groups, self._load_groups(state_dict)):
            if not all("exp_avg" in s for s in st):
                raise ValueError("load_state_dict: a parameter has no "
                                 "exp_avg (not a OneBitAdam state)")
            steps = {int(s["step"]) for s in st}
            if len(steps) != 1:
                raise ValueError(f"load_state_dict: steps differ {steps}")
            for name in ("exp_avg", "exp_avg_sq"):
                n = sum(s[name].numel() for s in st)
                if n != g.count:
                    raise ValueError(f"load_state_dict: {name} of {n} "
                                     f"elements for a param group of "
                                     f"{g.count}")
            states.append((st, steps.pop()))
        # Every daemon back to the dict's error feedback (this node's from
        # the dict's part when it is this node's), or an error on every
        # rank; only then the C optimizers take the moments.
        self.comm._restore_1bit(snapshot, part, info.get("node"))
        for g, group, (st, step) in zip(self._groups, self.param_groups,
                                        states):
            cfg = self._config(group)
            m = torch.cat([s["exp_avg"].reshape(-1).float() for s in st])
            v = torch.cat([s["exp_avg_sq"].reshape(-1).float() for s in st])
            for b in g.buckets:
                mb = m[b.off:b.off + b.count].contiguous()
                vb = v[b.off:b.off + b.count].contiguous()
                with self.comm._locked():
                    self.comm._check(lib.obcomm_adam_set_state(
                        b.handle, step, ctypes.byref(cfg),
                        ctypes.c_void_p(mb.data_ptr()),
                        ctypes.c_void_p(vb.data_ptr())))
            g.hyper = self._hyper(group)
            if g.mixed:
                self._load_masters(g, st)
        # The C optimizers hold the state; the per-parameter copies only
        # exist to be saved.
        self.state.clear()

    def _load_masters(self, g, st):
        """A float16/bfloat16 group's masters from the state ('master'),
        the model rounded from them; without masters in the dict (saved
        from a float32 model) the masters become the current parameters."""
        with torch.no_grad():
            for i, (p, s) in enumerate(zip(g.params, st)):
                self._data_view(g, i)
                o, n = g.spans[i]
                if "master" in s:
                    g.p[o:o + n].copy_(s["master"].reshape(-1))
                else:
                    g.p[o:o + n].copy_(p.reshape(-1))
            g.m.copy_(g.p)

    # -- lifetime -----------------------------------------------------------------

    def close(self):
        """Frees the C optimizers, removes the gradient hooks and lets go
        of the connection (which stays open while the process group or a
        Communicator holds it). Parameters keep their values: they are
        copied out of shared memory first. Idempotent."""
        for h in self._hooks:
            h.remove()
        self._hooks, self._accs = [], []
        super().close()
        self._groups, self._buckets, self._order = [], [], []


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
    _claims.check_hook_bucket(bucket)
    t = bucket.buffer()
    # Chained so that a failed op fails the future DDP's reducer reads
    # (a future failed with set_exception() would read as a result).
    return comm._iallreduce(t, "avg", t).future.then(_value_or_raise)
