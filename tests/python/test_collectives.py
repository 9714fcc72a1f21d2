"""Every collective of obcomm.Communicator on torch tensors, 2 nodes x 2
trainers (real daemons, real processes), against exact values."""

import numpy as np
import torch

import workers
from workers import DTYPES, values

NODES, TRAINERS = 2, 2
SIZE = NODES * TRAINERS


def expected(dt, op):
    xs = [values(r, torch.int64) for r in range(SIZE)]
    if op == "sum":
        want = sum(xs)
    elif op == "max":
        want = torch.stack(xs).max(0).values
    elif op == "min":
        want = torch.stack(xs).min(0).values
    else:  # avg: sum / size, integers truncate toward 0
        s = sum(xs)
        if dt.is_floating_point:
            return (s.double() / SIZE).to(dt)
        return torch.div(s, SIZE, rounding_mode="trunc").to(dt)
    return want.to(dt)


def onebit_expected():
    """docs/design.md, "The compressed allreduce, exactly", by hand for
    the inputs of workers.onebit_input, 2 nodes: each node's average is
    c * s_node, so the worker scale is c and no worker error remains.
    Server m = (c s0 + c s1) / 2 is +-c where the signs agree (i % 4 == 0,
    a quarter of every chunk) and 0 elsewhere:
    sscale = sqrt(c^2 / 4) = c / 2, the result is +-c/2 where they agree
    and +c/2 elsewhere (0 counts as +), and the server error is m - that:
    +-c/2 or -c/2. The second op on the key: m = +-3c/2 (agree) or -c/2,
    sscale = sqrt((9/4 c^2 + 3 * 1/4 c^2) / 4) = sqrt(3/4) c."""
    c = workers.ONEBIT_C
    s0, s1 = workers.onebit_signs(0), workers.onebit_signs(1)
    agree = s0 == s1
    first = torch.where(agree, s0 * c / 2, torch.tensor(c / 2))
    sscale = np.float32(np.sqrt(0.75 * c * c))
    second = torch.where(agree, s0 * float(sscale), -torch.tensor(float(sscale)))
    return first.float(), second.float()


def test_collectives_exact(make_cluster):
    cl = make_cluster(NODES)
    res = cl.run("coll", "collectives", TRAINERS, timeout=240)
    assert sorted(r["rank"] for r in res) == list(range(SIZE))
    for r in res:
        assert r["size"] == SIZE
        assert r["local"] == (r["rank"] % TRAINERS, TRAINERS)
        for dt in DTYPES:
            for op in ("sum", "avg", "max", "min"):
                want = expected(dt, op)
                for where in ("shm", "plain"):
                    got = r[(str(dt), op, where)]
                    assert got.dtype == dt
                    assert torch.equal(got, want), (dt, op, where, r["rank"])
        x = sum(values(q, torch.float32, 30) for q in range(SIZE))
        assert torch.equal(r["noncontig"], x.reshape(5, 6).t())
        for dt in DTYPES:
            for root in (0, SIZE - 1):
                for where in ("shm", "plain"):
                    got = r[("bcast", str(dt), root, where)]
                    assert torch.equal(got, values(root, dt)), (dt, root, where)
        first, second = onebit_expected()
        for where in ("shm", "plain"):
            a, b = r[("1bit", where)]
            assert torch.equal(a, first), where
            assert torch.equal(b, second), where
