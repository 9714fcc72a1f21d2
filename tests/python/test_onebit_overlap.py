"""obcomm.torch.OneBitAdam with several buckets: the overlap of each
bucket's communication with backward gives bitwise the parameters of
starting and finishing every bucket in step(), with an unused parameter,
with gradient accumulation, across a checkpoint; a rank that starts
another bucket fails every rank instead of hanging. Real daemons, real
trainer processes (overlap_workers.py)."""


import pytest

import overlap_workers
from test_onebit_adam import expected_masked

W = overlap_workers.WORKERS

# Deep's buckets with CAP_MB, in start order (key 1 first): keys, shapes
# and element counts; overlap_workers.Deep says why.
BUCKETS = [
    (1, [(32, 48), (32,), (10, 32), (10,)], 1898),
    (2, [(48, 64), (48,)], 3120),
    (3, [(64, 256), (64,), (16, 32), (16,)], 16976),
    (4, [(4, 1, 3, 3), (4,)], 40),
]
# Per step: keys 1 and 2 start from their gradient hooks during backward;
# 3 (holding the unused layer) and 4 (behind 3) at the end of backward.
OVERLAPPED = [(1, True), (2, True), (3, False), (4, False)]
AT_STEP = [(1, False), (2, False), (3, False), (4, False)]


@pytest.mark.parametrize("trainers", [1, 2])
def test_overlap_equals_start_at_step(make_cluster, trainers):
    """2 nodes x 1 and x 2 trainers, freeze at 5, 12 steps with a StepLR
    schedule: overlap=True gives bitwise the parameters of overlap=False
    after every step, on every rank; the buckets start when promised; the
    unused layer never moves; each bucket's automatic mask is the rule
    applied to its own v; every compression step is 4 1-bit ops. The
    gradients after a warm-up step are the average, averaged in place
    (the same on every rank), after a compression step each rank's own;
    threads (3 with overlap, torch's count without) change nothing. At
    step 3 two gradients are not the optimizer's views (None, a tensor of
    the user's): the hooks put them back into the shared buffer as step()
    does."""
    cl = make_cluster(2)
    args = {"freeze": 5, "until": 12, "v": True, "own_grads": 3}
    on = cl.run("on", "train", trainers,
                args=dict(args, overlap=True, threads=3), script=W)
    off = cl.run("off", "train", trainers, args=dict(args, overlap=False),
                 script=W)
    assert len(on) == len(off) == 2 * trainers
    for a, b in zip(on, off):
        assert a["rank"] == b["rank"]
        assert a["buckets"] == b["buckets"] == BUCKETS
        assert len(a["digests"]) == 12
        assert a["digests"] == b["digests"] == on[0]["digests"]
        assert a["starts"] == [OVERLAPPED] * 12
        assert b["starts"] == [AT_STEP] * 12
        assert a["steps"] == b["steps"] == 12
        assert a["views"] and b["views"]
        assert a["unused_moved"] == b["unused_moved"] == 0.0
        assert a["grads"] == b["grads"]
        assert a["grads"][:5] == on[0]["grads"][:5]
        assert a["threads"][0] == 3 and b["threads"][0] == b["threads"][1]
        assert a["obcomm"]["buckets"] == [[k, n] for k, _, n in BUCKETS]
        want = sum(expected_masked(v, 0.01) for v in a["bucket_v"])
        assert a["masked"] == b["masked"] == want > 0
    assert len(set(on[0]["digests"])) == 12  # the parameters moved
    # Compression steps leave each rank its own gradient.
    assert all(len({r["grads"][s] for r in on}) == len(on)
               for s in range(5, 12))
    # Per node: (12 - 5) compression steps x 4 buckets, twice.
    assert cl.metrics(0)["onebit_ops"] == cl.metrics(1)["onebit_ops"] == 56


def test_accumulation(make_cluster):
    """3 backward passes per step: with overlap the first two inside
    no_sync(), without overlap plain accumulation; bitwise the same
    parameters across the freeze, and the overlapped run still starts its
    buckets during the last backward pass."""
    cl = make_cluster(2)
    args = {"freeze": 4, "until": 8, "accum": 3}
    on = cl.run("acc_on", "train", 2, args=dict(args, overlap=True),
                script=W)
    off = cl.run("acc_off", "train", 2, args=dict(args, overlap=False),
                 script=W)
    one = cl.run("acc_one", "train", 2,
                 args=dict(args, overlap=False, accum=1), script=W)
    for a, b, c in zip(on, off, one):
        assert a["digests"] == b["digests"] == on[0]["digests"]
        assert a["digests"] != c["digests"]  # accumulation changed them
        assert a["starts"] == [OVERLAPPED] * 8


def test_misuse_raises(make_cluster):
    """With overlap, a second backward pass before step() outside
    no_sync() raises RuntimeError saying what to do, and so does
    zero_grad() between backward and step(); step() then completes the
    step that started, on every rank alike, and training goes on."""
    cl = make_cluster(1)
    res = cl.run("misuse", "misuse", 2, script=W)
    for r in res:
        assert "no_sync" in r["second_backward"]
        assert "overlap=False" in r["second_backward"]
        assert "call step() first" in r["zero_grad"]
        assert r["steps"] == 2
        assert r["digest"] == res[0]["digest"]


def test_state_dict_round_trip(make_cluster, tmp_path):
    """14 steps in one go equal 7 steps, state_dict, new processes,
    load_state_dict, 7 more (freeze at 5: the error feedback of all four
    keys matters), bit for bit on every rank with overlap, from one
    snapshot set. A state dict
    saved with other buckets is refused before any collective."""
    cl = make_cluster(2)
    whole = cl.run("whole", "train", 2,
                   args={"freeze": 5, "until": 14, "overlap": True}, script=W)
    ck = str(tmp_path / "ck")
    saved = [cl.metrics(n)["ef_saved"] for n in range(2)]
    a = cl.run("halves", "train", 2,
               args={"freeze": 5, "until": 7, "overlap": True, "save": ck},
               script=W)
    # One snapshot set for the four buckets: each node saved the four keys'
    # states once (one set per bucket would be 4 x 4), so a checkpoint
    # costs the daemons' retention (4 sets per job) one set.
    assert [cl.metrics(n)["ef_saved"] - saved[n] for n in range(2)] == [4, 4]
    b = cl.run("halves", "train", 2,
               args={"freeze": 5, "until": 14, "overlap": True, "load": ck},
               script=W)
    for w, x, y in zip(whole, a, b):
        assert w["rank"] == x["rank"] == y["rank"]
        assert x["digests"] + y["digests"] == w["digests"]
        assert y["steps"] == 14
        assert y["starts"] == [OVERLAPPED] * 7
    c = cl.run("other", "train", 2,
               args={"freeze": 5, "until": 14, "overlap": True, "load": ck,
                     "cap_mb": 1.0}, script=W)
    for r in c:
        assert "saved with buckets" in r["load_error"], r
        assert "(1, 1898), (2, 3120)" in r["load_error"]


@pytest.mark.parametrize("freeze", [0, 100])
def test_other_bucket_fails_every_rank(make_cluster, freeze):
    """2 nodes x 2 trainers; the last rank starts its first two buckets in
    the other order: the daemons fail the step's first op on every rank
    with a mismatch (in the warm-up the counts differ, in the compression
    stage counts and keys), at once, not at the 20 s op deadline."""
    import obcomm
    cl = make_cluster(2)
    res = cl.run(f"swap{freeze}", "train", 2,
                 args={"freeze": freeze, "until": 3, "overlap": True,
                       "swap": True}, script=W)
    for r in res:
        e = r["error"]
        assert e is not None, r
        assert e["code"] == obcomm.comm.E_MISMATCH, e
        assert "count differs: " in e["message"], e
        assert "has 1898" in e["message"] and "has 3120" in e["message"], e
        if freeze == 0:
            assert "key differs: " in e["message"], e
        assert e["seconds"] < 10, e
        assert r["digests"] == [] and r["steps"] == 0


def test_construction_checks_buckets(make_cluster):
    """A rank whose buckets differ (another bucket_cap_mb) makes the
    constructor raise on every rank, naming it, before any step."""
    import obcomm
    cl = make_cluster(2)
    res = cl.run("caps", "train", 1,
                 args={"freeze": 5, "until": 3, "overlap": True,
                       "cap_mb_last": 1.0}, script=W)
    for r in res:
        e = r["error"]
        assert e["code"] == obcomm.comm.E_MISMATCH, e
        assert "on rank(s) [1] differ from rank 0's" in e["message"]
        assert "bucket_cap_mb" in e["message"]


@pytest.mark.parametrize("threads", [0, 65, -1])
def test_threads_out_of_range(threads):
    """threads outside 1..64 is refused before any connection."""
    import torch
    import obcomm.torch
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="threads"):
        obcomm.torch.OneBitAdam([p], threads=threads)
