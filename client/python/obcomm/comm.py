"""obcomm.Communicator: a trainer's handle on its node's obcommd, with torch
tensors in shared memory (docs/design.md, "Public surface")."""

import bisect
import ctypes
import os
import re
import threading
import weakref

import torch

from ._lib import lib, Options

# The C API's error codes (include/obcomm.h).
E_INVAL = -1000
E_MISMATCH = -1001
E_TIMEOUT = -1002
E_PEER_LOST = -1003
E_PROTO = -1004
E_NOMEM = -1005
E_NOTCONN = -1006
E_VERSION = -1007
E_NONFINITE = -1008
E_BUSY = -1009
E_NOTREG = -1010
E_STATE = -1011
E_IO = -1012
E_CORRUPT = -1013

# torch dtype -> obcomm_dtype_t
DTYPES = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int32: 4,
    torch.int64: 5,
}
OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3}


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
        super().__init__(text)


def strerror(code):
    return lib.obcomm_strerror(code).decode(errors="replace")


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
    __slots__ = ("ptr", "nbytes")

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes


class Communicator:
    """A trainer of a job on its node's daemon.

    Unset arguments come from the environment, so the same code runs
    unchanged under torchrun: socket from $OBCOMM_SOCKET (else the
    library's default /run/obcomm/obcommd.sock), job from $OBCOMM_JOB, else
    $TORCHELASTIC_RUN_ID, else "default"; local_rank and local_size from
    $LOCAL_RANK and $LOCAL_WORLD_SIZE (else 0 and 1). When $WORLD_SIZE is
    set it must equal the daemons' world (nodes x local_size).

    Collectives take torch CPU tensors. A tensor from .empty() lies in
    shared memory and is reduced where it is; any other contiguous tensor
    is copied into a kept shared staging buffer and back. Tensors from
    .empty() must not be used after .close(): their memory is unmapped.
    One thread at a time may use a communicator.
    """

    def __init__(self, socket=None, job=None, local_rank=None, local_size=None,
                 timeout_ms=0):
        if socket is None:
            socket = os.environ.get("OBCOMM_SOCKET") or None
        if job is None:
            job = (os.environ.get("OBCOMM_JOB") or
                   os.environ.get("TORCHELASTIC_RUN_ID") or "default")
        if local_rank is None:
            local_rank = _env_int("LOCAL_RANK", 0)
        if local_size is None:
            local_size = _env_int("LOCAL_WORLD_SIZE", 1)
        self._h = None
        self._bufs = []        # sorted by ptr
        self._starts = []      # the ptrs, for bisect
        self._pending = []     # ptrs whose tensors died, freed on our thread
        self._pending_lock = threading.Lock()
        self._staging = None   # (ptr, nbytes) of the kept staging buffer
        self.job = job
        self.local_rank = int(local_rank)
        self.local_size = int(local_size)
        self.timeout_ms = int(timeout_ms)

        o = Options(socket.encode() if socket else None, job.encode(),
                    self.local_rank, self.local_size, self.timeout_ms)
        h = ctypes.c_void_p()
        rc = lib.obcomm_connect(ctypes.byref(o), ctypes.byref(h))
        if rc != 0:
            raise ObcommError(rc, lib.obcomm_last_error(None).decode(
                errors="replace"))
        self._h = h
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

    # -- lifetime ---------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def close(self):
        """Leaves the job and unmaps every buffer. Idempotent."""
        if self._h is not None:
            lib.obcomm_close(self._h)
            self._h = None
            self._bufs, self._starts, self._staging = [], [], None

    @property
    def closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise ObcommError(E_INVAL, "the communicator is closed")
        self._free_pending()
        return self._h

    def _check(self, rc):
        if rc != 0:
            msg = lib.obcomm_last_error(self._h).decode(errors="replace")
            raise ObcommError(rc, msg)

    # -- shared memory ----------------------------------------------------

    def _alloc(self, nbytes):
        h = self._handle()
        p = ctypes.c_void_p()
        self._check(lib.obcomm_alloc(h, max(nbytes, 1), ctypes.byref(p)))
        b = _Buffer(p.value, nbytes)
        i = bisect.bisect(self._starts, b.ptr)
        self._starts.insert(i, b.ptr)
        self._bufs.insert(i, b)
        return b

    def _release(self, ptr):
        i = bisect.bisect_left(self._starts, ptr)
        if i < len(self._starts) and self._starts[i] == ptr:
            del self._starts[i], self._bufs[i]
            lib.obcomm_free(self._h, ctypes.c_void_p(ptr))

    def _dead_tensor(self, ptr):
        # Runs wherever the garbage collector runs (maybe another thread):
        # only queue; the owner thread frees at its next call.
        with self._pending_lock:
            self._pending.append(ptr)

    def _free_pending(self):
        if not self._pending:
            return
        with self._pending_lock:
            ptrs, self._pending = self._pending, []
        for p in ptrs:
            self._release(p)

    def empty(self, shape, dtype=torch.float32):
        """A tensor of `shape` in shared memory (zero-filled), contiguous.
        Collectives on it (or on a contiguous view of it) copy nothing.
        Its memory returns to the daemon when the tensor and all its views
        are gone, or at close()."""
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
        b = self._alloc(nbytes)
        arr = (ctypes.c_char * nbytes).from_address(b.ptr)
        weakref.finalize(arr, self._dead_tensor, b.ptr)
        return torch.frombuffer(arr, dtype=dtype, count=numel).view(shape)

    def is_shared(self, t):
        """Whether t's memory lies inside one of this communicator's
        shared buffers (then collectives use it in place)."""
        if t.device.type != "cpu" or not t.is_contiguous():
            return False
        start = t.data_ptr()
        n = t.numel() * t.element_size()
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0:
            return False
        b = self._bufs[i]
        return start + n <= b.ptr + b.nbytes

    def _staged(self, t):
        """A shared-memory tensor with t's shape and dtype over the kept
        staging buffer (grown when too small)."""
        nbytes = t.numel() * t.element_size()
        if self._staging is None or self._staging.nbytes < nbytes:
            if self._staging is not None:
                self._release(self._staging.ptr)
                self._staging = None
            self._staging = self._alloc(max(nbytes, 1 << 16))
        arr = (ctypes.c_char * nbytes).from_address(self._staging.ptr)
        return torch.frombuffer(arr, dtype=t.dtype,
                                count=t.numel()).view(t.shape)

    def _run(self, t, call, copy_in=True):
        """call(ptr) on t's memory, staged through shared memory when t is
        not in it. Returns t."""
        if t.device.type != "cpu":
            raise TypeError("obcomm: collectives take CPU tensors, not "
                            f"{t.device}")
        h = self._handle()
        if t.numel() == 0:
            return t
        if self.is_shared(t):
            self._check(call(h, ctypes.c_void_p(t.data_ptr())))
            return t
        s = self._staged(t)
        if copy_in:
            s.copy_(t)
        self._check(call(h, ctypes.c_void_p(s.data_ptr())))
        t.copy_(s)
        return t

    # -- collectives --------------------------------------------------------

    def allreduce(self, t, op="sum"):
        """In place: every rank ends with the reduction of all ranks' t.
        op: "sum", "avg" (sum / size; integers truncate toward 0), "max",
        "min". dtypes: float32, float64, float16 and bfloat16 (both
        accumulated in fp32), int32, int64. Returns t."""
        if t.dtype not in DTYPES:
            raise TypeError(f"obcomm: allreduce has no {t.dtype}; it takes "
                            + ", ".join(str(d) for d in DTYPES))
        if op not in OPS:
            raise ValueError(f"obcomm: op {op!r}: want one of {list(OPS)}")
        n, d, o = t.numel(), DTYPES[t.dtype], OPS[op]
        return self._run(t, lambda h, p: lib.obcomm_allreduce(h, p, n, d, o))

    def allreduce_1bit(self, key, t):
        """In place: the 1-bit compressed average of float32 t
        (docs/design.md, "The compressed allreduce, exactly"), identical on
        every rank; the daemons keep the error feedback per (job, key).
        Returns t."""
        if t.dtype != torch.float32:
            raise TypeError(f"obcomm: allreduce_1bit takes float32, not "
                            f"{t.dtype}")
        n, k = t.numel(), int(key)
        return self._run(t, lambda h, p: lib.obcomm_allreduce_1bit(h, k, p, n))

    def reset_1bit(self, key):
        """Collective: forgets the error feedback of key on every node."""
        self._check(lib.obcomm_reset_1bit(self._handle(), int(key)))

    def save_1bit(self):
        """Collective: every daemon saves the error feedback of this run of
        the job as one snapshot set; returns its id (the same on every
        rank). Raises on every rank unless every node saved it."""
        sid = ctypes.c_uint64(0)
        self._check(lib.obcomm_save_1bit(self._handle(), ctypes.byref(sid)))
        return sid.value

    def snapshot_1bit(self):
        """save_1bit(), without the id."""
        self.save_1bit()

    def restore_1bit(self, snapshot):
        """Collective: every daemon goes back to snapshot set `snapshot`,
        or, if any node misses it or holds it damaged, every node's error
        feedback of the run restarts at zero and every rank raises,
        naming the nodes."""
        self._check(lib.obcomm_restore_1bit(self._handle(), int(snapshot)))

    def broadcast(self, t, root=0):
        """In place: every rank ends with root's t (any dtype). Returns t."""
        nbytes, r = t.numel() * t.element_size(), int(root)
        return self._run(t, lambda h, p: lib.obcomm_broadcast(h, p, nbytes, r),
                         copy_in=(self.rank == r))

    def barrier(self):
        self._check(lib.obcomm_barrier(self._handle()))

    def __repr__(self):
        state = "closed" if self._h is None else (
            f"rank {self.rank} of {self.size}")
        return (f"<obcomm.Communicator job={self.job!r} {state}, local "
                f"{self.local_rank}/{self.local_size}>")
