"""TCP ports for test daemons that nothing else can take meanwhile.

Two things could take a port between the moment a test picks it and the
moment its daemon binds it (or binds it again after a restart):

- the kernel, which hands ephemeral ports to every outgoing connection that
  did not bind first (the daemons' own dials among them). It takes them only
  from net.ipv4.ip_local_port_range, so the ports come from just below that
  range (or just above it, when it starts too low): the kernel never gives
  those out on its own;
- another test process doing the same. A port is taken while some process
  holds flock on LOCK_DIR/<port>: reserve() locks the port's file first,
  then checks with a bind (no SO_REUSEADDR, so any socket on the port, a
  listener or a TIME_WAIT, makes it "in use") that nobody uses it, and keeps
  the lock until the process exits. tests/harness.c (hx_reserve_port) keeps
  the same rule for the C tests.

Each process starts its walk at a point derived from its pid, so that
concurrent test processes seldom even try the same port.

As a program, for shell tests: `ports.py K PID` prints K ports on one line
and keeps them locked until process PID (the calling shell, $$) exits.
"""

import errno
import fcntl
import os
import select
import socket
import sys

LOCK_DIR = "/tmp/obcomm-test-ports"
WINDOW = 8192

_held = []       # lock files of the ports this process holds
_cursor = None   # (pid, next offset into the window)


def _window():
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            a, b = (int(v) for v in f.read().split())
        if 0 < a <= b <= 65535:
            lo, hi = a, b
    except (OSError, ValueError):
        pass
    if lo - 1024 >= 1024:
        return max(1024, lo - WINDOW), lo - 1
    if 65535 - hi >= 1024:
        return hi + 1, min(65535, hi + WINDOW)
    raise RuntimeError(f"ip_local_port_range {lo}-{hi} leaves no port the "
                       "kernel would not hand out itself")


def _unused(port):
    """True when nothing at all is bound to the port on any IPv4 address."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def reserve(k):
    """k ports, each free now and locked for the rest of this process."""
    global _cursor
    lo, hi = _window()
    span = hi - lo + 1
    if _cursor is None or _cursor[0] != os.getpid():
        _cursor = [os.getpid(), os.getpid() * 2654435761 % (1 << 32) % span]
    try:
        os.mkdir(LOCK_DIR, 0o1777)
        os.chmod(LOCK_DIR, 0o1777)  # any user's tests share it
    except FileExistsError:
        pass
    ports, err = [], None
    for _ in range(span):
        if len(ports) == k:
            return ports
        port = lo + _cursor[1] % span
        _cursor[1] += 1
        try:
            fd = os.open(os.path.join(LOCK_DIR, str(port)),
                         os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o444)
        except OSError as e:
            err = e
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                err = e
            continue
        if not _unused(port):
            os.close(fd)
            continue
        _held.append(fd)  # open file descriptions are not inherited by
        ports.append(port)  # subprocesses: Python opens them non-inheritable
    if len(ports) == k:
        return ports
    raise RuntimeError(f"no {k} free ports in {lo}-{hi}"
                       + (f"; lock files: {err}" if err else ""))


def _hold_for(pid):
    """Returns in the caller at once; a child keeps the locks (flock belongs
    to the open file description, which the child shares) until `pid`
    exits."""
    pidfd = os.pidfd_open(pid)
    if os.fork() != 0:
        return
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    select.select([pidfd], [], [])  # readable once pid has exited
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: ports.py K PID")
    got = reserve(int(sys.argv[1]))
    print(" ".join(str(p) for p in got), flush=True)
    _hold_for(int(sys.argv[2]))
