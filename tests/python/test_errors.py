"""Errors: a wrong WORLD_SIZE names both numbers; a dead daemon raises
ObcommError and never hangs."""

import os
import signal
import time

import pytest
import torch

import cluster


class Deadline:
    """Fails the test (instead of hanging) if the block takes longer."""

    def __init__(self, seconds):
        self.seconds = seconds

    def _fire(self, *_):
        raise AssertionError(f"still waiting after {self.seconds} s")

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._fire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)
        return False


def test_wrong_world_size(make_cluster):
    """2 nodes x 1 trainer, but torchrun says WORLD_SIZE 3."""
    import obcomm
    cl = make_cluster(2)
    res = cl.run("ws", "world_size_mismatch", 1, env={"WORLD_SIZE": "3"},
                 timeout=60)
    for r in res:
        assert r is not None, "the Communicator was created"
        assert r["code"] == obcomm.comm.E_INVAL
        assert "WORLD_SIZE is 3" in r["message"]
        assert "obcomm world has 2 trainers (2 nodes x local_size 1)" \
            in r["message"]
    # In this process too, with the error's attributes.
    with pytest.raises(obcomm.ObcommError) as e:
        with Deadline(30):
            import os
            os.environ["WORLD_SIZE"] = "5"
            try:
                obcomm.Communicator(socket=cl.sock(0), job="ws2",
                                    local_size=1, timeout_ms=3000)
            finally:
                del os.environ["WORLD_SIZE"]
    assert "WORLD_SIZE is 5" in str(e.value)


def test_no_daemon():
    import obcomm
    with Deadline(30):
        with pytest.raises(obcomm.ObcommError) as e:
            obcomm.Communicator(socket="/nonexistent/obcommd.sock", job="x")
    assert e.value.code < 0
    assert "/nonexistent/obcommd.sock" in e.value.message


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_dead_daemon_raises(make_cluster, sig):
    """The trainer's own daemon dies: the next collective raises peer lost,
    naming the daemon's socket, whether it shut down cleanly (SIGTERM: it
    said goodbye) or vanished (SIGKILL), and what to run; so does every
    later one, promptly."""
    import obcomm
    import signal
    cl = make_cluster(1)
    with Deadline(60):
        comm = obcomm.Communicator(socket=cl.sock(0), job="dead",
                                   timeout_ms=3000)
        t = comm.empty(1000)
        t.fill_(1)
        comm.allreduce(t)
        assert t[0].item() == 1.0
        cl.kill_node(0, getattr(signal, sig))
        if sig == "SIGKILL":
            gone = (f"obcommd at {cl.sock(0)} vanished without a goodbye "
                    f"(killed or crashed): run `systemctl status obcommd` "
                    f"(and `journalctl -u obcommd`) on this node to see why, "
                    f"then resume the job from its last checkpoint")
        else:
            gone = (f"obcommd at {cl.sock(0)} shut down cleanly (it received "
                    f"SIGTERM and shut down) and closed the connection: "
                    f"start it again (systemctl status obcommd shows it) and "
                    f"resume the job from its last checkpoint")
        for i in range(2):
            t0 = time.monotonic()
            with pytest.raises(obcomm.ObcommError) as e:
                comm.allreduce(t)
            assert e.value.code == obcomm.comm.E_PEER_LOST, e.value
            want = gone if i == 0 else (
                "connection to obcommd unusable after an earlier failure: " +
                gone)
            assert e.value.message == want
            assert time.monotonic() - t0 < 30
        comm.close()


def test_dead_peer_daemon_raises(make_cluster):
    """2 nodes; node 1's daemon is killed while node 0's trainer runs an
    allreduce: it fails within the deadline with an ObcommError."""
    import obcomm
    cl = make_cluster(2, timeout_ms=3000)
    with Deadline(60):
        comm = obcomm.Communicator(socket=cl.sock(0), job="peer",
                                   timeout_ms=3000)
        cl.kill_node(1)
        t = torch.ones(4096)
        with pytest.raises(obcomm.ObcommError) as e:
            comm.allreduce(t)
        assert e.value.code in (obcomm.comm.E_PEER_LOST,
                                obcomm.comm.E_TIMEOUT), e.value
        assert e.value.message
        comm.close()


def test_optimizer_with_dead_daemon(make_cluster):
    """OneBitAdam's step raises ObcommError when the daemon is gone."""
    import obcomm
    import obcomm.torch
    cl = make_cluster(1)
    with Deadline(60):
        comm = obcomm.Communicator(socket=cl.sock(0), job="optdead",
                                   timeout_ms=3000)
        model = torch.nn.Linear(10, 3)
        opt = obcomm.torch.OneBitAdam(model.parameters(), comm=comm)
        model(torch.ones(2, 10)).sum().backward()
        opt.step()
        cl.kill_node(0)
        model(torch.ones(2, 10)).sum().backward()
        with pytest.raises(obcomm.ObcommError):
            opt.step()
        opt.close()
        comm.close()


def test_cluster_helper_cleans_up():
    """The fixture's daemons are gone after a failing block (the
    Cluster context manager stops them on the way out)."""
    c = cluster.Cluster(1)
    with pytest.raises(RuntimeError):
        with c:
            raise RuntimeError("boom")
    assert all(p is None for p in c.procs)


def test_mismatch_names_the_optimizer_calls():
    """A mismatch of op kinds says which OneBitAdam call issues each kind
    (rank 0 alone called state_dict()); .message stays the daemon's."""
    import obcomm
    msg = ("op 9 of job j: ranks issued different ops: op differs: rank 0 "
           "(node 0) has snapshot_1bit, rank 1 (node 1) has allreduce_1bit")
    e = obcomm.ObcommError(obcomm.comm.E_MISMATCH, msg)
    assert e.message == msg
    assert str(e) == (
        f"{obcomm.strerror(obcomm.comm.E_MISMATCH)}: {msg} (with OneBitAdam: "
        "snapshot_1bit is OneBitAdam.state_dict(), allreduce_1bit is "
        "OneBitAdam.step() in the compression stage; every rank must make "
        "the same calls in the same order)")
    other = "op 1 of job j: ranks issued different ops: count differs: x"
    assert str(obcomm.ObcommError(obcomm.comm.E_MISMATCH, other)).endswith(
        other)


def test_error_codes_are_the_headers():
    """obcomm.comm.E_* are read from libobcomm (obcomm_err_name): every
    OBCOMM_E_* of include/obcomm.h, with its value, and nothing else."""
    import re
    import obcomm
    with open(os.path.join(cluster.ROOT, "include", "obcomm.h")) as f:
        header = {m.group(1): int(m.group(2)) for m in re.finditer(
            r"^#define OBCOMM_(E_[A-Z_]+)\s+\((-\d+)\)", f.read(), re.M)}
    codes = {k: v for k, v in vars(obcomm.comm).items()
             if re.fullmatch(r"E_[A-Z_]+", k)}
    assert len(header) >= 15
    assert codes == header


def test_tensor_outlives_close(make_cluster):
    """A tensor from comm.empty() used after close() is plain memory with
    its values (not unmapped under it); collectives on the closed
    communicator raise ObcommError; the memory goes with the tensor."""
    import gc
    import obcomm
    cl = make_cluster(1)
    with Deadline(60):
        comm = obcomm.Communicator(socket=cl.sock(0), job="outlive",
                                   timeout_ms=5000)
        t = comm.empty((256, 1024))
        t.fill_(3.0)
        comm.allreduce(t)
        view = t[7]
        kept = comm.empty(1000)          # dies before close: freed as usual
        del kept
        comm.close()
        assert float(t.sum()) == 3.0 * 256 * 1024
        view.fill_(5.0)                  # writable, no crash
        assert float(t[7].sum()) == 5.0 * 1024
        with pytest.raises(obcomm.ObcommError) as e:
            comm.allreduce(t)
        assert e.value.code == obcomm.comm.E_INVAL
        assert "closed" in e.value.message
        # Another connection takes the old tensor like any tensor (staged).
        with obcomm.Communicator(socket=cl.sock(0), job="outlive2",
                                 timeout_ms=5000) as c2:
            assert not c2.is_shared(t)
            c2.allreduce(t)
            assert float(t[7].sum()) == 5.0 * 1024
        del t, view
        gc.collect()
