"""The torch.distributed backend "obcomm", registered when obcomm.torch is
imported:

    import obcomm.torch
    torch.distributed.init_process_group("obcomm")   # under torchrun
    model = torch.nn.parallel.DistributedDataParallel(model)

ProcessGroupObcomm is a ProcessGroup written in Python (torch's bindings
call a Python subclass's methods, from Python and from C++). It serves
all_reduce (SUM, AVG, MAX, MIN on float32, float64, float16, bfloat16,
int32, int64), broadcast, all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor and barrier on CPU tensors, over the
process's obcomm connection (the one obcomm.Communicator() shares), so
OneBitAdam and the process group use one join of the job. Every op is
non-blocking underneath: its Work's future is completed by the
connection's progress thread (progress.py).

What a method returns depends on who calls it, because of how torch 1.13
keeps Python objects that C++ holds. torch.distributed's Python functions
(dist.all_reduce(..., async_op=True) and the rest) get a Work of this
module: wait() and get_future().wait() raise obcomm.ObcommError when the
daemon fails the op. C++ callers (DDP's reducer, its parameter broadcast
and checks) get a Work made in C++ around the same future
(_create_work_from_future): torch 1.13 lets go of a Python Work that only
C++ holds, after which C++ would see the base class (wait() never returns,
get_future() throws). There a failure reaches DDP as the RuntimeError that
torch makes of the ObcommError ("... ObcommError: ..."), when DDP reads
the future's value: that Work's wait() in torch 1.13 returns even when its
future failed (DDP's broadcast of the parameters at construction waits
that way; the first backward then raises).
"""

import inspect
import json
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from .comm import (Communicator, ObcommError, E_INVAL, E_PEER_LOST,
                   E_TIMEOUT)
from . import progress

try:
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError:  # a torch that keeps Python Works alive needs none
    _create_work_from_future = None

__all__ = ["ProcessGroupObcomm", "Work"]

_C10D = "torch.distributed.distributed_c10d"

_REDUCE_OPS = [("SUM", "sum"), ("AVG", "avg"), ("MAX", "max"), ("MIN", "min")]


def _reduce_op(opts):
    if opts is None:
        return "sum"
    for name, ours in _REDUCE_OPS:
        op = getattr(dist.ReduceOp, name, None)
        if op is not None and opts.reduceOp == op:
            return ours
    raise ValueError(f"obcomm: reduce op {opts.reduceOp} is not supported "
                     "(SUM, AVG, MAX, MIN)")


def _single(tensors, what):
    if len(tensors) != 1:
        raise ValueError(f"obcomm: {what} takes one tensor per process, not "
                         f"{len(tensors)}")
    return tensors[0]


class Work(dist.Work):
    """An obcomm op as torch.distributed's functions return it: wait()
    blocks until the progress thread completed it and raises
    obcomm.ObcommError (.code, .message) if the daemon failed it; so does
    get_future().wait(). A callback on the future runs on the progress
    thread and must not wait for another obcomm op."""

    def __init__(self, op):
        super().__init__()
        self._op = op

    def wait(self, timeout=None):
        op = self._op
        if not op.done:
            if progress.on_progress_thread():
                raise RuntimeError(
                    "obcomm: Work.wait() in a callback of an obcomm future "
                    "would wait forever (callbacks run on the progress "
                    "thread, which completes the ops)")
            seconds = None
            if isinstance(timeout, timedelta) and timeout > timedelta(0):
                seconds = timeout.total_seconds()
            if not op.event.wait(seconds):
                raise ObcommError(E_TIMEOUT, f"Work.wait: the op was not "
                                  f"complete after {seconds} s")
        e = op.error
        if e is not None:
            if isinstance(e, ObcommError):
                raise ObcommError(e.code, e.message)
            raise e
        return True

    def get_future(self):
        return self._op.future

    def is_completed(self):
        return self._op.done

    def is_success(self):
        return self._op.done and self._op.error is None

    def exception(self):
        return self._op.error

    def result(self):
        self.wait()
        return self._op.value

    def synchronize(self):
        pass


def _value_or_raise(fut):
    return fut.wait()


def _work(op):
    """The Work for the caller of a ProcessGroupObcomm method (see the
    module's docstring); frame 2 is that caller."""
    try:
        caller = sys._getframe(2).f_globals.get("__name__")
    except ValueError:  # called from C++ on a thread without Python frames
        caller = None
    if caller == _C10D or _create_work_from_future is None:
        return Work(op)
    return _create_work_from_future(op.future.then(_value_or_raise))


class ProcessGroupObcomm(dist.ProcessGroup):
    """torch.distributed's process group over obcomm (see the module's
    docstring). Its rank and size are obcomm's: rank = node_rank *
    local_size + local_rank of the node's obcommd, which torch's must
    equal. `comm` is the process's obcomm.Communicator."""

    def __init__(self, comm, rank, size):
        super().__init__(rank, size)
        self.comm = comm

    def getBackendName(self):
        return "obcomm"

    def allreduce(self, tensors, opts=None):
        t = _single(tensors, "all_reduce")
        return _work(self.comm._iallreduce(t, _reduce_op(opts), tensors))

    def broadcast(self, tensors, opts=None):
        t = _single(tensors, "broadcast")
        root = 0
        if opts is not None:
            if opts.rootTensor != 0:
                raise ValueError("obcomm: broadcast takes one tensor per "
                                 "process (rootTensor 0)")
            root = opts.rootRank
        return _work(self.comm._ibroadcast(t, root, tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = _single(input_tensors, "all_gather")
        outs = _single(output_tensors, "all_gather")
        return _work(self.comm._iallgather(outs, t, output_tensors))

    def _allgather_base(self, output, input, opts=None):
        return _work(self.comm._iallgather(output, input, [output]))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _single(output_tensors, "reduce_scatter")
        ins = _single(input_tensors, "reduce_scatter")
        return _work(self.comm._ireduce_scatter(out, ins, _reduce_op(opts),
                                                output_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        return _work(self.comm._ireduce_scatter(output, input,
                                                _reduce_op(opts), [output]))

    def barrier(self, opts=None):
        return _work(self.comm._ibarrier([]))

    def __del__(self):
        # torch drops the group at destroy_process_group(); the connection
        # stays while OneBitAdam or a Communicator still holds it.
        try:
            self.comm.close()
        except Exception:
            pass

    def __repr__(self):
        return (f"<obcomm.ProcessGroupObcomm rank {self.comm.rank} of "
                f"{self.comm.size}, job {self.comm.job!r}>")


def _create(store, rank, size, timeout):
    """The backend's constructor, as torch.distributed calls it with the
    group's store, rank, size and timeout. Every rank of the group gets the
    same outcome: the group, or an ObcommError naming the ranks that
    failed to join or that obcomm numbers differently from torch."""
    default = getattr(dist, "default_pg_timeout", None)
    if not isinstance(timeout, timedelta):
        timeout = default if isinstance(default, timedelta) else \
            timedelta(minutes=30)
    timeout_ms = 0
    if timeout != default:
        timeout_ms = max(1, min(int(timeout.total_seconds() * 1000),
                                2**31 - 1))
    comm, failed = None, None
    try:
        comm = Communicator._from_env(timeout_ms)
        mine = {"rank": comm.rank, "size": comm.size,
                "local_rank": comm.local_rank,
                "local_size": comm.local_size, "job": comm.job}
    except ObcommError as e:
        failed = e
        mine = {"code": e.code, "message": e.message}
    try:
        everyone = _agree(store, rank, size, mine, timeout)
    except BaseException:
        if comm is not None:
            comm.close()
        raise
    err = _verdict(everyone, rank, size)
    if failed is not None:
        raise failed
    if err is not None:
        comm.close()
        raise err
    return ProcessGroupObcomm(comm, rank, size)


def _agree(store, rank, size, mine, timeout):
    """Publishes what obcomm made of this rank in the group's store and
    returns what it made of every rank, by torch rank. With env:// (and
    tcp://) torch rank 0 hosts the store: it leaves only after every rank
    has read, since a rank that is still inside torch's TCPStore()
    retries its connection until torch's timeout (30 minutes) once the
    host is gone."""
    keys = [f"obcomm/join/{r}" for r in range(size)]
    store.set(keys[rank], json.dumps(mine))
    t0 = time.monotonic()
    try:
        store.wait(keys, timeout)
    except RuntimeError as e:
        if time.monotonic() - t0 < timeout.total_seconds():
            raise ObcommError(
                E_PEER_LOST, f"torch.distributed's store failed while the "
                f"obcomm backend's ranks met: {e}") from None
        missing = [r for r, k in enumerate(keys) if not _present(store, k)]
        raise ObcommError(
            E_TIMEOUT, f"torch rank(s) {_ranks(missing)} of {size} did not "
            f"reach the obcomm backend within {timeout}") from None
    everyone = [json.loads(store.get(k)) for k in keys]
    if store.add("obcomm/read", 1) == size:
        store.set("obcomm/all_read", "1")
    if rank == 0:
        try:
            store.wait(["obcomm/all_read"], timeout)
        except RuntimeError:
            pass  # a rank died after reading; the others have what they need
    return everyone


def _present(store, key):
    try:
        store.wait([key], timedelta(milliseconds=1))
        return True
    except RuntimeError:
        return False


def _ranks(rs, most=8):
    s = ", ".join(str(r) for r in rs[:most])
    return s + (f" and {len(rs) - most} more" if len(rs) > most else "")


_HOW = ("start torchrun on each node with --node_rank set to the rank of "
        "that node's obcommd and --nproc_per_node to its trainers "
        "(LOCAL_WORLD_SIZE); obcomm serves only groups of the whole world "
        "in its rank order (new_group of other ranks needs another backend)")


def _verdict(everyone, rank, size):
    """The ObcommError that every rank raises for a group whose ranks did
    not all join, or that obcomm numbers differently from torch, naming
    them; None for a good group. A rank that failed to join raises its own
    error instead."""
    failed = [r for r, e in enumerate(everyone) if "code" in e]
    if failed:
        e = everyone[failed[0]]
        return ObcommError(
            e["code"], f"torch rank(s) {_ranks(failed)} of {size} could not "
            f"join obcomm; rank {failed[0]}: {e['message']}")
    wrong = [r for r, e in enumerate(everyone)
             if e["rank"] != r or e["size"] != size]
    if not wrong:
        return None
    me = everyone[rank]
    if rank in wrong:
        node = me["rank"] // me["local_size"]
        return ObcommError(
            E_INVAL, f"torch.distributed makes this process rank {rank} of "
            f"{size}, but obcomm makes it rank {me['rank']} of {me['size']} "
            f"(node {node} x local_size {me['local_size']} + local_rank "
            f"{me['local_rank']}, job {me['job']!r}): {_HOW}")
    pairs = ", ".join(f"{r} is obcomm's {everyone[r]['rank']} of "
                      f"{everyone[r]['size']}" for r in wrong[:8])
    return ObcommError(
        E_INVAL, f"torch.distributed and obcomm number torch rank(s) "
        f"{_ranks(wrong)} of {size} differently (torch rank {pairs}): "
        f"{_HOW}")


def process_group():
    """The default process group if it is obcomm's, else None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = dist.group.WORLD
    return pg if isinstance(pg, ProcessGroupObcomm) else None


def _register():
    if not dist.is_available() or "OBCOMM" in dist.Backend._plugins:
        return
    kwargs = {}
    try:
        # torch 2.x asks which devices a backend serves (else it assumes
        # cpu and cuda, with a warning); 1.13 has no such argument.
        if "devices" in inspect.signature(
                dist.Backend.register_backend).parameters:
            kwargs["devices"] = ["cpu"]
    except (TypeError, ValueError):
        pass
    dist.Backend.register_backend("obcomm", _create, **kwargs)


_register()
