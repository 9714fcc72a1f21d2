"""ZeroOneAdam and OneBitLamb take what OneBitAdam takes: float16 and
bfloat16 parameters over float32 master weights, and max_grad_norm
(parity_workers.py). Gradients are set by hand with values exact in every
dtype, so a float16/bfloat16 run's masters equal a float32 run's weights
bit for bit, and its parameters are those masters rounded."""

import os

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "parity_workers.py")
STEPS = 8


def _run(cl, job, **args):
    a = dict(dtype="float32", clip=0.0, hand=0.0, steps=STEPS)
    a.update(args)
    res = cl.run(job, "train", 1, args=a, script=SCRIPT)
    for r in res[1:]:
        assert all(torch.equal(x, y)
                   for x, y in zip(r["weights"], res[0]["weights"]))
    return res[0]


@pytest.mark.parametrize("opt", ["zoadam", "lamb"])
def test_half_precision_over_masters(make_cluster, opt):
    cl = make_cluster(2)
    ref = _run(cl, opt + "-f32", opt=opt)
    assert ref["stage"] != "warmup"  # the 1-bit stages ran
    for dtype in ("bfloat16", "float16"):
        r = _run(cl, f"{opt}-{dtype}", opt=opt, dtype=dtype)
        for m, w, p in zip(r["weights"], ref["weights"], r["params"]):
            assert m.dtype == torch.float32
            assert torch.equal(m, w), (dtype, (m - w).abs().max())
            assert p.dtype == getattr(torch, dtype)
            assert torch.equal(p, w.to(p.dtype))


@pytest.mark.parametrize("opt", ["zoadam", "lamb"])
def test_max_grad_norm(make_cluster, opt):
    """max_grad_norm clips by the norm of this rank's own gradient, as
    DeepSpeed's gradient_clipping: the same weights as gradients clipped by
    hand; a bound above every norm changes nothing, and the clip did
    change the run."""
    cl = make_cluster(2)
    clipped = _run(cl, opt + "-clip", opt=opt, clip=1.5)
    hand = _run(cl, opt + "-hand", opt=opt, hand=1.5)
    plain = _run(cl, opt + "-plain", opt=opt)
    loose = _run(cl, opt + "-loose", opt=opt, clip=1e6)
    for c, h, p, lo in zip(clipped["weights"], hand["weights"],
                           plain["weights"], loose["weights"]):
        assert torch.equal(c, h)
        assert torch.equal(lo, p)
    assert any(not torch.equal(c, p) for c, p in
               zip(clipped["weights"], plain["weights"]))


def test_dtypes_refused():
    """What no obcomm optimizer takes is refused at construction, naming
    the dtypes it does take."""
    import obcomm.torch
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    for make in (obcomm.torch.ZeroOneAdam, obcomm.torch.OneBitLamb):
        with pytest.raises(TypeError) as e:
            make([p], comm=_NoComm())
        assert str(e.value) == (
            f"{make.__name__}: parameters must be float32, float16 or "
            f"bfloat16 CPU tensors, not torch.float64 on cpu")


class _NoComm:
    """A stand-in communicator: the dtype check comes before any call."""

    def _share(self):
        return self

    def _c(self):
        raise AssertionError("the dtype check must come first")
