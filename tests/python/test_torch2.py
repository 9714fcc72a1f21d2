"""The backend "obcomm" the torch 2 way, 2 nodes x 2 trainers on real
daemons: registered for "cpu" with init_process_group("obcomm") and
("cpu:obcomm"), a DeviceMesh over the world, the functional collectives
exact and counted in the daemons' metrics, and a torch.compile'd model
under DDP."""

import os

import torch

import cluster
import ports
from test_torch_backend import reduced
from workers import COUNT, values

NODES, TRAINERS = 2, 2
SIZE = NODES * TRAINERS
SCRIPT = os.path.join(cluster.HERE, "torch2_workers.py")


def run(cl, job, func, args=None, **kw):
    port = ports.reserve(1)[0]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OBCOMMCTL": cluster.OBCOMMCTL}
    return cl.run(job, func, TRAINERS, args=args, env=env, script=SCRIPT,
                  **kw)


def check_functional(r):
    got = r["functional"]
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
        d = str(dt)
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and not dt.is_floating_point:
                continue
            want = reduced([values(q, dt) for q in range(SIZE)], dt, op)
            t = got[("all_reduce", d, op)]
            assert t.dtype == dt and torch.equal(t, want), (d, op)
        want = torch.cat([values(q, dt) for q in range(SIZE)])
        parts = [values(q, dt, SIZE * COUNT).split(COUNT)[r["rank"]]
                 for q in range(SIZE)]
        for k in ("all_gather_tensor", "all_gather_single"):
            assert torch.equal(got[(k, d)], want), (k, d)
        for k in ("reduce_scatter_tensor", "reduce_scatter_single"):
            assert torch.equal(got[(k, d)], reduced(parts, dt, "sum")), \
                (k, d)
    s = reduced([values(q, torch.float32) for q in range(SIZE)],
                torch.float32, "sum")
    assert all(torch.equal(t, s * (4 - i))
               for i, t in enumerate(got["in_flight"]))


def test_registration_mesh_functional(make_cluster):
    """Both spellings of the backend, each with the DeviceMesh and every
    functional collective; every functional collective is one op of each
    node's daemon (the barrier that closes the count is one more)."""
    cl = make_cluster(NODES)
    for spec in ("obcomm", "cpu:obcomm"):
        res = run(cl, "t2reg" + spec.replace(":", "_"), "registration",
                  {"spec": spec}, timeout=240)
        assert sorted(r["rank"] for r in res) == list(range(SIZE))
        for r in res:
            assert r["size"] == SIZE
            assert r["backend"] == spec
            assert r["capability"] == ["cpu"]
            assert r["world_is_obcomm"] and r["group_name"]
            assert torch.equal(r["all_reduce"], reduced(
                [values(q, torch.float32) for q in range(SIZE)],
                torch.float32, "sum"))
            assert r["mesh_group_is_world"] and r["mesh_shape"] == (SIZE,)
            check_functional(r)
        counted = [r for r in res if "ops_delta" in r]
        assert len(counted) == NODES
        for r in counted:
            assert r["ops_delta"] == r["functional_calls"] + 1, r["ops_delta"]


def test_compiled_ddp(make_cluster):
    """torch.compile(DDP(model)) over obcomm trains as eager DDP over
    obcomm does: the parameters moved, every rank ends bitwise equal, and
    within 1e-5 relative of eager (the compiled kernels may round
    differently)."""
    cl = make_cluster(NODES)
    res = run(cl, "t2comp", "compiled_ddp",
              {"steps": 4, "backend": os.environ.get(
                  "OBCOMM_TEST_COMPILE_BACKEND", "inductor")},
              timeout=900)
    assert len({r["compiled_digest"] for r in res}) == 1
    for r in res:
        moved = any(not torch.equal(a, b)
                    for a, b in zip(r["start"], r["compiled"]))
        assert moved
        for a, b in zip(r["eager"], r["compiled"]):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), \
                (a - b).abs().max().item()
