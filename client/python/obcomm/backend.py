"""The torch.distributed backend "obcomm", registered for the device "cpu"
when obcomm.torch is imported:

    import obcomm.torch
    torch.distributed.init_process_group("obcomm")   # or "cpu:obcomm"
    model = torch.nn.parallel.DistributedDataParallel(model)

ProcessGroupObcomm is a ProcessGroup written in Python (torch's bindings
call a Python subclass's methods, from Python and from C++). It serves
all_reduce (SUM, AVG, MAX, MIN on float32, float64, float16, bfloat16,
int32, int64), broadcast, all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor (and their coalesced forms, which
torch's functional collectives, DeviceMesh and FSDP2 use) and barrier on
CPU tensors, over the process's obcomm connection (the one
obcomm.Communicator() shares), so OneBitAdam and the process group use
one join of the job. Every op is non-blocking underneath: its Work's
future is completed by the connection's progress thread (progress.py).

Every caller gets a Work of this module: torch.distributed's Python
functions directly, C++ callers (DDP's reducer, functional collectives'
wait_tensor) through torch's holder, which keeps the Python Work alive
and calls its wait() and get_future(). wait() and get_future().wait()
raise obcomm.ObcommError when the daemon fails the op; a C++ caller sees
it as the RuntimeError torch makes of it ("... ObcommError: ...").
"""

import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .comm import (Communicator, ObcommError, E_INVAL, E_PEER_LOST,
                   E_TIMEOUT)
from . import progress

__all__ = ["ProcessGroupObcomm", "Work"]

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
    """One or more obcomm ops (a coalesced call issues one per tensor) as
    torch.distributed sees them: wait() blocks until the progress thread
    completed them all and raises obcomm.ObcommError (.code, .message) if
    the daemon failed one. get_future()'s value is `value` (the tensors
    torch expects); when an op failed, its wait() raises the RuntimeError
    torch makes of a failed future, whose message names the ObcommError
    ("... ObcommError: <what failed>: ..."), for C++ and Python callers
    alike. A callback on the future runs on the progress thread and must
    not wait for another obcomm op."""

    def __init__(self, ops, value):
        super().__init__()
        self._ops = ops
        self._value = value
        self._failing = None
        if len(ops) == 1:
            self._future = ops[0].future
        elif not ops:
            self._future = torch.futures.Future()
            self._future.set_result(value)
        else:
            self._future = torch.futures.collect_all(
                [op.future for op in ops]).then(self._all_done)

    def _all_done(self, fut):
        for f in fut.value():
            f.wait()  # raises the first op's error
        return self._value

    def wait(self, timeout=None):
        seconds = None
        if isinstance(timeout, timedelta) and timeout > timedelta(0):
            seconds = timeout.total_seconds()
        deadline = None if seconds is None else time.monotonic() + seconds
        for op in self._ops:
            if op.done:
                continue
            if progress.on_progress_thread():
                raise RuntimeError(
                    "obcomm: Work.wait() in a callback of an obcomm future "
                    "would wait forever (callbacks run on the progress "
                    "thread, which completes the ops)")
            left = None if deadline is None else max(
                0.0, deadline - time.monotonic())
            if not op.event.wait(left):
                raise ObcommError(E_TIMEOUT, f"Work.wait: the op was not "
                                  f"complete after {seconds} s")
        e = self.exception()
        if e is not None:
            if isinstance(e, ObcommError):
                raise ObcommError(e.code, e.message)
            raise e
        return True

    def get_future(self):
        # A future failed with set_exception() holds the exception as its
        # value, which C++ callers (DDP's reducer) would read as a result;
        # one whose callback raised is failed for C++ and Python alike.
        if self._failing is None:
            self._failing = self._future.then(_value_or_raise)
        return self._failing

    def is_completed(self):
        return all(op.done for op in self._ops)

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def exception(self):
        for op in self._ops:
            if op.error is not None:
                return op.error
        return None

    def result(self):
        self.wait()
        return self._value

    def synchronize(self):
        pass


def _value_or_raise(fut):
    return fut.wait()


def _failed(e, value):
    """An op that could not start (the job failed, the connection is
    closed), complete with its error: torch 2 callers, DDP's reducer
    among them, expect a failure from wait() and the future, not from
    the call that issues the op."""
    op = progress.Op(value)
    op.error = e
    op.future.set_exception(e)
    op.event.set()
    return op


def _start(start, value):
    try:
        return start()
    except ObcommError as e:
        return _failed(e, value)


def _work(start, value):
    """The Work of one op: start() issues it and returns its progress.Op."""
    return Work([_start(start, value)], value)


class ProcessGroupObcomm(dist.ProcessGroup):
    """torch.distributed's process group over obcomm (see the module's
    docstring). Its rank and size are obcomm's: rank = node_rank *
    local_size + local_rank of the node's obcommd, which torch's must
    equal. `comm` is the process's obcomm.Communicator."""

    def __init__(self, comm, rank, size):
        super().__init__(rank, size)
        self.comm = comm
        self._group_name = ""
        self._group_desc = ""

    def getBackendName(self):
        return "obcomm"

    def allreduce(self, tensors, opts=None):
        t = _single(tensors, "all_reduce")
        op = _reduce_op(opts)
        return _work(lambda: self.comm._iallreduce(t, op, tensors), tensors)

    def broadcast(self, tensors, opts=None):
        t = _single(tensors, "broadcast")
        root = 0
        if opts is not None:
            if opts.rootTensor != 0:
                raise ValueError("obcomm: broadcast takes one tensor per "
                                 "process (rootTensor 0)")
            root = opts.rootRank
        return _work(lambda: self.comm._ibroadcast(t, root, tensors), tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = _single(input_tensors, "all_gather")
        outs = _single(output_tensors, "all_gather")
        return _work(lambda: self.comm._iallgather(outs, t, output_tensors),
                     output_tensors)

    def _allgather_base(self, output, input, opts=None):
        return _work(lambda: self.comm._iallgather(output, input, [output]),
                     [output])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _single(output_tensors, "reduce_scatter")
        ins = _single(input_tensors, "reduce_scatter")
        op = _reduce_op(opts)
        return _work(lambda: self.comm._ireduce_scatter(out, ins, op,
                                                        output_tensors),
                     output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _reduce_op(opts)
        return _work(lambda: self.comm._ireduce_scatter(output, input, op,
                                                        [output]),
                     [output])

    def barrier(self, opts=None):
        return _work(lambda: self.comm._ibarrier([]), [])

    def gather(self, output_tensors, input_tensors, opts=None):
        """Rank root's output_tensors[0] gets every rank's tensor: an
        allgather whose other ranks keep nothing (gather_object and
        torch.distributed.checkpoint use it)."""
        t = _single(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        if self.rank() == root:
            outs = _single(output_tensors, "gather")
        else:
            outs = [torch.empty_like(t) for _ in range(self.size())]
        return _work(lambda: self.comm._iallgather(outs, t, output_tensors),
                     output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """Rank r's output_tensors[0] gets rank root's input_tensors[0][r]:
        a broadcast of root's tensors, each rank keeping its own. It
        completes before it returns (scatter_object_list, its caller in
        torch, waits at once)."""
        out = _single(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        size, n = self.size(), out.numel()
        if self.rank() == root:
            ins = _single(input_tensors, "scatter")
            if len(ins) != size or any(i.numel() != n or i.dtype != out.dtype
                                       for i in ins):
                raise ValueError(
                    f"obcomm: scatter: want {size} input tensors of {n} "
                    f"{out.dtype} elements, got "
                    f"{[(i.numel(), i.dtype) for i in ins]}")
            flat = torch.cat([i.reshape(-1) for i in ins])
        else:
            flat = torch.empty(size * n, dtype=out.dtype)
        op = _start(lambda: self.comm._ibroadcast(flat, root, [flat]),
                    [flat])
        op.event.wait()
        if op.error is None:
            r = self.rank()
            out.copy_(flat[r * n:(r + 1) * n].view_as(out))
        return Work([op], output_tensors)

    # torch 2's names for the one-tensor forms (dist.all_gather_into_tensor
    # and dist.reduce_scatter_tensor call these).
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """One all_gather_into_tensor per pair, issued in order (what
        functional collectives' all_gather_tensor and FSDP2 call)."""
        if len(outputs) != len(inputs):
            raise ValueError(f"obcomm: all_gather coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} "
                             f"inputs")
        return self._coalesced(
            outputs, [lambda o=o, i=i: self.comm._iallgather(o, i, None)
                      for o, i in zip(outputs, inputs)])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """One reduce_scatter_tensor per pair, issued in order."""
        if len(outputs) != len(inputs):
            raise ValueError(f"obcomm: reduce_scatter coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} "
                             f"inputs")
        op = _reduce_op(opts)
        return self._coalesced(
            outputs, [lambda o=o, i=i: self.comm._ireduce_scatter(o, i, op,
                                                                  None)
                      for o, i in zip(outputs, inputs)])

    def allreduce_coalesced(self, tensors, opts=None):
        """One all_reduce per tensor, issued in order."""
        op = _reduce_op(opts)
        return self._coalesced(
            tensors, [lambda t=t: self.comm._iallreduce(t, op, None)
                      for t in tensors])

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _coalesced(self, value, starts):
        # Every op is started before any is waited for.
        return Work([_start(start, None) for start in starts], value)

    # The group's name and description, which torch sets after creating
    # the group (functional collectives find the group by its name).
    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def shutdown(self):
        """Lets go of the group's share of the connection; torch calls it
        at destroy_process_group(). The connection stays while OneBitAdam
        or a Communicator still holds it. Idempotent."""
        self.comm.close()

    def __repr__(self):
        return (f"<obcomm.ProcessGroupObcomm rank {self.comm.rank} of "
                f"{self.comm.size}, job {self.comm.job!r}>")


# torch.compile runs the collectives as they are: TorchDynamo would trace
# into these methods and stop at the group, an object it cannot look
# into.
for _name in ("allreduce", "broadcast", "allgather", "_allgather_base",
              "all_gather_single", "reduce_scatter", "_reduce_scatter_base",
              "reduce_scatter_single", "barrier", "gather", "scatter",
              "all_gather_single_coalesced",
              "reduce_scatter_single_coalesced", "allreduce_coalesced",
              "allgather_into_tensor_coalesced",
              "reduce_scatter_tensor_coalesced"):
    setattr(ProcessGroupObcomm, _name,
            torch.compiler.disable(getattr(ProcessGroupObcomm, _name)))


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


def _create_extended(opts, pg_options):
    """The constructor torch calls with the extended API: opts carries the
    group's store, rank, size, timeout and its ranks in the world (empty
    for the default group). obcomm serves only the whole world in its rank
    order; a group of other ranks fails at once on every member."""
    ranks = list(opts.global_ranks_in_group)
    if ranks and ranks != list(range(dist.get_world_size())):
        raise ObcommError(
            E_INVAL, f"obcomm: a group of ranks {_ranks(ranks)} of "
            f"{dist.get_world_size()}: {_HOW}")
    return _create(opts.store, opts.group_rank, opts.group_size,
                   opts.timeout)


def _register():
    if not dist.is_available() or "OBCOMM" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("obcomm", _create_extended,
                                  extended_api=True, devices=["cpu"])


_register()
