"""The chaos test's cluster: 3 network namespaces around a bridge
namespace (the layout of deploy/netns-cluster.sh under its own prefix),
one obcommd per node namespace, faults as iptables-legacy rules inside
the node namespaces, trainers started inside them.

    netns obchaos-br:  bridge chbr0 <- chv0 chv1 chv2        (no address)
    netns obchaos-nI:  lo, ob0 = 10.77.0.(I+1)/24 (veth peer of chvI)

Every address lives inside these namespaces; the root namespace gets no
interface, route, address or rule. Processes are tracked by pid and every
wait is bounded. `cleanup()` (also `chaos.py --cleanup`) kills whatever
still runs inside an obchaos-* namespace, by pid, and deletes the
namespaces with their rules; a lock file keeps two chaos runs apart.
"""

import fcntl
import json
import os
import signal
import subprocess
import time

PREFIX = "obchaos-n"
BRNS = "obchaos-br"
SUBNET = "10.77.0"
PORT = 7800
LOCK = "/run/obchaos.lock"
IPT = "iptables-legacy"


def sh(*args, check=True, timeout=20, quiet=False):
    r = subprocess.run(list(args), capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: "
                           f"{r.stderr.strip()}")
    return r


def addr(i):
    return f"{SUBNET}.{i + 1}"


def ns(i):
    return f"{PREFIX}{i}"


def our_netns():
    r = sh("ip", "netns", "list", check=False)
    out = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name == BRNS or (name.startswith(PREFIX) and
                            name[len(PREFIX):].isdigit()):
            out.append(name)
    return out


def netns_pids(name):
    r = sh("ip", "netns", "pids", name, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def cleanup(verbose=False):
    """Kills every process inside our namespaces (by pid), deletes them.
    Idempotent; safe after a crash."""
    names = our_netns()
    for sig, rounds in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        for n in names:
            for p in netns_pids(n):
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
        for _ in range(rounds):
            if not any(netns_pids(n) for n in names):
                break
            time.sleep(0.1)
    for n in names:
        sh("ip", "netns", "del", n, check=False)
    if verbose and names:
        print(f"chaos: removed namespaces {' '.join(names)}", flush=True)


class Lock:
    """Held while a chaos run owns the obchaos-* namespaces:
    `with Lock():`; raises RuntimeError when another run holds it."""

    def __init__(self):
        self.f = open(LOCK, "w")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.close()
            raise RuntimeError(f"another chaos run holds {LOCK}") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


class Cluster:
    def __init__(self, build, workdir, k=3, timeout_ms=3000, rate="1gbit",
                 log=print):
        self.build = build
        self.obcommd = os.environ.get("OBCOMMD",
                                      os.path.join(build, "daemon", "obcommd"))
        self.obcommctl = os.environ.get(
            "OBCOMMCTL", os.path.join(build, "client", "obcommctl"))
        self.k = k
        self.dir = workdir
        self.timeout_ms = timeout_ms
        self.rate = rate
        self.log = log
        self.procs = [None] * k
        self.restarts = [0] * k
        self.exits = []        # (node, returncode, why) of daemons that ended
        self.peers = ",".join(f"{addr(i)}:{PORT}" for i in range(k))
        self.rules = {}        # ns -> list of rule specs added (for -D)
        self.trainer_bin = os.environ.get(
            "OBCOMM_CHAOS_TRAINER",
            os.path.join(build, "tests", "chaos", "chaos-trainer"))

    # -- network ------------------------------------------------------------

    def net_up(self):
        cleanup(verbose=True)
        sh("ip", "netns", "add", BRNS)
        sh("ip", "-n", BRNS, "link", "set", "lo", "up")
        sh("ip", "-n", BRNS, "link", "add", "chbr0", "type", "bridge")
        sh("ip", "-n", BRNS, "link", "set", "chbr0", "up")
        for i in range(self.k):
            n = ns(i)
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
            sh("ip", "link", "add", f"chv{i}", "netns", BRNS, "type", "veth",
               "peer", "name", "ob0", "netns", n)
            sh("ip", "-n", BRNS, "link", "set", f"chv{i}", "master", "chbr0")
            sh("ip", "-n", BRNS, "link", "set", f"chv{i}", "up")
            sh("ip", "-n", n, "addr", "add", f"{addr(i)}/24", "dev", "ob0")
            sh("ip", "-n", n, "link", "set", "ob0", "up")
            # Shaped like deploy/netns-cluster.sh (tbf both ways); without
            # sch_tbf the links run unshaped.
            for dev, where in (("ob0", n), (f"chv{i}", BRNS)):
                r = sh("ip", "netns", "exec", where, "tc", "qdisc", "replace",
                       "dev", dev, "root", "tbf", "rate", self.rate, "burst",
                       "256kb", "latency", "20ms", check=False)
                if r.returncode != 0 and dev == "ob0" and i == 0:
                    self.log(f"chaos: no tbf shaping ({r.stderr.strip()})")
        with open(os.path.join(self.dir, "cluster.key"), "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(os.urandom(32))

    # -- faults: iptables-legacy inside a node namespace -----------------------

    def rule(self, i, *spec):
        """Appends a rule (e.g. "INPUT", "-i", "ob0", "-j", "DROP") in node
        i's namespace."""
        sh("ip", "netns", "exec", ns(i), IPT, "-w", "5", "-A", *spec)
        self.rules.setdefault(i, []).append(spec)

    def clear_rules(self, i=None):
        for n in ([i] if i is not None else list(self.rules)):
            for spec in self.rules.pop(n, []):
                sh("ip", "netns", "exec", ns(n), IPT, "-w", "5", "-D", *spec,
                   check=False)
            # Belt and braces: nothing of ours may stay.
            for chain in ("INPUT", "OUTPUT"):
                sh("ip", "netns", "exec", ns(n), IPT, "-w", "5", "-F", chain,
                   check=False)

    def partition(self, i):
        """Node i cut off both ways, silently (every drop is on INPUT):
        i drops everything arriving, the others drop what comes from i."""
        self.rule(i, "INPUT", "-i", "ob0", "-j", "DROP")
        for j in range(self.k):
            if j != i:
                self.rule(j, "INPUT", "-i", "ob0", "-s", addr(i), "-j", "DROP")

    def cut(self, i):
        """partition(i) with its rules added at once (one process per
        rule, all started before any is waited for): in within ~10 ms,
        not one after another."""
        specs = [(i, ("INPUT", "-i", "ob0", "-j", "DROP"))]
        specs += [(j, ("INPUT", "-i", "ob0", "-s", addr(i), "-j", "DROP"))
                  for j in range(self.k) if j != i]
        ps = [(j, spec, subprocess.Popen(
            ["ip", "netns", "exec", ns(j), IPT, "-w", "5", "-A", *spec],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            for j, spec in specs]
        errs = []
        for j, spec, p in ps:
            _, err = p.communicate(timeout=20)
            self.rules.setdefault(j, []).append(spec)
            if p.returncode != 0:
                errs.append(f"node {j} {' '.join(spec)}: {err.strip()}")
        if errs:
            raise RuntimeError("; ".join(errs))

    def heal(self, i):
        for j in range(self.k):
            self.clear_rules(j)

    def rules_dump(self):
        out = {}
        for i in range(self.k):
            r = sh("ip", "netns", "exec", ns(i), IPT, "-S", check=False)
            out[i] = [l for l in r.stdout.splitlines() if l.startswith("-A")]
        return out

    # -- daemons ------------------------------------------------------------------

    def sock(self, i):
        return os.path.join(self.dir, f"n{i}.sock")

    def state_dir(self, i):
        return os.path.join(self.dir, f"state{i}")

    def daemon_log(self, i):
        return os.path.join(self.dir, f"n{i}.log")

    def start_daemon(self, i):
        sd = self.state_dir(i)
        os.makedirs(sd, mode=0o700, exist_ok=True)
        os.chmod(sd, 0o700)
        args = ["ip", "netns", "exec", ns(i), self.obcommd, "--rank", str(i),
                "--peers", self.peers, "--listen", f"{addr(i)}:{PORT}",
                "--auth_key_file", os.path.join(self.dir, "cluster.key"),
                "--socket", self.sock(i), "--state_dir", sd,
                "--timeout_ms", str(self.timeout_ms),
                # A silent node is found well before an op's deadline.
                "--peer_timeout_ms", str(max(100, self.timeout_ms // 3)),
                "--log_level", "info"]
        lf = open(self.daemon_log(i), "ab")
        lf.write(f"==== chaos: start {time.strftime('%H:%M:%S')}\n".encode())
        lf.flush()
        env = dict(os.environ)
        if "OBCOMMD_ASAN_OPTIONS" in env:
            env["ASAN_OPTIONS"] = env["OBCOMMD_ASAN_OPTIONS"]
        env.pop("LD_PRELOAD", None)
        # ip netns exec execs the daemon: the pid is obcommd's own.
        self.procs[i] = subprocess.Popen(args, stdout=lf,
                                         stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL)
        lf.close()

    def start(self):
        for i in range(self.k):
            self.start_daemon(i)
        self.wait_links(30)

    def alive(self, i):
        p = self.procs[i]
        return p is not None and p.poll() is None

    def ctl(self, i, *args, timeout=10):
        r = subprocess.run([self.obcommctl, "-s", self.sock(i), "--json",
                            *args], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"obcommctl {' '.join(args)} on node {i}: "
                               f"exit {r.returncode}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def metrics(self, i):
        return {m["name"]: m["value"] for m in self.ctl(i, "metrics")["metrics"]}

    def links_up(self, i):
        try:
            return int(self.metrics(i).get("links_up", -1))
        except Exception:  # noqa: BLE001 -- not answering: not up
            return -1

    def wait_links(self, seconds):
        """Seconds until every daemon sees k-1 links up; raises after
        `seconds`."""
        t0 = time.monotonic()
        while True:
            for i in range(self.k):
                if not self.alive(i):
                    raise RuntimeError(f"obcommd {i} exited: "
                                       f"{self.tail(i)}")
            if all(self.links_up(i) == self.k - 1 for i in range(self.k)):
                return time.monotonic() - t0
            if time.monotonic() - t0 > seconds:
                ups = [self.links_up(i) for i in range(self.k)]
                raise RuntimeError(f"links not up after {seconds} s "
                                   f"(links_up per node {ups})")
            time.sleep(0.05)

    def kill9(self, i):
        p = self.procs[i]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        self.exits.append((i, p.returncode, "SIGKILL on purpose"))
        self.procs[i] = None

    def restart(self, i):
        self.start_daemon(i)
        self.restarts[i] += 1

    def stop(self, i, timeout=20):
        """SIGTERM; returns the exit status (None if it had to be killed)."""
        p = self.procs[i]
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
                self.exits.append((i, None, "SIGTERM ignored, killed"))
                self.procs[i] = None
                return None
        self.exits.append((i, p.returncode, "SIGTERM"))
        self.procs[i] = None
        return p.returncode

    def kill_all(self):
        for i in range(self.k):
            p = self.procs[i]
            if p is not None and p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass

    def tail(self, i, n=3000):
        try:
            with open(self.daemon_log(i), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # -- trainers -------------------------------------------------------------------

    def trainer(self, i, job, argv, env_extra, stdout_path):
        env = dict(env_extra)
        env.update({"OBCOMM_SOCKET": self.sock(i), "OBCOMM_JOB": job,
                    "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                    "WORLD_SIZE": str(self.k), "RANK": str(i)})
        out = open(stdout_path, "ab")
        try:
            return subprocess.Popen(["ip", "netns", "exec", ns(i),
                                     self.trainer_bin, *argv], env=env,
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        finally:
            out.close()
