"""The daemons' 1-bit error feedback over its lifecycle (docs/design.md,
"The 1-bit state's lifecycle and failures"), 2 nodes x 2 trainers, real
daemons and real trainer processes:

- a run (first trainer of the job joins .. last one leaves) owns the state:
  a new run starts from zero on every node;
- a checkpoint pins it: OneBitAdam.state_dict() names a snapshot
  (sd["obcomm"]) and load_state_dict() restores exactly that step on every
  node, so a resumed run equals the uninterrupted one bit for bit (same or
  restarted daemons, with or without state_dir: without one, each rank's
  checkpoint carries its node's part), or every rank gets an ObcommError
  naming the node and why;
- a snapshot that cannot be written, or that is damaged or missing on one
  node, fails on every rank;
- a failed op stops the run on every rank until a new run starts.

Every training run here is workers.ckpt_train (Net, StepLR, freeze at step
8, so the daemons' error feedback shapes every step from 8 on); the
yardstick is one uninterrupted run of another job on other daemons
(`whole`), compared through per-step sha256 digests of the parameters.
"""

import hashlib
import os
import shutil
import signal
import struct
import subprocess

import pytest
import torch

import cluster
from test_collectives import onebit_expected

NODES, TRAINERS = 2, 2
FREEZE = 8    # 1-bit steps from here on
STEPS = 20    # the uninterrupted run
SAVE = 10     # the checkpoint
PAST = 13     # where a run that saved at SAVE stops: its daemons' state
              # then differs from the checkpoint's
FRESH = 12    # steps of a run that only has to start from zero
FAIL_MS = 15000  # op deadline where a failure is expected


# -- helpers ------------------------------------------------------------------


def set_flags(cl, tmp_path, state_dir):
    """Gives each of cl's daemons its own --state_dir (tmp_path/stateN,
    restarting them) or none; restart() keeps these flags."""
    cl.node_flags = [["--state_dir", str(tmp_path / f"state{n}")]
                     if state_dir else [] for n in range(cl.k)]
    if state_dir:
        restart(cl)


def restart(cl, sig=signal.SIGTERM):
    """Stops every daemon with sig (SIGTERM: a clean shutdown, exit status
    0 required) and starts them again with their flags."""
    for n in range(cl.k):
        p = cl.procs[n]
        cl.kill_node(n, sig)
        if sig == signal.SIGTERM and p is not None:
            assert p.returncode == 0, \
                f"obcommd {n} exited with {p.returncode}: {cl.log(n)}"
    for n in range(cl.k):
        cl.flags = cl.node_flags[n]
        cl.start_node(n)
    for n in range(cl.k):
        cl.wait_ready(n)


def make_2x2(make_cluster, tmp_path, state_dir, timeout_ms=20000):
    cl = make_cluster(NODES, timeout_ms=timeout_ms)
    set_flags(cl, tmp_path, state_dir)
    return cl


def train(cl, job, until, save=None, load=None, stop_after_load=False,
          timeout_ms=20000, load_rank=None):
    args = {"freeze": FREEZE, "until": until, "save": save or {},
            "timeout_ms": timeout_ms}
    if load:
        args["load"] = load
        args["stop_after_load"] = stop_after_load
        if load_rank is not None:
            args["load_rank"] = load_rank
    res = cl.run(job, "ckpt_train", TRAINERS, args=args, timeout=120)
    assert sorted(r["rank"] for r in res) == list(range(NODES * TRAINERS))
    return res


def assert_same_as_whole(res, whole, first, last, what):
    """Each rank's digests after steps first..last-1 equal the
    uninterrupted run's; the message says from which step on they differ."""
    for r in res:
        assert r["first"] == first, (what, r["rank"], r["first"])
        got, want = r["digests"], whole[r["rank"]][first:last]
        assert len(got) == last - first, (what, r["rank"], len(got))
        if got != want:
            bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            raise AssertionError(
                f"{what}: rank {r['rank']}'s parameters differ from the "
                f"uninterrupted run's from step {first + bad} on (steps "
                f"{first}..{last - 1} compared, 1-bit from step {FREEZE})")


def assert_failed_everywhere(res, field, fragments, any_of=()):
    """Every rank got an ObcommError in res[field], all with the same code,
    each message containing every fragment and one of any_of."""
    none = [r["rank"] for r in res if r[field] is None]
    assert not none, (f"{field}: no ObcommError on rank(s) {none}; the "
                      f"others got {[r[field] for r in res if r[field]]}")
    codes = {r[field]["code"] for r in res}
    assert len(codes) == 1, f"{field}: codes differ between ranks: " + \
        str([(r["rank"], r[field]) for r in res])
    for r in res:
        msg = r[field]["message"]
        for f in fragments:
            assert f in msg, f"rank {r['rank']}: {f!r} not in {msg!r}"
        if any_of:
            assert any(f in msg for f in any_of), \
                f"rank {r['rank']}: none of {any_of} in {msg!r}"


def snapshot_id(res, step):
    """The snapshot id every rank's state_dict() named at `step`."""
    ids = set()
    for r in res:
        info = r["saved"][step]["obcomm"]
        assert isinstance(info, dict), \
            f"rank {r['rank']}: state_dict() has no 'obcomm' dict: {info!r}"
        ids.add(info["snapshot"])
    assert len(ids) == 1, f"the ranks name different snapshots: {ids}"
    return ids.pop()


def set_dir(state_dir, job, snap):
    """A node's snapshot set: <state_dir>/set-<job in hex>-<id, 16 hex>."""
    return os.path.join(state_dir, f"set-{job.encode().hex()}-{snap:016x}")


@pytest.fixture(scope="module")
def whole():
    """The uninterrupted run: STEPS steps of job "whole" on daemons that
    never saw another job. Digests by rank; every rank's are the same."""
    with cluster.Cluster(NODES) as cl:
        res = cl.run("whole", "ckpt_train", TRAINERS,
                     args={"freeze": FREEZE, "until": STEPS}, timeout=120)
    by_rank = {r["rank"]: r["digests"] for r in res}
    assert len(by_rank[0]) == STEPS
    assert all(d == by_rank[0] for d in by_rank.values())
    assert len(set(by_rank[0])) == STEPS  # every step moved the parameters
    return by_rank


# -- 1. a run owns the state --------------------------------------------------


def test_new_run_starts_from_zero(make_cluster, tmp_path, whole):
    """Two runs in a row of the same job on the same daemons (no
    state_dir), identical inputs: both equal the uninterrupted run of a
    fresh job, step for step, the second too (it does not inherit the
    first run's error feedback)."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=False)
    for i in range(2):
        res = train(cl, "again", FRESH)
        assert_same_as_whole(res, whole, 0, FRESH, f"run {i + 1} of 'again'")


def test_new_run_starts_from_zero_with_state_dir(make_cluster, tmp_path,
                                                 whole):
    """With state_dir: a first run takes a checkpoint at step 10 (so a
    snapshot set exists on disk) and goes on to step 12; a second run of
    the same job on the same daemons, and a third after both daemons were
    stopped with SIGTERM and restarted, neither loading anything: each
    starts from zero and equals the uninterrupted run of a fresh job.
    Snapshots are used only by an explicit load_state_dict."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=True)
    ck = str(tmp_path / "ck")
    res = train(cl, "again", FRESH, save={SAVE: ck})
    assert_same_as_whole(res, whole, 0, FRESH, "run 1 (saved at 10)")
    res = train(cl, "again", FRESH)
    assert_same_as_whole(res, whole, 0, FRESH, "run 2, same daemons")
    restart(cl)
    res = train(cl, "again", FRESH)
    assert_same_as_whole(res, whole, 0, FRESH,
                         "run 3, after a SIGTERM restart")


# -- 2. a checkpoint pins the state -------------------------------------------


def test_state_dict_names_its_snapshot(make_cluster, tmp_path):
    """state_dict() (a collective) returns torch's dict plus a top-level
    "obcomm" dict with "snapshot" (an int id, the same on every rank) and
    "job" (the job's name); with state_dir, every node holds that set as
    <state_dir>/set-<job name in hex>-<id as %016x>/ with ef-*.lz4 and its
    manifest in it."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=True)
    job = "named"
    res = train(cl, job, SAVE, save={SAVE: str(tmp_path / "ck")})
    for r in res:
        saved = r["saved"][SAVE]
        assert "state" in saved["keys"] and "param_groups" in saved["keys"]
        assert "obcomm" in saved["keys"], \
            f"rank {r['rank']}: state_dict() keys are {saved['keys']}"
        info = saved["obcomm"]
        assert isinstance(info, dict), info
        assert isinstance(info["snapshot"], int) and \
            not isinstance(info["snapshot"], bool), info
        assert info["job"] == job, info
    snap = snapshot_id(res, SAVE)
    for n in range(NODES):
        d = set_dir(str(tmp_path / f"state{n}"), job, snap)
        assert os.path.isdir(d), (d, os.listdir(tmp_path / f"state{n}"))
        files = os.listdir(d)
        assert "manifest" in files and len(files) > 1 and \
            all(f.startswith("ef-") and f.endswith(".lz4")
                for f in files if f != "manifest"), files


def test_resume_same_daemons_state_dir(make_cluster, tmp_path, whole):
    """Daemons with state_dir, never restarted. Run 1 saves at step 10
    and trains on to 13 (so the daemons' state is no longer the
    checkpoint's); run 2 (new processes) loads the step-10 checkpoint,
    saves again at 15 and trains on to 18; run 3 loads the step-15
    checkpoint (the job's second one; the first may be gone) and ends at
    20. Every step of every run equals the uninterrupted run."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=True)
    ck1, ck2 = str(tmp_path / "ck1"), str(tmp_path / "ck2")
    res = train(cl, "resume", PAST, save={SAVE: ck1})
    assert_same_as_whole(res, whole, 0, PAST, "run 1 (saved at 10)")
    res = train(cl, "resume", 18, save={15: ck2}, load=ck1)
    assert_same_as_whole(res, whole, SAVE, 18, "run 2, loaded step 10")
    res = train(cl, "resume", STEPS, load=ck2)
    assert_same_as_whole(res, whole, 15, STEPS, "run 3, loaded step 15")


def test_resume_after_clean_restart_state_dir(make_cluster, tmp_path, whole):
    """Daemons with state_dir. Run 1 saves at step 10 and trains on to 13;
    both daemons are stopped with SIGTERM (a clean shutdown) and
    restarted with the same state_dirs; run 2 loads the step-10
    checkpoint: it restores step 10's error feedback (not whatever the
    daemons held at shutdown) and equals the uninterrupted run."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=True)
    ck = str(tmp_path / "ck")
    res = train(cl, "term", PAST, save={SAVE: ck})
    assert_same_as_whole(res, whole, 0, PAST, "run 1 (saved at 10)")
    restart(cl)
    res = train(cl, "term", STEPS, load=ck)
    assert_same_as_whole(res, whole, SAVE, STEPS,
                         "after a SIGTERM restart, loaded step 10")


def test_resume_same_daemons_in_memory(make_cluster, tmp_path, whole):
    """Daemons without state_dir (they keep snapshots in memory), never
    restarted. Run 1 saves at step 10 and trains on to 13; run 2 loads the
    step-10 checkpoint and equals the uninterrupted run."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=False)
    ck = str(tmp_path / "ck")
    res = train(cl, "mem", PAST, save={SAVE: ck})
    assert_same_as_whole(res, whole, 0, PAST, "run 1 (saved at 10)")
    res = train(cl, "mem", STEPS, load=ck)
    assert_same_as_whole(res, whole, SAVE, STEPS, "loaded step 10")


def test_resume_in_memory_after_restart_rides_in_the_checkpoint(
        make_cluster, tmp_path, whole):
    """Daemons without state_dir, both restarted (SIGTERM) between
    state_dict() and load_state_dict(): the daemons' sets are gone, but
    each rank's checkpoint carries its node's part (sd["obcomm"]["part"]),
    so the resumed run equals the uninterrupted one bit for bit."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=False)
    ck = str(tmp_path / "ck")
    res = train(cl, "ride", PAST, save={SAVE: ck})
    assert_same_as_whole(res, whole, 0, PAST, "run 1 (saved at 10)")
    for r in res:
        o = r["saved"][SAVE]["obcomm"]
        assert o["node"] == r["rank"] // TRAINERS and o["part_bytes"] > 0, o
    restart(cl)
    res = train(cl, "ride", STEPS, load=ck)
    assert_same_as_whole(res, whole, SAVE, STEPS,
                         "daemons restarted without state_dir, loaded "
                         "step 10 from the checkpoints' parts")


def test_rank0_checkpoint_after_restart_fails_everywhere(make_cluster,
                                                         tmp_path):
    """The same, but every rank loads rank 0's checkpoint (as when only
    rank 0 saves): it carries node 0's part only, so node 1 has nothing to
    restore from; load_state_dict raises ObcommError on every rank (same
    code), saying the snapshot is missing on node 1 and what to do."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=False,
                  timeout_ms=FAIL_MS)
    ck = str(tmp_path / "ck")
    train(cl, "gone", SAVE, save={SAVE: ck})
    restart(cl)
    res = train(cl, "gone", STEPS, load=ck, load_rank=0, stop_after_load=True,
                timeout_ms=FAIL_MS)
    assert_failed_everywhere(res, "load_error", ["node 1: missing"])
    for r in res:
        assert r["load_error"]["str"].endswith(
            "; to resume after the daemons restart, set state_dir on every "
            "daemon, or let every rank save its own state_dict() (each "
            "carries its node's part) and load its own file"), \
            r["load_error"]["str"]


# -- 3. a damaged, missing, incomplete or mixed set on one node --------------


def drop_from_manifest(set_dir, key):
    """Rewrites a set's manifest without `key`, digest and all, as a set
    complete in itself but of fewer keys: header (magic 8, version, nodes,
    rank, nkeys as u32; fingerprint, run, id as u64; job 64), then per key
    (key, count as u64; digest 32), then BLAKE2b-256 of all that."""
    path = os.path.join(set_dir, "manifest")
    with open(path, "rb") as f:
        raw = f.read()
    head, body = raw[:112], raw[112:-32]
    nkeys = struct.unpack_from("<I", head, 20)[0]
    entries = [body[i * 48:(i + 1) * 48] for i in range(nkeys)]
    kept = [e for e in entries if struct.unpack_from("<Q", e)[0] != key]
    assert len(kept) == nkeys - 1, (key, nkeys)
    head = head[:20] + struct.pack("<I", nkeys - 1) + head[24:]
    out = head + b"".join(kept)
    out += hashlib.blake2b(out, digest_size=32).digest()
    with open(path, "wb") as f:
        f.write(out)


@pytest.mark.parametrize("harm", ["damaged", "missing", "mixed",
                                  "file-missing", "extra", "forged"])
def test_bad_snapshot_on_one_node_fails_everywhere(make_cluster, tmp_path,
                                                   whole, harm):
    """Daemons with state_dir. Run 1 saves at steps 9 and 10. Then node 1's
    set of the step-10 snapshot is harmed on disk: "damaged" flips one
    byte in the middle of one of its ef-*.lz4 files, "missing" deletes the
    set, "mixed" puts the step-9 set's file of one key in its place (as a
    partial restore of a backup would), "file-missing" deletes one key's
    file, "extra" adds a file, "forged" deletes one key's file and
    rewrites the manifest without it (a part whole in itself, of fewer
    keys than node 0's). A new run's load_state_dict raises
    ObcommError on every one of the 4 ranks, the message naming node 1,
    the file where one is at fault, and what is wrong. After that failed
    load, a fresh run of the same job (no load) trains from zero: it
    equals the uninterrupted run."""
    cl = make_2x2(make_cluster, tmp_path, state_dir=True,
                  timeout_ms=FAIL_MS)
    job = "harm-" + harm
    ck, ck9 = str(tmp_path / "ck"), str(tmp_path / "ck9")
    res = train(cl, job, SAVE + 1, save={SAVE - 1: ck9, SAVE: ck})
    snap = snapshot_id(res, SAVE)
    d = set_dir(str(tmp_path / "state1"), job, snap)
    d9 = set_dir(str(tmp_path / "state1"), job, snapshot_id(res, SAVE - 1))
    assert os.path.isdir(d), (d, os.listdir(tmp_path / "state1"))
    assert os.path.isdir(d9), (d9, os.listdir(tmp_path / "state1"))
    files = sorted(f for f in os.listdir(d) if f.startswith("ef-"))
    assert files, os.listdir(d)
    path = os.path.join(d, files[0])
    expect = [harm, "node 1"]
    if harm == "damaged":
        with open(path, "r+b") as f:
            raw = bytearray(f.read())
            raw[len(raw) // 2] ^= 0xFF
            f.seek(0)
            f.write(raw)
    elif harm == "missing":
        shutil.rmtree(d)
    elif harm == "mixed":
        assert files[0] in os.listdir(d9), (files, os.listdir(d9))
        shutil.copyfile(os.path.join(d9, files[0]), path)
        expect = [f"node 1: damaged: {path}: a file of set"]
    elif harm == "file-missing":
        os.unlink(path)
        expect = [f"node 1: damaged: {path}: missing (named in the set's "
                  "manifest)"]
    elif harm == "forged":
        os.unlink(path)
        drop_from_manifest(d, int(files[0].split("-")[2][:16], 16))
        expect = ["the nodes' parts of the set hold different keys",
                  "node 0: keys", "node 1: keys"]
    else:
        extra = os.path.join(d, "ef-extra.lz4")
        shutil.copyfile(path, extra)
        expect = [f"node 1: damaged: {extra}: not in the set's manifest"]
    res = train(cl, job, STEPS, load=ck, stop_after_load=True,
                timeout_ms=FAIL_MS)
    assert_failed_everywhere(res, "load_error", expect)
    res = train(cl, job, FRESH)
    assert_same_as_whole(res, whole, 0, FRESH,
                         f"a fresh run after the failed load ({harm})")


# -- 4. a snapshot that cannot be written -------------------------------------


def test_state_dict_fails_when_a_node_cannot_save(make_cluster, tmp_path):
    """Node 1's state_dir is a 16 KiB tmpfs (mode 0700), too small for the
    job's snapshot (ENOSPC): state_dict() raises ObcommError on every rank
    (same code), naming node 1. Needs root (skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    small = tmp_path / "state1"
    os.mkdir(small)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=0700",
                        "tmpfs", str(small)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount tmpfs: {r.stderr.strip()}")
    cl = None
    try:
        cl = make_2x2(make_cluster, tmp_path, state_dir=True,
                      timeout_ms=FAIL_MS)
        res = train(cl, "full", SAVE, save={SAVE: str(tmp_path / "ck")},
                    timeout_ms=FAIL_MS)
        assert_failed_everywhere(res, "save_error", ["node 1"])
    finally:
        # The daemons go before the mount. Their exit status is not
        # checked here: a shutdown may fail to write into the full tmpfs.
        if cl is not None:
            for n in range(cl.k):
                cl.kill_node(n, signal.SIGTERM)
        if subprocess.run(["umount", str(small)]).returncode != 0:
            subprocess.run(["umount", "-l", str(small)])


# -- 5. a failed op stops the run ---------------------------------------------


def test_failed_op_stops_the_run(make_cluster, tmp_path):
    """2x2, no state_dir. Ops 0..4 are good allreduces; at op 5 rank 3
    issues an allreduce of 17 elements, the others of 16: OBCOMM_E_MISMATCH
    on every rank. Every rank then issues an allreduce, a 1-bit allreduce
    and a barrier: each raises ObcommError on every rank, naming the first
    failure ("op 5") and saying the run "cannot continue". New processes
    of the same job (a new run) then work normally: exact allreduce, and
    the 1-bit allreduce from zero error feedback (the values of
    test_collectives.onebit_expected)."""
    import obcomm
    cl = make_2x2(make_cluster, tmp_path, state_dir=False,
                  timeout_ms=FAIL_MS)
    res = cl.run("stop", "failed_op", TRAINERS,
                 args={"bad": 5, "timeout_ms": FAIL_MS}, timeout=120)
    for r in res:
        first = r["first"]
        assert first is not None, f"rank {r['rank']}: op 5 succeeded"
        assert first["code"] == obcomm.comm.E_MISMATCH, first
    for r in res:
        for name, err in r["later"]:
            assert err is not None, \
                f"rank {r['rank']}: {name} after the failed op 5 succeeded"
            for f in ("op 5", "cannot continue"):
                assert f in err["message"], (r["rank"], name, err)
    res = cl.run("stop", "healthy_ops", TRAINERS,
                 args={"timeout_ms": FAIL_MS}, timeout=120)
    want = onebit_expected()
    for r in res:
        assert torch.equal(r["allreduce"], torch.full((16,), 10.0))
        for got, exp in zip(r["1bit"], want):
            assert torch.equal(got, exp), r["rank"]
