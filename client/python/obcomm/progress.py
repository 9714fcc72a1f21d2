"""The progress thread: one per connection, it completes the futures of the
connection's non-blocking ops from the daemon's answers.

No thread waits per op. The thread polls the handle's descriptor
(obcomm_fd) and a wake pipe; when the descriptor is readable it takes the
connection's lock, asks libobcomm whether the oldest ops are over
(obcomm_test, which reads what has arrived without blocking), copies the
results of the finished ones out of their staging buffers into the
caller's tensors, and then, without the lock, completes their futures in
the order the ops were issued. Submissions take the same lock, so the
handle is used by one thread at a time as libobcomm wants; ctypes releases
the GIL inside every C call.

A blocking call on the same handle may read the answers of earlier
non-blocking ops from the socket; it then wakes the thread (_Conn.kick),
and the poll's timeout (POLL_MS) bounds the delay should a wake ever be
missed.
"""

import collections
import ctypes
import os
import select
import sys
import threading
import traceback

import torch

from ._lib import lib
from .comm import ObcommError, E_PEER_LOST

# The longest the thread sleeps in poll() while ops are in flight.
POLL_MS = 50

_local = threading.local()


def on_progress_thread():
    """Whether the caller runs on a progress thread (in a future's
    callback), where waiting for an obcomm op would never end."""
    return getattr(_local, "progress", False)


class Op:
    """One non-blocking op, from its submission to its completion."""

    __slots__ = ("req", "future", "event", "copies", "stages", "keep",
                 "value", "error")

    def __init__(self, value):
        self.req = None        # obcomm_request_t *; None: nothing was sent
        self.future = torch.futures.Future()
        self.event = threading.Event()   # set once the future is complete
        self.copies = []       # (dst, src): results into the caller's tensors
        self.stages = []       # staging buffers, pooled again once copied
        self.keep = []         # shared-memory tensors the daemon works on
        self.value = value     # the future's value on success
        self.error = None      # the ObcommError once failed

    @property
    def done(self):
        return self.event.is_set()


class Progress:
    """The progress thread of one connection (comm._Conn). `ops` holds the
    ops in flight in issue order; it changes only with the connection's
    lock held."""

    def __init__(self, conn):
        self.conn = conn
        self.ops = collections.deque()
        self.stopping = False
        self.fd = lib.obcomm_fd(conn.h)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.thread = threading.Thread(
            target=self._run, daemon=True,
            name=f"obcomm-progress({conn.job}:{conn.local_rank})")
        self.thread.start()

    def add(self, op):
        """A new op in flight (lock held)."""
        self.ops.append(op)
        if len(self.ops) == 1:
            self.wake()

    def wake(self):
        """Lock held: the pipe is closed only after `stopping` was seen
        under the lock, so this never writes to a closed descriptor."""
        if self.stopping:
            return
        try:
            os.write(self.wake_w, b"\0")
        except BlockingIOError:
            pass  # full: a wake is pending anyway

    @property
    def on_thread(self):
        return threading.current_thread() is self.thread

    # -- the thread --------------------------------------------------------

    def _run(self):
        _local.progress = True
        poller = select.poll()
        poller.register(self.wake_r, select.POLLIN)
        watching = False
        try:
            while True:
                busy = bool(self.ops)
                if busy != watching:
                    if busy:
                        poller.register(self.fd, select.POLLIN)
                    else:
                        poller.unregister(self.fd)
                    watching = busy
                poller.poll(POLL_MS if busy else None)
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                with self.conn.lock:
                    if self.stopping:
                        return
                    done = self._reap()
                    stages = [b for op in done for b in op.stages]
                    self.conn.give_stages(stages)
                self.complete(done)
        except BaseException:
            # A bug here would leave every future waiting: say so loudly.
            sys.stderr.write("obcomm: the progress thread failed; "
                             "ops in flight will not complete\n")
            traceback.print_exc()
            raise
        finally:
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _reap(self):
        """The finished ops at the head of the queue, their requests freed
        and their results copied out (lock held). libobcomm completes a
        job's ops in issue order (an op it refuses at submission is
        answered at once, but waits here for the ones before it), so the
        first op still in flight ends the scan."""
        done = []
        d = ctypes.c_int(0)
        while self.ops:
            op = self.ops[0]
            if op.req is not None:
                rc = lib.obcomm_test(op.req, ctypes.byref(d))
                if not d.value:
                    break
                if rc != 0:
                    msg = lib.obcomm_request_error(op.req)
                    op.error = ObcommError(rc, msg.decode(errors="replace"))
                lib.obcomm_request_free(op.req)
                op.req = None
            self.ops.popleft()
            if op.error is None:
                try:
                    for dst, src in op.copies:
                        dst.copy_(src)
                except Exception as e:  # the caller's tensor changed shape
                    op.error = e
            done.append(op)
        return done

    def complete(self, ops):
        """Completes the futures of finished ops, in order, without the
        lock: their callbacks may start new ops."""
        for op in ops:
            try:
                if op.error is not None:
                    op.future.set_exception(op.error)
                else:
                    op.future.set_result(op.value)
            except Exception:
                traceback.print_exc()  # a callback's error; go on
            op.copies = op.stages = op.keep = None
            op.event.set()

    # -- closing (comm._Conn.close, lock held) -----------------------------

    def stop_locked(self):
        """Stops the thread at its next turn and returns the ops that are
        already over, results copied: the last moment their staging
        buffers are still mapped."""
        self.wake()
        self.stopping = True
        return self._reap()

    def reap_closed(self):
        """After obcomm_close every op still in flight is over (libobcomm
        fails it with OBCOMM_E_PEER_LOST); returns them, failed."""
        done = []
        d = ctypes.c_int(0)
        while self.ops:
            op = self.ops.popleft()
            if op.req is not None:
                rc = lib.obcomm_test(op.req, ctypes.byref(d))
                msg = lib.obcomm_request_error(op.req).decode(errors="replace")
                lib.obcomm_request_free(op.req)
                op.req = None
                op.error = ObcommError(
                    rc if rc != 0 else E_PEER_LOST,
                    msg or "the communicator was closed with the op in flight")
            elif op.error is None:
                op.error = ObcommError(
                    E_PEER_LOST, "the communicator was closed before the op "
                    "completed")
            done.append(op)
        return done

    def join(self, timeout=10.0):
        """Waits for the thread to end, unless called on it (a future's
        callback that closed the connection)."""
        if not self.on_thread:
            self.thread.join(timeout)

