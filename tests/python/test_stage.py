"""The optimizers' stage: opt.stage after each step, one INFO line on
every rank when it changes (with the bytes a node sends per step before
and after), one WARNING when a run that never left the warm-up is saved or
ends, and each job's 1-bit keys in obcommctl status with the bytes a node
sends per op (stage_workers.py)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "stage_workers.py")

# The model of stage_workers.py: 8*4 + 4 + 4*2 + 2 parameters.
COUNT = 46
# On 2 nodes: fp32 ring 2 * 1 * 23 floats; 1-bit: padded to 48 (a multiple
# of 2 * lcm(2, 8)), chunk 24: 2 * 1 * (24 / 8 bytes of signs + a scale).
FP32, ONEBIT = 184, 14


def _run(cl, job, opt, kw, steps, saves=0):
    res = cl.run(job, "stages", 1, script=SCRIPT,
                 args={"opt": opt, "kw": kw, "steps": steps, "saves": saves})
    assert res[0]["stages"] == res[1]["stages"]
    assert res[0]["lines"] == res[1]["lines"]
    return res[0]


def test_onebit_adam_stage_and_line(make_cluster):
    cl = make_cluster(2)
    r = _run(cl, "adam", "adam", {"freeze_step": 3}, 5, saves=1)
    assert r["stages"] == ["warmup"] * 4 + ["compressed"] * 2
    assert r["lines"] == [(
        "INFO", f"OneBitAdam: step 4 was the first compressed step "
        f"(freeze_step 3): a step now sends {ONEBIT} bytes per node instead "
        f"of about {FP32} (1-bit momentum instead of fp32 gradients; 1 "
        f"bucket(s), 2 node(s))")]
    # The daemon's view of the key: its elements and bytes per 1-bit op.
    assert [(k["key"], k["count"], k["op_bytes"]) for k in r["keys"]] == \
        [(1, COUNT, ONEBIT)]
    assert r["text"][0].startswith(
        f"key 1: {COUNT} elements, {ONEBIT} bytes sent per 1-bit op "
        f"(fp32 ring: about {FP32}), zero + 2 steps")


def test_warmup_only_run_says_so_once(make_cluster):
    cl = make_cluster(2)
    r = _run(cl, "short", "adam", {"freeze_step": 100}, 3, saves=2)
    assert r["stages"] == ["warmup"] * 4
    assert r["lines"] == [(
        "WARNING", "OneBitAdam: state_dict() taken at step 3, still in the "
        "warm-up (freeze_step 100): no step was compressed; every step so "
        "far averaged full-precision gradients. A run shorter than "
        "freeze_step never compresses: set it below the run's length")]
    r = _run(cl, "end", "lamb", {"freeze_step": 100}, 2)
    assert r["lines"] == [(
        "WARNING", "OneBitLamb: the run ended at step 2, still in the "
        "warm-up (freeze_step 100): no step was compressed; every step so "
        "far averaged full-precision gradients. A run shorter than "
        "freeze_step never compresses: set it below the run's length")]


def test_onebit_lamb_stage_and_line(make_cluster):
    cl = make_cluster(2)
    r = _run(cl, "lamb", "lamb", {"freeze_step": 3}, 5)
    assert r["stages"] == ["warmup"] * 4 + ["compressed"] * 2
    assert r["lines"] == [(
        "INFO", f"OneBitLamb: step 4 was the first compressed step "
        f"(freeze_step 3): a step now sends {ONEBIT} bytes per node instead "
        f"of about {FP32} (1-bit momentum instead of fp32 gradients; 1 "
        f"param group(s), 2 node(s))")]


def test_zero_one_adam_stages_and_lines(make_cluster):
    cl = make_cluster(2)
    r = _run(cl, "zo", "zoadam", {"var_update_scaler": 2,
                                  "var_freeze_step": 6}, 8)
    changes = [(i, s) for i, s in enumerate(r["stages"])
               if i and s != r["stages"][i - 1]]
    assert [s for _, s in changes] == ["compressed", "local_steps"], \
        r["stages"]
    assert len(r["lines"]) == 2, r["lines"]
    (l1, t1), (l2, t2) = r["lines"]
    assert l1 == l2 == "INFO"
    assert t1.startswith(f"ZeroOneAdam: from step {changes[0][0]} "
                         f"var_interval is 2: steps between variance "
                         f"updates average 1-bit, {ONEBIT} bytes per node "
                         f"instead of about {FP32} for an fp32 step"), t1
    assert t2.startswith(f"ZeroOneAdam: step {changes[1][0]} passed "
                         f"var_freeze_step 6: local steps now, with a 1-bit "
                         f"synchronization of {ONEBIT} bytes per node"), t2
