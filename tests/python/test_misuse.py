"""Combinations that would average gradients twice, race the optimizer's
sends or share its error feedback are refused on every rank with the same
message, naming what to do (misuse_workers.py)."""

import os

import ports

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "misuse_workers.py")


def test_refusals_on_every_rank(make_cluster):
    cl = make_cluster(2)
    port = ports.reserve(1)[0]
    res = cl.run("misuse", "misuse", 1, args={"port": port}, script=SCRIPT,
                 timeout=300)
    assert len(res) == 2
    for case in res[0]:
        assert res[1][case] == res[0][case], case
    r = res[0]
    for case, name in (("ddp_onebit_adam", "OneBitAdam"),
                       ("ddp_onebit_adam_no_overlap", "OneBitAdam"),
                       ("ddp_zero_one_adam", "ZeroOneAdam"),
                       ("ddp_onebit_lamb", "OneBitLamb")):
        assert r[case] == (
            f"RuntimeError: {name}: the model is wrapped in "
            f"torch.nn.parallel.DistributedDataParallel, which averages the "
            f"gradients that {name} averages itself: every step would "
            f"average them twice, and DDP's copy into the gradients races "
            f"the optimizer's sends. Drop the DDP wrapper and pass the bare "
            f"model's parameters to {name} (it starts every rank from rank "
            f"0's parameters, as DDP does; accumulate gradients with "
            f"OneBitAdam's no_sync() or by calling step() less often)"), case
    assert r["ddp_hook_onebit_adam"] is not None
    assert ("obcomm.torch.allreduce_hook: the DDP bucket holds a parameter "
            "that OneBitAdam (key 10) trains; OneBitAdam averages its "
            "gradients itself, so DDP would average them twice and race its "
            "sends. allreduce_hook is for DDP with torch's own optimizers "
            "(torch.optim.Adam); with OneBitAdam drop DDP and its hook and "
            "pass the bare model's parameters to OneBitAdam"
            in r["ddp_hook_onebit_adam"]), r["ddp_hook_onebit_adam"]
    assert r["same_params"] == (
        "ValueError: ZeroOneAdam: parameter 0 ((4, 8)) is already trained by "
        "OneBitAdam (key 20); each parameter needs one obcomm optimizer, or "
        "two would update it and average its gradient twice per step: "
        "close() the other optimizer first, or give each its own "
        "parameters")
    assert r["same_key"] == (
        "ValueError: OneBitLamb: key 20 of job 'misuse' is already "
        "OneBitAdam (key 20)'s; the daemons keep one error feedback per job "
        "and key, which two optimizers would corrupt: construct this one "
        "with key=21 or above (it takes 1 key(s) from there)")
    assert r["allreduce_grad"] == (
        "ValueError: obcomm: Communicator.allreduce on a gradient of "
        "OneBitAdam (key 20): the optimizer averages its gradients itself "
        "in step(), so this would average them twice; drop this collective "
        "(to accumulate gradients over several backward passes use the "
        "optimizer alone, or OneBitAdam's no_sync())")
    assert r["allreduce_1bit_key"] == (
        "ValueError: obcomm: Communicator.allreduce_1bit with key 20 of job "
        "'misuse', which is OneBitAdam (key 20)'s: the daemons keep one "
        "error feedback per job and key, and this would corrupt the "
        "optimizer's; use a key outside every optimizer's range")
    assert r["reset_1bit_key"].startswith(
        "ValueError: obcomm: Communicator.reset_1bit with key 20 of job")
    assert r["after_close"] == 1
    assert r["torch_optimizer"] == (
        "RuntimeError: OneBitAdam: its parameters are also in the param "
        "groups of SGD, which would update them a second time each step; "
        "give every parameter one optimizer (build the other over the "
        "parameters OneBitAdam does not train)")


def test_nan_near_the_freeze_names_it(make_cluster):
    """A NaN or Inf in a 1-bit average a few steps after the freeze: every
    rank's ObcommError says the freeze may be too early, or lr too high."""
    import obcomm
    cl = make_cluster(2)
    for opt in ("adam", "lamb", "zoadam"):
        res = cl.run("nan-" + opt, "nan_near_freeze", 1, args={"opt": opt},
                     script=SCRIPT)
        assert res[0] is not None and res[1] is not None, res
        assert res[0]["step"] == res[1]["step"], res
        for r in res:
            assert r["code"] == obcomm.comm.E_NONFINITE, r
        step = res[0]["step"]
        if opt == "zoadam":
            hint = (f"; ZeroOneAdam step {step} is early in 0/1 Adam's "
                    f"schedule (1-bit averages start once var_interval "
                    f"passes 1, after var_update_scaler=2 variance "
                    f"updates): the variance had little time to settle, or "
                    f"lr is too high for this model; raise "
                    f"var_update_scaler or lower lr")
        else:
            name = {"adam": "OneBitAdam", "lamb": "OneBitLamb"}[opt]
            assert step == 4, res
            hint = (f"; {name} step 4 is 1 step(s) after freeze_step 3: the "
                    f"variance was likely frozen before it settled, or lr "
                    f"is too high for this model; raise freeze_step (a few "
                    f"hundred steps at least) or lower lr")
        for r in res:
            assert r["str"].endswith(hint), r["str"]


def test_new_group_of_some_ranks_refused_at_once(make_cluster):
    """2 nodes x 2 trainers over the "obcomm" process group: new_group of
    ranks [0, 1] raises the same ValueError on all 4 ranks (members and
    not) without waiting in torch's barrier; over Gloo it works."""
    cl = make_cluster(2)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports.reserve(1)[0])}
    res = cl.run("subgroup", "subgroup", 2, script=SCRIPT, timeout=120,
                 env=env)
    want = ("ValueError: obcomm: new_group(ranks=[0, 1]) of 2 of the 4 "
            "ranks: the \"obcomm\" backend serves only groups of the whole "
            "world (every rank refuses this at once). Use the default "
            "group, or give the subgroup another backend: "
            "new_group(ranks, backend=\"gloo\")")
    for rank, r in enumerate(res):
        assert r["error"] == want, r
        assert r["error_kw"] == want, r
        # Refused without a collective (generous: no wall-clock claim
        # beyond "not a barrier timeout").
        assert r["seconds"] < 60, r
        assert r["gloo"] == ([2.0] * 3 if rank < 2 else [1.0] * 3), r
        assert r["world"] == [4.0] * 3, r
