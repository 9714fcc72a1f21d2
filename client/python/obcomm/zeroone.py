"""0/1 Adam (Lu et al. 2022, arXiv 2202.06009) over obcomm, as DeepSpeed's
ZeroOneAdam runs it (runtime/fp16/onebit/zoadam.py), on CPU tensors."""

import ctypes

import torch

from ._lib import lib, ZoadamConfig, ZoadamState, constant
from ._flat import FlatOptimizer, check_adam_args, NEAR_FREEZE
from . import _stage

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
    when v_i <= (ratio * sqrt(mean v))^2 over its param group (the
    threshold rounded to float32, the mean summed in double)
    (set_auto_mask; ratio 0.03 by default, three times OneBitAdam's,
    since 0.01 let the CNN of docs/convergence.md diverge on 2 seeds of 4;
    0 masks only v_i == 0, < 0 turns it off); a masked coordinate's 1-bit averaged gradient (stage 1)
    and synchronized update (stage 2) are set to 0, as DeepSpeed's
    exp_avg_mask does with a mask the user builds.

    Where this differs from DeepSpeed's: a synchronization sets the
    parameters from a copy of the last synchronized ones instead of
    subtracting the accumulated updates, so every rank ends with the same
    bits (the subtraction rounds differently on each rank); it costs one
    more float32 copy of the parameters. There is no warm-up call that
    skips the first step, and a learning rate summed to 0 over an interval
    leaves the momentum as it was instead of dividing by 0.

    The steps run in libobcomm (obcomm_zoadam_*, one C optimizer per param
    group), as OneBitAdam's run in obcomm_adam_*.

    Parameters are CPU tensors, float32, or float16 or bfloat16 over
    float32 master weights (as OneBitAdam's: all of a param group in one
    dtype; each step updates the masters and writes them, rounded to
    nearest even, into the parameters; state_dict() carries them as
    'master'). Every rank constructs the optimizer with the same parameters
    and arguments (checked) and starts from rank 0's parameters. p.grad
    becomes a view into the optimizer's gradient buffer (a gradient set
    otherwise is copied in by step()). max_grad_norm > 0 clips as
    DeepSpeed's gradient_clipping, by the norm of this rank's own gradient
    over every param group (the average is formed inside the step):
    coef = max_grad_norm / (norm + 1e-6), applied to the gradient in place
    when below 1. No DDP: the optimizer averages the gradients itself. `rounds`
    counts the collectives step() issued, {"fp32": n, "1bit": n}.

    state_dict() and load_state_dict() are collectives, with OneBitAdam's
    semantics: the dict names a snapshot set of the daemons' error
    feedback ("obcomm"), so a resumed run continues bit for bit or every
    rank raises."""

    C = "zoadam"
    NAME = "ZeroOneAdam"
    # OBCOMM_ZOADAM_AUTO_MASK_RATIO of the library: 3x OneBitAdam's
    # (docs/convergence.md, "0/1 Adam's mask").
    AUTO_MASK_RATIO = constant("OBCOMM_ZOADAM_AUTO_MASK_RATIO")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, var_freeze_step=100000,
                 var_update_scaler=16, local_step_scaler=32678,
                 local_step_clipper=16, comm=None, key=1, max_grad_norm=0.0):
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
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults, comm, key, max_grad_norm)

    @property
    def stage(self):
        """0/1 Adam's stage: "warmup" while every step averages fp32
        gradients and updates the variance (var_interval 1; also before
        the first step), "compressed" once steps between variance updates
        average 1-bit (var_interval > 1), "local_steps" once the variance
        is frozen (local steps, a 1-bit synchronization every
        local_step_interval steps)."""
        if not self._groups:
            return "warmup"
        st, _ = self._state(self._groups[0])
        if st.frozen:
            return "local_steps"
        return "compressed" if st.var_interval > 1 else "warmup"

    def _freeze(self):
        return "var_update_scaler", self.var_update_scaler

    def _stage_text(self):
        st, _ = self._state(self._groups[0])
        after = self._bytes(_stage.onebit_bytes)
        n = self._nodes()
        if st.frozen:
            return (f"ZeroOneAdam: step {st.step} passed var_freeze_step "
                    f"{self.var_freeze_step}: local steps now, with a 1-bit "
                    f"synchronization of {after} bytes per node every "
                    f"local_step_interval steps (now {st.local_interval}) "
                    f"and nothing sent in between ({n} node(s))")
        before = self._bytes(_stage.fp32_bytes)
        return (f"ZeroOneAdam: from step {st.step} var_interval is "
                f"{st.var_interval}: steps between variance updates average "
                f"1-bit, {after} bytes per node instead of about {before} "
                f"for an fp32 step ({n} node(s))")

    def _nonfinite_hint(self, step):
        if step > NEAR_FREEZE:
            return None
        return (f"ZeroOneAdam step {step} is early in 0/1 Adam's schedule "
                f"(1-bit averages start once var_interval passes 1, after "
                f"var_update_scaler={self.var_update_scaler} variance "
                f"updates): the variance had little time to settle, or lr "
                f"is too high for this model; raise var_update_scaler or "
                f"lower lr")

    def _init_group(self, g, group):
        # The C optimizer keeps m, v, u (the updates since the last
        # synchronization), x (the parameters at it) and the schedule; it
        # steps g.p from g.g.
        beta1, beta2 = group["betas"]
        cfg = ZoadamConfig(
            lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
            weight_decay=group["weight_decay"],
            var_freeze_step=self.var_freeze_step,
            var_update_scaler=self.var_update_scaler,
            local_step_scaler=self.local_step_scaler,
            local_step_clipper=self.local_step_clipper)
        h = ctypes.c_void_p()
        comm = self.comm
        with comm._locked() as ch:
            comm._check(lib.obcomm_zoadam_create(ch, g.key, g.count,
                                                 ctypes.byref(cfg),
                                                 ctypes.byref(h)))
        self._own(g, h, lib.obcomm_zoadam_destroy)
        if self._groups:  # a group added later joins the schedule
            st, _ = self._state(self._groups[0])
            st.lrs, st.rounds_fp32, st.rounds_1bit = 0.0, 0, 0
            zero = torch.zeros(g.count)
            self._set_state(g, st, zero, zero, zero, g.p)
        self._mask(g)

    # -- the C optimizer's state ------------------------------------------

    def _state(self, g):
        """The C optimizer's schedule and its m, v, u, x (views into its
        memory, valid until its next step)."""
        st = ZoadamState()
        ptrs = [ctypes.c_void_p() for _ in range(4)]
        lib.obcomm_zoadam_get_state(g.handle, ctypes.byref(st),
                                    *(ctypes.byref(q) for q in ptrs))
        return st, [torch.frombuffer(
            (ctypes.c_float * g.count).from_address(q.value),
            dtype=torch.float32) for q in ptrs]

    def _set_state(self, g, st, m, v, u, x):
        ts = [t.reshape(-1).contiguous().float() for t in (m, v, u, x)]
        if any(t.numel() != g.count for t in ts):
            raise ValueError(f"load_state_dict: param group of {g.count} "
                             f"elements, state of "
                             f"{[t.numel() for t in ts]}")
        rc = lib.obcomm_zoadam_set_state(g.handle, ctypes.byref(st),
                                         *(t.data_ptr() for t in ts))
        if rc != 0:
            raise ValueError(f"load_state_dict: the schedule {_sched(st)} "
                             f"is not one a run reaches")

    # -- checkpoints ------------------------------------------------------

    def state_dict(self):
        """torch's state dict with, per parameter, 'exp_avg',
        'exp_avg_sq', 'momentum_accumulator' and, once the variance is
        frozen, 'sync_param' (the parameters at the last synchronization);
        "zero_one", the schedule's counters, each group's summed learning
        rates and the rounds; and "obcomm", the snapshot set of the
        daemons' error feedback taken with it (and this node's part of it
        when its daemon keeps no state_dir). A collective."""
        states = [self._state(g) for g in self._groups]

        def per_param(g, i, o, n):
            p = g.params[i]
            st, (m, v, u, x) = states[self._groups.index(g)]
            out = {"exp_avg": m[o:o + n].clone().view_as(p),
                   "exp_avg_sq": v[o:o + n].clone().view_as(p),
                   "momentum_accumulator": u[o:o + n].clone().view_as(p)}
            if st.frozen:
                out["sync_param"] = x[o:o + n].clone().view_as(p)
            return out
        st = states[0][0]
        return self._state_dict_with(per_param, {"zero_one": dict(
            _sched(st), lrs=[s.lrs for s, _ in states],
            rounds=[[s.rounds_fp32, s.rounds_1bit] for s, _ in states])})

    def load_state_dict(self, state_dict):
        """Restores the moments, the accumulated updates, the schedule and
        the daemons' error feedback of the snapshot the dict names; the
        parameters come from the model's own state dict, as with any torch
        optimizer. Every rank calls it; it raises ObcommError on every rank
        when a node lacks the snapshot or holds it damaged."""
        sched = state_dict.get("zero_one")
        if isinstance(sched, dict) and (
                any(k not in sched for k in _COUNTERS + ("lrs",)) or
                len(sched["lrs"]) != len(self._groups)):
            raise ValueError(f"load_state_dict: \"zero_one\" lacks one of "
                             f"{_COUNTERS + ('lrs',)} or has "
                             f"{len(sched.get('lrs', []))} groups' lrs, "
                             f"not {len(self._groups)}")
        # The C optimizers keep the settings they were made with.
        self._check_hyper(state_dict.get("param_groups", []))
        states, sched = self._load_with(state_dict, "zero_one")
        frozen = bool(sched["frozen"])
        need = ["exp_avg", "exp_avg_sq", "momentum_accumulator"] + (
            ["sync_param"] if frozen else [])
        for st in states:
            if not all(k in s for s in st for k in need):
                raise ValueError(f"load_state_dict: a parameter lacks one "
                                 f"of {need} (not a ZeroOneAdam state)")
        rounds = sched.get("rounds", [[0, 0]] * len(self._groups))
        for g, st, lrs, r in zip(self._groups, states, sched["lrs"], rounds):
            c = ZoadamState(
                step=int(sched["step"]), frozen=int(frozen),
                var_interval=int(sched["var_interval"]),
                var_counter=int(sched["var_counter"]),
                local_interval=int(sched["local_step_interval"]),
                local_counter=int(sched["local_step_counter"]),
                lrs=float(lrs), rounds_fp32=int(r[0]), rounds_1bit=int(r[1]))
            x = self._cat(st, "sync_param") if frozen else g.p
            self._set_state(g, c, self._cat(st, "exp_avg"),
                            self._cat(st, "exp_avg_sq"),
                            self._cat(st, "momentum_accumulator"), x)


def _sched(st):
    """The state dict's "zero_one" counters of a ZoadamState."""
    return {"step": st.step, "var_interval": st.var_interval,
            "var_counter": st.var_counter,
            "local_step_interval": st.local_interval,
            "local_step_counter": st.local_counter,
            "frozen": bool(st.frozen)}
