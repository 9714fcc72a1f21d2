"""obcomm.Communicator: a trainer's handle on its node's obcommd, with torch
tensors in shared memory (docs/design.md, "Public surface")."""

import atexit
import bisect
import collections
import contextlib
import ctypes
import logging
import os
import re
import threading
import weakref

from ._lazy import torch
from ._lib import lib, Options, enum
from . import _claims


_libc = ctypes.CDLL(None, use_errno=True)
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def _munmap(ptr, nbytes):
    """Unmaps the memory of an empty() tensor that outlived its
    connection (obcomm_disown handed it over), once the tensor goes."""
    _libc.munmap(ctypes.c_void_p(ptr), nbytes)


def _error_codes():
    """The C API's error codes by name, E_INVAL = OBCOMM_E_INVAL, ...,
    read from the loaded libobcomm (obcomm_err_name over its range,
    [-1099, -1000]), so they cannot drift from the library in use."""
    codes = {}
    for code in range(-1000, -1100, -1):
        name = lib.obcomm_err_name(code)
        if name is not None:
            codes[name.decode()[len("OBCOMM_"):]] = code
    return codes


globals().update(_error_codes())

# obcomm_dtype_t and obcomm_op_t by name, read from the loaded libobcomm
# as the error codes are: {"float32": 0, ...}, {"sum": 0, ...}.
_DTYPE_CODES = enum(lib.obcomm_dtype_name)
OPS = enum(lib.obcomm_op_name)
# DTYPES, torch dtype -> obcomm_dtype_t, made at its first use (it needs
# torch): every obcomm dtype is torch's of the same name.
_dtypes = None
# Bytes per element by torch dtype, filled as dtypes are met.
_ITEMSIZE = {}


def dtypes():
    """DTYPES: torch dtype -> obcomm_dtype_t, in the order of the codes."""
    global _dtypes
    if _dtypes is None:
        _dtypes = {getattr(torch, name): code
                   for name, code in _DTYPE_CODES.items()}
    return _dtypes


def __getattr__(name):
    if name == "DTYPES":
        return dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _itemsize(dtype):
    item = _ITEMSIZE.get(dtype)
    if item is None:
        item = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return item


# The calls of obcomm.torch.OneBitAdam behind each op kind the daemons
# name in an "op differs" mismatch.
_OPTIMIZER_CALLS = {
    "snapshot_1bit": "OneBitAdam.state_dict()",
    "export_1bit": "OneBitAdam.state_dict()",
    "restore_1bit": "OneBitAdam.load_state_dict()",
    "allreduce_1bit": "OneBitAdam.step() in the compression stage",
    "allreduce": "OneBitAdam.step() in the warm-up",
    "broadcast": "the OneBitAdam constructor",
}


def _mismatch_note(message):
    """For a mismatch of op kinds, which optimizer call issues each kind
    named ("snapshot_1bit is OneBitAdam.state_dict()"), or ""."""
    m = re.search(r"op differs: ([^;]*)", message or "")
    if m is None:
        return ""
    kinds = []
    for k in re.findall(r" has ([a-z0-9_]+)", m.group(1)):
        if k in _OPTIMIZER_CALLS and k not in kinds:
            kinds.append(k)
    if not kinds:
        return ""
    return (" (with OneBitAdam: " +
            ", ".join(f"{k} is {_OPTIMIZER_CALLS[k]}" for k in kinds) +
            "; every rank must make the same calls in the same order)")


# What to do when a snapshot set is missing on a node without state_dir
# (its daemon restarted, and the checkpoint carries only other nodes'
# parts, as when rank 0 alone saves).
_NO_STATE_DIR_NOTE = (
    "; to resume after the daemons restart, set state_dir on every daemon, "
    "or let every rank save its own state_dict() (each carries its node's "
    "part) and load its own file")


class ObcommError(RuntimeError):
    """A failed libobcomm call: .code is the C API's negative error code,
    .message the library's explanation (obcomm_last_error), which names
    ranks and fields for mismatches and timeouts. A mismatch of op kinds
    also says, in str(), which OneBitAdam call issues each kind."""

    def __init__(self, code, message):
        self.code = code
        self.message = message
        name = lib.obcomm_strerror(code).decode(errors="replace")
        text = f"{name}: {message}" if message else name
        if code == E_MISMATCH:
            text += _mismatch_note(message)
        if code == E_STATE and "missing (no state_dir" in (message or ""):
            text += _NO_STATE_DIR_NOTE
        super().__init__(text)


def strerror(code):
    return lib.obcomm_strerror(code).decode(errors="replace")


def _resolve(socket, job, local_rank, local_size):
    """Communicator's arguments, the unset ones from torchrun's
    environment."""
    if socket is None:
        socket = os.environ.get("OBCOMM_SOCKET") or None
    if job is None:
        job = (os.environ.get("OBCOMM_JOB") or
               os.environ.get("TORCHELASTIC_RUN_ID") or "default")
    if local_rank is None:
        local_rank = _env_int("LOCAL_RANK", 0)
    if local_size is None:
        local_size = _env_int("LOCAL_WORLD_SIZE", 1)
    return socket, job, int(local_rank), int(local_size)


def _env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"obcomm: ${name} is {v!r}, not an integer") from None


class _Buffer:
    """One obcomm_alloc buffer: [ptr, ptr + nbytes)."""
    __slots__ = ("ptr", "nbytes", "_bytes")

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes
        self._bytes = None

    def view(self, dtype, shape):
        """A tensor of dtype and shape over the start of the buffer."""
        if self._bytes is None:
            arr = (ctypes.c_char * self.nbytes).from_address(self.ptr)
            self._bytes = torch.frombuffer(arr, dtype=torch.uint8)
        n = 1
        for s in shape:
            n *= s
        return self._bytes[:n * _itemsize(dtype)].view(dtype).view(shape)


def _nbytes(t):
    return t.numel() * t.element_size()


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr())


# Staging buffers of finished non-blocking ops are kept for the next ones
# (DDP sends buckets of the same sizes every step), at most this many; sizes
# are powers of two from STAGE_MIN_BYTES so that buckets of nearby sizes
# reuse each other's buffers.
STAGE_KEEP = 64
STAGE_MIN_BYTES = 1 << 16


class _Conn:
    """One trainer joined to its node's daemon: libobcomm's handle, the
    shared buffers allocated through it, and `lock`, which every call on the
    handle holds. libobcomm wants a handle used by one thread at a time;
    here the user's threads and the progress thread (progress.py) share
    it. ctypes releases the GIL inside each call, so a blocking collective
    holds the lock, never the interpreter.

    The daemon takes one join per local rank of a job, so the Communicators
    of one process that name the same socket, job and local rank share one
    _Conn (_open), and so does the torch.distributed backend; it leaves the
    job when the last of them lets go (release)."""

    def __init__(self, key, socket, job, local_rank, local_size, timeout_ms):
        self.key = key
        self.lock = threading.RLock()
        self.users = 0
        self.h = None
        self.bufs = []          # sorted by ptr
        self.starts = []        # the ptrs, for bisect
        # ptrs whose tensors died, freed by the next call under the lock;
        # a deque, so that the garbage collector's finalizers append to it
        # without a lock (they may run inside any allocation, in any
        # thread, also one that holds a lock of ours)
        self.pending = collections.deque()
        self.user = {}          # ptr -> finalizer of an empty() tensor's memory
        # C optimizers over this handle (objects with .handle, an
        # obcomm_adam_t): they borrow it, so they go before it closes.
        self.adams = []
        # What the optimizers over this connection hold alone: their keys
        # and gradient buffers (_claims.py).
        self.claims = []
        self.staging = None     # the blocking calls' staging buffer
        self.stages = []        # free staging buffers of non-blocking ops
        self.progress = None    # progress.Progress, from the first i-op on
        self.job = job
        self.local_rank = local_rank
        self.local_size = local_size
        self.timeout_ms = timeout_ms

        o = Options(socket.encode() if socket else None, job.encode(),
                    local_rank, local_size, timeout_ms)
        h = ctypes.c_void_p()
        rc = lib.obcomm_connect(ctypes.byref(o), ctypes.byref(h))
        if rc != 0:
            raise ObcommError(rc, lib.obcomm_last_error(None).decode(
                errors="replace"))
        self.h = h
        self.rank = lib.obcomm_rank(h)
        self.size = lib.obcomm_size(h)
        ws = os.environ.get("WORLD_SIZE")
        if ws not in (None, "") and int(ws) != self.size:
            nodes = self.size // self.local_size
            self.close()
            raise ObcommError(
                E_INVAL,
                f"WORLD_SIZE is {int(ws)} but the obcomm world has "
                f"{self.size} trainers ({nodes} nodes x local_size "
                f"{self.local_size}): start one obcommd per node with every "
                f"node in its peers, and as many trainers per node as "
                f"LOCAL_WORLD_SIZE says")

    # -- lifetime (lock order: _conns_lock, then a _Conn's lock) ----------

    def release(self):
        """One holder lets go; the last one closes the connection."""
        with _conns_lock:
            with self.lock:
                self.users -= 1
                last = self.users <= 0
            if last and _conns.get(self.key) is self:
                del _conns[self.key]
        if last:
            self.close()

    def close(self):
        """Leaves the job and unmaps every buffer. Ops in flight fail with
        ObcommError (E_PEER_LOST, libobcomm's "closed with the op in
        flight"); ops already over are copied back first, so no result
        that arrived is lost. Safe from any thread, the progress thread
        (a future's callback) included. Idempotent."""
        with self.lock:
            if self.h is None:
                return
            p = self.progress
            done = []
            if p is not None:
                done = p.stop_locked()
            self.disown_user_buffers()
            for g in self.adams:  # C optimizers on this handle
                if g.handle is not None:
                    getattr(g, "destroy", lib.obcomm_adam_destroy)(g.handle)
                    g.handle = None
            self.adams = []
            lib.obcomm_close(self.h)
            self.h = None
            self.bufs, self.starts = [], []
            self.staging, self.stages = None, []
            if p is not None:
                done += p.reap_closed()
        if p is not None:
            p.complete(done)
            p.join()

    def handle(self):
        """The handle, for a call made with the lock held."""
        if self.h is None:
            raise ObcommError(E_INVAL, "the communicator is closed")
        self.free_pending()
        return self.h

    def check(self, rc):
        """Raises the ObcommError of a failed call (lock held: the message
        is the handle's last error)."""
        if rc != 0:
            msg = lib.obcomm_last_error(self.h).decode(errors="replace")
            raise ObcommError(rc, msg)

    def kick(self):
        """After a blocking call: it may have read the answers of earlier
        non-blocking ops from the socket, which then is no longer readable,
        so the progress thread is told to look (lock held)."""
        if self.progress is not None and self.progress.ops:
            self.progress.wake()

    # -- shared memory (lock held) ----------------------------------------

    def alloc(self, nbytes):
        h = self.handle()
        p = ctypes.c_void_p()
        self.check(lib.obcomm_alloc(h, max(nbytes, 1), ctypes.byref(p)))
        b = _Buffer(p.value, nbytes)
        i = bisect.bisect(self.starts, b.ptr)
        self.starts.insert(i, b.ptr)
        self.bufs.insert(i, b)
        return b

    def release_buf(self, ptr):
        i = bisect.bisect_left(self.starts, ptr)
        if i < len(self.starts) and self.starts[i] == ptr:
            del self.starts[i], self.bufs[i]
            lib.obcomm_free(self.h, ctypes.c_void_p(ptr))

    def dead_tensor(self, ptr):
        # Runs wherever the garbage collector runs (any thread, maybe with
        # the lock held): only queue; the next call frees.
        self.pending.append(ptr)

    def disown_user_buffers(self):
        """Before the handle closes (lock held): the memory of every
        empty() tensor still alive stays mapped, with its contents, until
        the tensor goes (obcomm_disown), so a tensor used after close() is
        plain memory, never a dangling pointer; collectives refuse it."""
        user, self.user = self.user, {}
        for ptr, fin in list(user.items()):
            if not fin.alive:
                continue
            mapped = ctypes.c_size_t(0)
            lib.obcomm_disown(self.h, ctypes.c_void_p(ptr),
                              ctypes.byref(mapped))
            detached = fin.detach()
            if detached is not None and mapped.value:
                weakref.finalize(detached[0], _munmap, ptr, mapped.value)

    def free_pending(self):
        while self.pending:
            p = self.pending.popleft()
            self.user.pop(p, None)
            self.release_buf(p)

    def is_shared(self, t):
        if t.device.type != "cpu" or not t.is_contiguous():
            return False
        start = t.data_ptr()
        i = bisect.bisect_right(self.starts, start) - 1
        if i < 0:
            return False
        b = self.bufs[i]
        return start + _nbytes(t) <= b.ptr + b.nbytes

    def staged(self, t):
        """The blocking calls' staging buffer as a tensor like t (grown
        when too small)."""
        nbytes = _nbytes(t)
        if self.staging is None or self.staging.nbytes < nbytes:
            if self.staging is not None:
                self.release_buf(self.staging.ptr)
                self.staging = None
            self.staging = self.alloc(max(nbytes, STAGE_MIN_BYTES))
        return self.staging.view(t.dtype, t.shape)

    def take_stage(self, nbytes):
        """A staging buffer of at least nbytes for a non-blocking op."""
        best = None
        for i, b in enumerate(self.stages):
            if b.nbytes >= nbytes and (
                    best is None or b.nbytes < self.stages[best].nbytes):
                best = i
        if best is not None:
            return self.stages.pop(best)
        size = max(STAGE_MIN_BYTES, 1 << max(nbytes - 1, 0).bit_length())
        return self.alloc(size)

    def give_stages(self, bufs):
        """Staging buffers back to the pool (dropped when closed)."""
        if self.h is None:
            return
        self.stages.extend(bufs)
        while len(self.stages) > STAGE_KEEP:
            b = min(self.stages, key=lambda b: b.nbytes)
            self.stages.remove(b)
            self.release_buf(b.ptr)

    # -- collectives ----------------------------------------------------------

    def run(self, t, call, copy_in=True):
        """Blocking: call(h, ptr) on t's memory, staged through shared
        memory when t is not in it. Returns t."""
        if t.device.type != "cpu":
            raise TypeError("obcomm: collectives take CPU tensors, not "
                            f"{t.device}")
        with self.lock:
            h = self.handle()
            if t.numel() == 0:
                return t
            try:
                if self.is_shared(t):
                    self.check(call(h, _ptr(t)))
                    return t
                s = self.staged(t)
                if copy_in:
                    s.copy_(t)
                self.check(call(h, _ptr(s)))
                t.copy_(s)
                return t
            finally:
                self.kick()

    def place(self, op, t, copy_in, copy_out):
        """Non-blocking: the memory the op uses for t. t itself when it
        lies in shared memory (kept alive by the op), else a staging buffer
        that t is copied into first (copy_in) and that is copied back into
        t when the op succeeds (copy_out). Lock held."""
        if t.device.type != "cpu":
            raise TypeError("obcomm: collectives take CPU tensors, not "
                            f"{t.device}")
        if self.is_shared(t):
            op.keep.append(t)
            return t
        b = self.take_stage(_nbytes(t))
        op.stages.append(b)
        s = b.view(t.dtype, t.shape)
        if copy_in:
            s.copy_(t)
        if copy_out:
            op.copies.append((t, s))
        return s

    def stage(self, op, nbytes):
        """A staging buffer of nbytes that only the op uses. Lock held."""
        b = self.take_stage(nbytes)
        op.stages.append(b)
        return b

    def start(self, op, call):
        """Sends the op: call(h, req) is its obcomm_i* call. From then on
        the progress thread completes it. Raises ObcommError when the call
        fails (nothing was sent). Lock held."""
        if call is not None:
            req = ctypes.c_void_p()
            rc = call(self.handle(), ctypes.byref(req))
            if rc != 0:
                msg = lib.obcomm_last_error(self.h).decode(errors="replace")
                self.abandon(op)
                raise ObcommError(rc, msg)
            op.req = req
        if self.progress is None:
            from .progress import Progress
            self.progress = Progress(self)
        self.progress.add(op)
        return op

    def abandon(self, op):
        """An op that was never sent: its staging buffers go back."""
        self.give_stages(op.stages)
        op.stages, op.copies, op.keep = [], [], []


# Open connections by (socket, job, local_rank, local_size).
_conns = {}
# Reentrant: a Communicator's finalizer may run (garbage collection) inside
# _open on the same thread.
_conns_lock = threading.RLock()


def _open(socket, job, local_rank, local_size, timeout_ms, strict=True):
    """The process's connection for (socket, job, local rank): the one that
    is open, or a new join with timeout_ms. An open one is shared when
    timeout_ms is 0 or its own, or whatever its timeout unless strict."""
    key = (socket or "", job, local_rank, local_size)
    with _conns_lock:
        c = _conns.get(key)
        if c is not None:
            with c.lock:
                if c.h is not None:
                    if strict and timeout_ms not in (0, c.timeout_ms):
                        raise ObcommError(
                            E_BUSY,
                            f"this process holds local rank {local_rank} of "
                            f"job {job!r} with timeout_ms {c.timeout_ms}; a "
                            f"Communicator for the same socket, job and local "
                            f"rank shares that connection, so its timeout_ms "
                            f"must be 0 or {c.timeout_ms}, not {timeout_ms}")
                    c.users += 1
                    return c
        c = _Conn(key, socket, job, local_rank, local_size, timeout_ms)
        c.users = 1
        _conns[key] = c
        return c


@atexit.register
def _close_all():
    """At exit, every connection leaves its job and its progress thread
    stops before the interpreter goes away under it."""
    with _conns_lock:
        conns = list(_conns.values())
        _conns.clear()
    for c in conns:
        try:
            c.close()
        except Exception:
            logging.getLogger("obcomm").exception(
                "closing job %r's connection at exit", c.job)


class Communicator:
    """A trainer of a job on its node's daemon.

    Unset arguments come from the environment, so the same code runs
    unchanged under torchrun: socket from $OBCOMM_SOCKET (else the
    library's default /run/obcomm/obcommd.sock), job from $OBCOMM_JOB, else
    $TORCHELASTIC_RUN_ID, else "default"; local_rank and local_size from
    $LOCAL_RANK and $LOCAL_WORLD_SIZE (else 0 and 1). When $WORLD_SIZE is
    set it must equal the daemons' world (nodes x local_size).

    A process joins a job once per local rank: Communicators (and the
    torch.distributed backend "obcomm") that resolve to the same socket,
    job and local rank share one connection, which leaves the job when the
    last of them is closed. A second one's timeout_ms must be 0 or the
    first one's.

    Collectives take torch CPU tensors. A tensor from .empty() lies in
    shared memory and is reduced where it is; any other contiguous tensor
    is copied into a kept shared staging buffer and back. Tensors from
    .empty() must not be used after the connection closes: their memory
    is unmapped. Calls from several threads are serialized.
    """

    def __init__(self, socket=None, job=None, local_rank=None, local_size=None,
                 timeout_ms=0):
        self._conn = None
        self._release = None
        self._attach(_open(*_resolve(socket, job, local_rank, local_size),
                           int(timeout_ms)))

    @classmethod
    def _from_env(cls, timeout_ms):
        """Communicator() for the torch.distributed backend: it shares the
        process's open connection whatever that one's timeout, else joins
        with timeout_ms."""
        self = cls.__new__(cls)
        self._conn = None
        self._release = None
        self._attach(_open(*_resolve(None, None, None, None), timeout_ms,
                           strict=False))
        return self

    def _share(self):
        """Another Communicator on this one's connection (closed on its
        own)."""
        c = self._c()
        with _conns_lock:
            with c.lock:
                if c.h is None:
                    raise ObcommError(E_INVAL, "the communicator is closed")
                c.users += 1
        other = Communicator.__new__(Communicator)
        other._conn = None
        other._release = None
        other._attach(c)
        return other

    def _attach(self, c):
        self._conn = c
        # close(), or the collection of a Communicator never closed, lets
        # go of c once. An error in it, when run by the collector, is
        # printed by weakref, never dropped; at exit _close_all closes c.
        self._release = weakref.finalize(self, c.release)
        self._release.atexit = False
        self.job = c.job
        self.local_rank = c.local_rank
        self.local_size = c.local_size
        self.timeout_ms = c.timeout_ms
        self.rank = c.rank
        self.size = c.size

    # -- lifetime ---------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Lets go of the connection; the last holder leaves the job and
        unmaps every buffer. Idempotent."""
        self._conn = None
        release, self._release = self._release, None
        if release is not None:
            release()

    @property
    def closed(self):
        return self._conn is None or self._conn.h is None

    def _c(self):
        if self._conn is None:
            raise ObcommError(E_INVAL, "the communicator is closed")
        return self._conn

    @contextlib.contextmanager
    def _locked(self):
        """The handle, for C calls on it (obcomm_adam_*): the connection's
        lock is held inside the block."""
        c = self._c()
        with c.lock:
            try:
                yield c.handle()
            finally:
                c.kick()

    def _check(self, rc):
        """Raises the ObcommError of a call made inside _locked()."""
        self._c().check(rc)

    # -- shared memory ----------------------------------------------------

    def empty(self, shape, dtype=None):
        """A tensor of `shape` in shared memory (zero-filled), contiguous.
        Collectives on it (or on a contiguous view of it) copy nothing.
        Its memory returns to the daemon when the tensor and all its views
        are gone, or when the connection closes."""
        if dtype is None:
            dtype = torch.float32
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        numel = 1
        for s in shape:
            numel *= s
        item = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * item
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        c = self._c()
        with c.lock:  # a close in between would unmap it under the tensor
            b = c.alloc(nbytes)
            arr = (ctypes.c_char * nbytes).from_address(b.ptr)
            c.user[b.ptr] = weakref.finalize(arr, c.dead_tensor, b.ptr)
        return torch.frombuffer(arr, dtype=dtype, count=numel).view(shape)

    def is_shared(self, t):
        """Whether t's memory lies inside one of the connection's shared
        buffers (then collectives use it in place)."""
        c = self._c()
        with c.lock:
            return c.is_shared(t)

    # -- collectives --------------------------------------------------------

    def allreduce(self, t, op="sum"):
        """In place: every rank ends with the reduction of all ranks' t.
        op: "sum", "avg" (sum / size; integers truncate toward 0), "max",
        "min". dtypes: float32, float64, float16 and bfloat16 (both
        accumulated in fp32), int32, int64. Returns t."""
        n, d, o = t.numel(), _dtype(t), _op(op)
        c = self._c()
        _claims.check_tensor(c, t, "Communicator.allreduce")
        return c.run(t, lambda h, p: lib.obcomm_allreduce(h, p, n, d, o))

    def allreduce_1bit(self, key, t):
        """In place: the 1-bit compressed average of float32 t
        (docs/design.md, "The compressed allreduce, exactly"), identical on
        every rank; the daemons keep the error feedback per (job, key).
        Returns t."""
        if t.dtype != torch.float32:
            raise TypeError(f"obcomm: allreduce_1bit takes float32, not "
                            f"{t.dtype}")
        n, k = t.numel(), int(key)
        c = self._c()
        _claims.check_key(c, k, "Communicator.allreduce_1bit")
        _claims.check_tensor(c, t, "Communicator.allreduce_1bit")
        return c.run(t, lambda h, p: lib.obcomm_allreduce_1bit(h, k, p, n))

    def reset_1bit(self, key):
        """Collective: forgets the error feedback of key on every node."""
        _claims.check_key(self._c(), key, "Communicator.reset_1bit")
        with self._locked() as h:
            self._check(lib.obcomm_reset_1bit(h, int(key)))

    def save_1bit(self):
        """Collective: every daemon saves the error feedback of this run of
        the job as one snapshot set; returns its id (the same on every
        rank). Raises on every rank unless every node saved it."""
        sid = ctypes.c_uint64(0)
        with self._locked() as h:
            self._check(lib.obcomm_save_1bit(h, ctypes.byref(sid)))
        return sid.value

    def snapshot_1bit(self):
        """save_1bit(), without the id."""
        self.save_1bit()

    def restore_1bit(self, snapshot):
        """Collective: every daemon goes back to snapshot set `snapshot`,
        or, if any node misses it or holds it damaged, every node's error
        feedback of the run restarts at zero and every rank raises,
        naming the nodes."""
        with self._locked() as h:
            self._check(lib.obcomm_restore_1bit(h, int(snapshot)))

    def _export_1bit(self, snapshot):
        """After save_1bit() on every rank: (this node's part of the
        snapshot as bytes, the node) when its daemon keeps no state_dir
        (a checkpoint then carries the part), else None. A collective."""
        with self._locked() as h:
            if lib.obcomm_1bit_durable(h):
                durable = True
            else:
                durable = False
                part, n = ctypes.c_void_p(), ctypes.c_size_t(0)
                self._check(lib.obcomm_export_1bit(
                    h, int(snapshot), ctypes.byref(part), ctypes.byref(n)))
                try:
                    raw = ctypes.string_at(part.value, n.value)
                finally:
                    _libc.free(part)
        return None if durable else (raw, self.rank // self.local_size)

    def _restore_1bit(self, snapshot, part=None, node=None):
        """restore_1bit(snapshot), from `part` (bytes of _export_1bit) when
        the checkpoint carries one for this node. A collective."""
        mine = part is not None and node == self.rank // self.local_size
        buf = ctypes.create_string_buffer(part, len(part)) if mine else None
        with self._locked() as h:
            self._check(lib.obcomm_restore_1bit_part(
                h, int(snapshot), buf, len(part) if mine else 0))

    def broadcast(self, t, root=0):
        """In place: every rank ends with root's t (any dtype). Returns t."""
        nbytes, r = _nbytes(t), int(root)
        c = self._c()
        _claims.check_tensor(c, t, "Communicator.broadcast")
        return c.run(
            t, lambda h, p: lib.obcomm_broadcast(h, p, nbytes, r),
            copy_in=(self.rank == r))

    def barrier(self):
        with self._locked() as h:
            self._check(lib.obcomm_barrier(h))

    # -- non-blocking (obcomm.torch's backend and allreduce_hook) -------------
    #
    # Each returns a progress.Op whose .future the progress thread
    # completes with `value` (or an ObcommError) once the daemon answered,
    # after copying the results into the caller's tensors.

    def _iallreduce(self, t, op, value):
        n, d, o = t.numel(), _dtype(t), _op(op)
        _claims.check_tensor(self._c(), t, "allreduce")

        def build(c, op_):
            p = _ptr(c.place(op_, t, True, True))
            return lambda h, req: lib.obcomm_iallreduce(h, p, n, d, o, req)

        return self._start(value, n == 0, build)

    def _ibroadcast(self, t, root, value):
        nbytes, r = _nbytes(t), int(root)
        _claims.check_tensor(self._c(), t, "broadcast")
        mine = self.rank == r

        def build(c, op_):
            p = _ptr(c.place(op_, t, mine, not mine))
            return lambda h, req: lib.obcomm_ibroadcast(h, p, nbytes, r, req)

        return self._start(value, nbytes == 0, build)

    def _iallgather(self, outs, t, value):
        """Rank r's t lands in outs[r] (a list of size tensors of t's numel
        and dtype) or, when outs is one contiguous tensor, in its elements
        [r*n, (r+1)*n)."""
        n, size = t.numel(), self.size
        one = isinstance(outs, torch.Tensor)
        if one:
            if (outs.numel() != size * n or outs.dtype != t.dtype or
                    not outs.is_contiguous()):
                raise ValueError(
                    f"obcomm: all_gather_into_tensor: output has "
                    f"{outs.numel()} {outs.dtype} elements, want a contiguous "
                    f"{size} x {n} {t.dtype}")
        elif len(outs) != size or any(
                o.numel() != n or o.dtype != t.dtype for o in outs):
            raise ValueError(
                f"obcomm: all_gather: want {size} output tensors of {n} "
                f"{t.dtype} elements, got "
                f"{[(o.numel(), o.dtype) for o in outs]}")
        native = t.dtype in dtypes()
        if native:
            d, count, item = dtypes()[t.dtype], n, t.element_size()
        else:
            # Any other dtype (bool, uint8: all_gather_object) travels as
            # 8-byte words, each rank's bytes padded to a multiple of 8:
            # an allgather only copies.
            d, count, item = dtypes()[torch.int64], -(-_nbytes(t) // 8), 8
        block = count * item

        def build(c, op_):
            if native:
                send = c.place(op_, t, True, False)
            else:
                send = c.stage(op_, block).view(torch.uint8, (block,))
                send[:_nbytes(t)].copy_(_as_bytes(t))
            if one and native:
                recv = c.place(op_, outs, False, True)
            else:
                recv = c.stage(op_, size * block).view(torch.uint8,
                                                     (size * block,))
                dsts = outs.view(size, n).unbind(0) if one else outs
                for r, o in enumerate(dsts):
                    src = recv[r * block:r * block + _nbytes(t)]
                    op_.copies.append((o, src.view(t.dtype).view(o.shape)))
            ps, pr = _ptr(send), _ptr(recv)
            return lambda h, req: lib.obcomm_iallgather(h, ps, pr, count, d,
                                                        req)

        return self._start(value, n == 0, build)

    def _ireduce_scatter(self, out, ins, op, value):
        """out gets this rank's part of the reduction: ins is a list of size
        tensors of out's numel (part r is ins[r]) or one tensor of size x
        out.numel() elements."""
        n, d, o = out.numel(), _dtype(out), _op(op)
        size = self.size
        one = isinstance(ins, torch.Tensor)
        if one:
            if ins.numel() != size * n or ins.dtype != out.dtype:
                raise ValueError(
                    f"obcomm: reduce_scatter_tensor: input has "
                    f"{ins.numel()} {ins.dtype} elements, want {size} x {n} "
                    f"{out.dtype}")
        elif len(ins) != size or any(
                i.numel() != n or i.dtype != out.dtype for i in ins):
            raise ValueError(
                f"obcomm: reduce_scatter: want {size} input tensors of {n} "
                f"{out.dtype} elements, got "
                f"{[(i.numel(), i.dtype) for i in ins]}")

        def build(c, op_):
            if one:
                send = c.place(op_, ins, True, False)
            else:
                b = c.stage(op_, size * _nbytes(out))
                send = b.view(out.dtype, (size * n,))
                for r, i in enumerate(ins):
                    send[r * n:(r + 1) * n].copy_(i.reshape(-1))
            recv = c.place(op_, out, False, True)
            ps, pr = _ptr(send), _ptr(recv)
            return lambda h, req: lib.obcomm_ireduce_scatter(h, ps, pr, n, d,
                                                             o, req)

        return self._start(value, n == 0, build)

    def _ibarrier(self, value):
        return self._start(value, False,
                           lambda c, op_: lib.obcomm_ibarrier)

    def _start(self, value, empty, build):
        """Builds the op's buffers with build(conn, op) (which returns the
        obcomm_i* call) and sends it; an empty op sends nothing and
        completes in its turn."""
        from .progress import Op
        c = self._c()
        op = Op(value)
        with c.lock:
            c.handle()
            try:
                call = None if empty else build(c, op)
            except BaseException:
                c.abandon(op)
                raise
            return c.start(op, call)

    def __repr__(self):
        state = "closed" if self.closed else (
            f"rank {self.rank} of {self.size}")
        return (f"<obcomm.Communicator job={self.job!r} {state}, local "
                f"{self.local_rank}/{self.local_size}>")


def _dtype(t):
    codes = dtypes()
    if t.dtype not in codes:
        raise TypeError(f"obcomm: no reduction on {t.dtype}; it takes "
                        + ", ".join(str(d) for d in codes))
    return codes[t.dtype]


def _as_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _op(op):
    if op not in OPS:
        raise ValueError(f"obcomm: op {op!r}: want one of {list(OPS)}")
    return OPS[op]
