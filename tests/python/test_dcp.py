"""The 1-bit optimizers under torch.distributed.checkpoint, 2 nodes x 2
trainers on real daemons: OneBitAdam, ZeroOneAdam and OneBitLamb, driven
by StepLR, save their state with the model's through dcp.save (DCP's
own collectives over the backend "obcomm") in the compression stage,
and a fresh model and optimizer that dcp.load it continue bit for bit."""

import os

import pytest

import cluster
import ports

NODES, TRAINERS = 2, 2
SCRIPT = os.path.join(cluster.HERE, "dcp_workers.py")


@pytest.mark.parametrize("kind", ["onebit", "zeroone", "lamb"])
def test_dcp_resume_bit_exact(make_cluster, tmp_path, kind):
    cl = make_cluster(NODES)
    port = ports.reserve(1)[0]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    res = cl.run("tdcp" + kind, "resume", TRAINERS,
                 args={"kind": kind, "save_at": 7, "until": 12,
                       "dir": str(tmp_path / "ckpt")},
                 env=env, script=SCRIPT, timeout=600)
    assert len(res) == NODES * TRAINERS
    for r in res:
        assert len(r["first"]) == 5
        assert r["second"] == r["first"], r["rank"]
        assert r["second_lrs"] == r["first_lrs"]
        # StepLR halved the rate at steps 3, 6, 9 and 12.
        assert r["first_lrs"][-1] < r["first_lrs"][0]
    assert len({r["first"][-1] for r in res}) == 1
