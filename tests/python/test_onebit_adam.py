"""obcomm.torch.OneBitAdam against real daemons and real processes."""

import math
import os

import numpy as np
import pytest
import torch


def test_warmup_equals_torch_adam(make_cluster):
    """One node, 2 trainers: in the warm-up OneBitAdam (bias_correction,
    eps 1e-8) is torch.optim.Adam on the averaged gradient. The C update
    rounds differently from torch's (lr * m_hat / (sqrt(v_hat) + eps) in
    float32 vs. torch's step_size and addcdiv), so the tolerance is a few
    float32 ulps of the parameters: 2e-6 absolute after each of 25 steps
    with lr 1e-2 (parameters are O(0.1))."""
    cl = make_cluster(1)
    res = cl.run("warm", "adam_vs_torch", 2, args={"steps": 25})
    for r in res:
        assert len(r["diffs"]) == 25
        assert max(r["diffs"]) <= 2e-6, r["diffs"]


def test_ranks_identical_after_freeze(make_cluster):
    """2 nodes x 2 trainers, each rank on its own data, freeze at step 8:
    every rank holds bitwise the same parameters after every step, the
    conv weights of the always-zero input columns are masked, and the
    parameters moved."""
    cl = make_cluster(2)
    res = cl.run("same", "train", 2, args={"freeze": 8, "steps": 20})
    ref = res[0]
    assert ref["steps"] == 20
    for r in res[1:]:
        assert r["digests"] == ref["digests"]
        assert r["masked"] == ref["masked"]
    assert ref["masked"] > 0
    assert all(v > 0 for v in ref["moved"].values())
    # StepLR(step_size=3, gamma=0.7) after 20 steps.
    assert ref["lr"] == pytest.approx(1e-3 * 0.7 ** 6, rel=1e-12)
    m0 = cl.metrics(0)
    assert m0["onebit_ops"] == 20 - 8


def expected_masked(v, ratio):
    """The C rule (client/adam.c, auto_threshold): mean of v summed in
    double in index order, threshold (float)((double)ratio_f * sqrt(mean))^2
    on v, masked when v <= threshold."""
    s = 0.0
    for x in v.tolist():
        s += x
    r = float(np.float32(ratio)) * math.sqrt(s / len(v))
    thr = np.float32(r * r)
    return int((v.numpy() <= thr).sum())


def test_masks(make_cluster):
    """1 node x 2 trainers, freeze at 8: the automatic mask holds exactly
    the coordinates the rule names (default ratio 0.01, ratio 0: v == 0,
    off: none); an explicit mask keeps its coordinates where they were at
    the freeze (no weight decay) while the rest moves."""
    cl = make_cluster(1)
    ratios = [0.01, 0.0, 0.1, "off"]
    res = cl.run("mask", "train", 2, args={"freeze": 8, "steps": 12,
                                           "mask_counts": ratios})
    for r in res:
        v = r["v"]
        assert r["masked"] == expected_masked(v, 0.01)
        got = r["masked_by_ratio"]
        assert got["0.01"] == r["masked"]
        assert got["0.0"] == int((v == 0).sum())
        assert got["0.0"] > 0  # the always-zero input columns
        assert got["0.1"] == expected_masked(v, 0.1)
        assert got["0.0"] < got["0.01"] < got["0.1"]
        assert got["off"] == 0
    res = cl.run("mask2", "train", 2, args={"freeze": 8, "steps": 12,
                                            "explicit_mask": True})
    for r in res:
        assert r["masked"] == 32  # fc2.weight's first row
        a, b = r["fc2_at_freeze"], r["fc2_final"]
        assert torch.equal(a[0], b[0])
        assert (a[1:] != b[1:]).any()


def test_state_dict_round_trip_bit_for_bit(make_cluster, tmp_path):
    """20 steps in one go equal 10 steps, state_dict, new processes,
    load_state_dict, 10 more steps: bit for bit on every rank (freeze at 8,
    so the error feedback held by the daemons matters). Again with both
    daemons killed and restarted from their snapshots in between."""
    flags0 = ["--state_dir", str(tmp_path / "s0")]
    flags1 = ["--state_dir", str(tmp_path / "s1")]
    os.mkdir(tmp_path / "s0")
    os.mkdir(tmp_path / "s1")
    cl = make_cluster(2)
    # Per-node flags: restart each daemon with its own state_dir.
    for n, f in enumerate((flags0, flags1)):
        cl.kill_node(n)
    cl.flags = []
    for n, f in enumerate((flags0, flags1)):
        cl.flags = f
        cl.start_node(n)
    for n in range(2):
        cl.wait_ready(n)

    whole = cl.run("whole", "train", 2, args={"freeze": 8, "steps": 20})
    ck = str(tmp_path / "ck")
    a = cl.run("halves", "train", 2,
               args={"freeze": 8, "steps": 10, "save": ck})
    assert a[0]["state_keys"] == ["exp_avg", "exp_avg_sq", "step"]
    b = cl.run("halves", "train", 2,
               args={"freeze": 8, "steps": 10, "load": ck})
    for w, x, y in zip(whole, a, b):
        assert w["rank"] == x["rank"] == y["rank"]
        assert x["digests"] + y["digests"] == w["digests"]
        assert y["steps"] == 20

    ck2 = str(tmp_path / "ck2")
    cl.run("crash", "train", 2, args={"freeze": 8, "steps": 10, "save": ck2})
    for n in range(2):
        cl.kill_node(n)
    for n, f in enumerate((flags0, flags1)):
        cl.flags = f
        cl.start_node(n)
    for n in range(2):
        cl.wait_ready(n)
    c = cl.run("crash", "train", 2, args={"freeze": 8, "steps": 10, "load": ck2})
    for w, y in zip(whole, c):
        assert y["digests"] == w["digests"][10:]


def test_ddp_allreduce_hook(make_cluster):
    """DDP (Gloo process group for its setup) with obcomm's comm hook on 2
    nodes x 1 trainer: every rank's gradients are bitwise the average of
    all ranks' own gradients (fp32 sum in rank order, then / size, as the
    daemon computes it)."""
    import ports
    cl = make_cluster(2)
    port = ports.reserve(1)[0]
    res = cl.run("ddp", "ddp_hook", 1, args={"port": port})
    for r in res:
        assert r["same"], r["diff"]
