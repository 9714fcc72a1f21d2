"""Real obcommd daemons on loopback and real trainer processes, for the
Python tests (the counterpart of tests/harness.c).

Binaries come from $OBCOMMD and $OBCOMMCTL, else <repo>/build; the library
from $OBCOMM_LIBRARY, else <repo>/build/client/libobcomm.so.0; the package
from <repo>/client/python (trainers get it on PYTHONPATH). Every wait is
bounded: a trainer that does not finish within its timeout is killed and
the test fails; daemons are killed when the cluster stops, also when the
test failed.
"""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import ports

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("OBCOMM_BUILD", os.path.join(ROOT, "build"))
OBCOMMD = os.environ.get("OBCOMMD", os.path.join(BUILD, "daemon", "obcommd"))
OBCOMMCTL = os.environ.get("OBCOMMCTL",
                           os.path.join(BUILD, "client", "obcommctl"))
LIBRARY = os.environ.get("OBCOMM_LIBRARY",
                         os.path.join(BUILD, "client", "libobcomm.so.0"))
PYPATH = os.path.join(ROOT, "client", "python")
WORKERS = os.path.join(HERE, "workers.py")


def trainer_env(extra=None):
    env = dict(os.environ)
    env["OBCOMM_LIBRARY"] = LIBRARY
    env["PYTHONPATH"] = PYPATH + (":" + env["PYTHONPATH"]
                                  if env.get("PYTHONPATH") else "")
    for k in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OBCOMM_JOB",
              "TORCHELASTIC_RUN_ID", "OBCOMM_SOCKET"):
        env.pop(k, None)
    env.update(extra or {})
    return env


class Cluster:
    """k daemons on loopback, one Unix socket each, in a temporary dir."""

    def __init__(self, k, flags=(), timeout_ms=20000):
        self.k = k
        self.dir = tempfile.mkdtemp(prefix="obcomm-pytest-")
        self.flags = list(flags)
        self.timeout_ms = timeout_ms
        self.procs = [None] * k
        self.peers = ",".join(f"127.0.0.1:{p}" for p in ports.reserve(k))

    def sock(self, n):
        return os.path.join(self.dir, f"node{n}.sock")

    def start_node(self, n):
        log = open(os.path.join(self.dir, f"node{n}.log"), "ab")
        args = [OBCOMMD, "--rank", str(n), "--socket", self.sock(n),
                "--log_level", "warn", "--timeout_ms", str(self.timeout_ms)]
        if self.k > 1:
            args += ["--peers", self.peers]
        env = dict(os.environ)
        # Sanitizer builds: python runs without leak checks, the daemons
        # with them (client/python/meson.build).
        if "OBCOMMD_ASAN_OPTIONS" in env:
            env["ASAN_OPTIONS"] = env["OBCOMMD_ASAN_OPTIONS"]
        env.pop("LD_PRELOAD", None)
        self.procs[n] = subprocess.Popen(args + self.flags, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        log.close()

    def start(self):
        for n in range(self.k):
            self.start_node(n)
        for n in range(self.k):
            self.wait_ready(n)
        return self

    def wait_ready(self, n, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.procs[n].poll() is not None:
                raise RuntimeError(f"obcommd {n} exited: {self.log(n)}")
            r = subprocess.run([OBCOMMCTL, "-s", self.sock(n), "status"],
                               capture_output=True, timeout=5)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"obcommd {n} not ready: {self.log(n)}")

    def kill_node(self, n, sig=signal.SIGKILL):
        p = self.procs[n]
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs[n] = None

    def restart_all(self, sig=signal.SIGKILL):
        """Kills every daemon with sig and starts them all again (a daemon
        without a state_dir comes back without its snapshot sets)."""
        for n in range(self.k):
            self.kill_node(n, sig)
        for n in range(self.k):
            self.start_node(n)
        for n in range(self.k):
            self.wait_ready(n)

    def log(self, n):
        try:
            with open(os.path.join(self.dir, f"node{n}.log"), "rb") as f:
                return f.read().decode(errors="replace")[-2000:]
        except OSError:
            return ""

    def metrics(self, n):
        r = subprocess.run([OBCOMMCTL, "-s", self.sock(n), "--json",
                            "metrics"], capture_output=True, timeout=10,
                           check=True)
        return {m["name"]: m["value"]
                for m in json.loads(r.stdout)["metrics"]}

    def stop(self):
        """Stops every daemon (SIGTERM) and removes the directory. Raises
        if a daemon did not exit cleanly (status 0), e.g. a sanitizer
        report at exit; the daemons are gone either way."""
        bad = []
        for n in range(self.k):
            p = self.procs[n]
            self.kill_node(n, signal.SIGTERM)
            if p is not None and p.returncode != 0:
                bad.append(f"obcommd {n} exited with {p.returncode}: "
                           f"{self.log(n)}")
        shutil.rmtree(self.dir, ignore_errors=True)
        if bad:
            raise RuntimeError("\n".join(bad))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def run(self, job, func, trainers, args=None, env=None, timeout=120,
            expect_ok=True, script=WORKERS):
        """Runs func of `script` (workers.py) on `trainers` trainers per
        node (processes), with torchrun's environment. Returns the list of
        results (the worker's return values, by global rank order of
        launch); with expect_ok=False, a list of (exit code, result or
        None, stderr)."""
        procs = []
        for n in range(self.k):
            for t in range(trainers):
                out = os.path.join(self.dir, f"{job}.{n}.{t}.out")
                e = {"OBCOMM_SOCKET": self.sock(n), "OBCOMM_JOB": job,
                     "LOCAL_RANK": str(t), "LOCAL_WORLD_SIZE": str(trainers),
                     "WORLD_SIZE": str(self.k * trainers),
                     "RANK": str(n * trainers + t)}
                e.update(env or {})
                argf = out + ".args"
                with open(argf, "wb") as f:
                    pickle.dump(args, f)
                p = subprocess.Popen(
                    [sys.executable, script, func, argf, out],
                    env=trainer_env(e), stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
                procs.append((p, out))
        deadline = time.monotonic() + timeout
        results = []
        try:
            for p, out in procs:
                left = max(0.1, deadline - time.monotonic())
                try:
                    _, err = p.communicate(timeout=left)
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        f"trainer of job {job} still running after "
                        f"{timeout} s") from None
                res = None
                if os.path.exists(out):
                    with open(out, "rb") as f:
                        res = pickle.load(f)
                results.append((p.returncode, res, err.decode(errors="replace")))
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if not expect_ok:
            return results
        for rc, res, err in results:
            assert rc == 0, f"trainer failed (exit {rc}):\n{err[-3000:]}"
        return [res for _, res, _ in results]
