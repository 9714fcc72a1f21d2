"""The chaos test: 3 obcomm nodes in network namespaces, faults injected
with iptables-legacy and kill -9, trainers logging every op, and a checker
over the logs (check.py). Run it through tests/chaos/chaos.sh (skips
without root, ip or iptables-legacy) or deploy/chaos.sh SECONDS.

    chaos.py --short                 every scenario once (the meson test)
    chaos.py --seconds N [--seed S]  random scenarios until N seconds pass
    chaos.py --only NAME[,NAME]      just these scenarios (short settings)
    chaos.py --cleanup               remove what a killed run left behind

Scenarios (node numbers are those of the short mode; the long mode draws
the node, the loss rate and the durations):
  loss         30 % random loss both ways on node 1 (statistic match), 6 s
  oneway       node 2 -> node 0 dropped (OUTPUT in node 2, -d node 0), 6 s
  partition5   node 1 cut off both ways for 5 s
  partition60  node 0 cut off both ways for 60 s
  flap         node 2 cut off and reconnected every second for 10 s
  kill         kill -9 of node 1's obcommd during the stream, restarted 2 s
               later (same state_dir)
  snapshot     a run snapshots (obcomm_adam_save -> obcomm_snapshot_1bit),
               a second run resumes it explicitly (obcomm_adam_load) and
               must continue bit for bit (positive control), snapshots
               again; a byte of one ef-*.lz4 file in each of node 1's sets is
               flipped; a third run's explicit resume must fail on every
               rank
  snapshot-restart  the same, but every daemon is stopped (SIGTERM) before
               the byte is flipped and started again before the third run
  snapshot-partition  a run's trainers pause before a snapshot op
               (obcomm_save_1bit); node 1 is cut off both ways for 5 s
               as soon as it begins writing its part (the long mode also
               cuts before the op, or 0-20 ms after the trainers go): the
               op fails on every rank, no node keeps the set (state_dir,
               .tmp, in-memory bytes), a later restore of its id is
               refused on every rank, and the run after the heal is the
               reference from zero
  restart-alone  kill -9 of node 1's trainer during the stream and a new
               trainer on node 1 at once, alone: the other ranks' next op
               fails at once naming it; once they restart, the new run is
               the reference from zero
  linger       a run of 30 ops whose node 2 trainer stays joined 1.5 s
               after its last op; the next run starts on the other nodes
               as soon as their trainers left, on node 2 once its own left:
               the new run is the reference from zero, no op waits for its
               deadline

Every fault scenario: a run of job chaos-NN-NAME streams ops (paced) until
each rank has logged 30, the fault is applied and cleared, a probe
(obcomm-allreduce on every node) measures when the cluster works again,
the stream goes on 3 s more, then stops at one seq on every rank. A new
run of the same job (trainers restarted) then runs 30 ops from zero and
pauses while every daemon's status is read. Checks (check.py): (1) prefix
before the first failure = reference, (2) the failure contract, (3) the
new run = reference from zero and equal key versions on every node, (4)
daemons alive, exit 0 on SIGTERM at the end.
"""

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check  # noqa: E402
import cluster as C  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
K = 3
TIMEOUT_MS = 3000
PACE_MS = 20          # between ops of a fault run (~35 ops/s)
REF_OPS = 450         # the reference run; a fault run's prefix is checked
                      # against it up to here, across ranks beyond
PRE_OPS = 30          # ops every rank logs before the fault
POST_S = 3.0          # the stream goes on this long after the heal
HEAL_BOUND_S = 30.0   # the probe gives up after this (15 s in --short)
VERIFY_OPS = 30       # the new run after the fault
RESTART_POST_S = 0.5  # restart-alone: the old run's survivors go on this
                      # long after the kill, then restart
SNAP_OPS = 30         # ops per run of the snapshot scenario
SNAP_CUT_S = 5.0      # snapshot-partition: how long the node is cut off
ONEBIT_KEYS = [11, 12]
BIG = 10 ** 7

ALL = ["loss", "oneway", "partition5", "partition60", "flap", "kill",
       "snapshot", "snapshot-restart", "snapshot-partition", "restart-alone",
       "linger"]


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def say(*a):
    print(*a, flush=True)


class Driver:
    def __init__(self, args):
        self.args = args
        self.build = os.environ.get("OBCOMM_BUILD", os.path.join(ROOT, "build"))
        self.work = args.workdir or tempfile.mkdtemp(prefix="obchaos-")
        os.makedirs(self.work, exist_ok=True)
        self.cl = C.Cluster(self.build, self.work, k=K, timeout_ms=TIMEOUT_MS,
                            log=say)
        self.allreduce = os.environ.get(
            "OBCOMM_ALLREDUCE", os.path.join(self.build, "client",
                                             "obcomm-allreduce"))
        self.trainers = []      # Popen of every trainer still to reap
        self.results = []
        self.ref = None
        self.probe_n = 0
        self.rng = random.Random(args.seed)

    # -- trainers -------------------------------------------------------------

    def env(self):
        e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
            if k in os.environ:
                e[k] = os.environ[k]
        return e

    def launch(self, rdir, job, extra):
        os.makedirs(rdir, exist_ok=True)
        procs = []
        for i in range(K):
            argv = [os.path.join(rdir, f"rank{i}.log"),
                    "--timeout-ms", str(TIMEOUT_MS), *extra]
            p = self.cl.trainer(i, job, argv, self.env(),
                                os.path.join(rdir, f"rank{i}.out"))
            procs.append(p)
            self.trainers.append(p)
        return procs

    def reap(self, procs, seconds):
        """Waits for the trainers; kills (by pid) those still running
        after `seconds`. Returns the list of problems."""
        deadline = time.monotonic() + seconds
        probs = []
        for i, p in enumerate(procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
                probs.append(f"trainer {i} still running after {seconds:.0f}"
                             f" s: killed")
            else:
                if p.returncode != 0:
                    probs.append(f"trainer {i} exited with {p.returncode}")
            if p in self.trainers:
                self.trainers.remove(p)
        return probs

    def logs(self, rdir):
        return check.load_run(rdir, K)

    def op_counts(self, rdir):
        return [sum(1 for e in check.read_log(os.path.join(rdir, f"rank{i}.log"))
                    if e.get("ev") == "op") for i in range(K)]

    def max_seq(self, rdir):
        m = -1
        for i in range(K):
            for e in check.read_log(os.path.join(rdir, f"rank{i}.log")):
                if e.get("ev") == "op":
                    m = max(m, e["seq"])
        return m

    def wait_ops(self, rdir, procs, n, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if min(self.op_counts(rdir)) >= n:
                return True
            if any(p.poll() is not None for p in procs):
                return False
            time.sleep(0.1)
        return False

    # -- the cluster ------------------------------------------------------------

    def probe(self):
        """One fp32 allreduce on every node (obcomm-allreduce, its own job):
        True when all three succeed."""
        self.probe_n += 1
        job = f"chaos-probe-{self.probe_n}"
        ps = []
        for i in range(K):
            ps.append(subprocess.Popen(
                ["ip", "netns", "exec", C.ns(i), self.allreduce, "-s",
                 self.cl.sock(i), "-j", job, "-r", "0", "-n", "1", "-c",
                 "1024", "-i", "1", "-t", "2000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL))
        ok = True
        for p in ps:
            try:
                ok = p.wait(timeout=10) == 0 and ok
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                ok = False
        return ok

    def heal_bound(self):
        return HEAL_BOUND_S if self.args.seconds else HEAL_BOUND_S / 2

    def heal_time(self, t_clear):
        while time.monotonic() - t_clear < self.heal_bound():
            t0 = time.monotonic()
            if self.probe():
                return t0 - t_clear  # the probe that worked began here
            time.sleep(max(0.0, 0.25 - (time.monotonic() - t0)))
        return None

    def metrics_all(self):
        out = {}
        for i in range(K):
            try:
                out[i] = self.cl.metrics(i)
            except Exception:  # noqa: BLE001
                out[i] = {}
            p = self.cl.procs[i]
            out[i]["_pid"] = p.pid if p is not None else None
        return out

    def peers_all(self):
        out = {}
        for i in range(K):
            try:
                out[i] = [(p["rank"], p["state"], p.get("reconnects"),
                           p.get("last_error"))
                          for p in self.cl.ctl(i, "peers")["peers"]]
            except Exception as e:  # noqa: BLE001
                out[i] = str(e)
        return out

    def daemons_alive(self, res, expect_dead=()):
        """(4) within a scenario: every daemon still runs. A dead one is
        reported and started again so the next scenario has a cluster."""
        probs = []
        for i in range(K):
            if i in expect_dead:
                continue
            if not self.cl.alive(i):
                rc = self.cl.procs[i].returncode if self.cl.procs[i] else None
                probs.append(f"obcommd {i} died (status {rc}): "
                             f"{check.short(self.cl.tail(i, 600), 400)}")
                self.cl.procs[i] = None
                self.cl.restart(i)
        if probs:
            try:
                self.cl.wait_links(30)
            except RuntimeError as e:
                probs.append(str(e))
        res["checks"]["4 daemons"] = {"ok": not probs, "problems": probs}

    def reset_cluster(self, why):
        """Restarts every daemon (SIGTERM, must exit 0) when the cluster
        does not work again by itself, so the next scenario starts clean."""
        say(f"  cluster restart: {why}")
        probs = []
        for i in range(K):
            rc = self.cl.stop(i)
            if rc != 0:
                probs.append(f"obcommd {i} exited with {rc} on SIGTERM")
        for i in range(K):
            self.cl.restart(i)
        self.cl.wait_links(30)
        return probs

    # -- runs ---------------------------------------------------------------------

    def reference(self):
        rdir = os.path.join(self.work, "00-reference")
        t0 = time.monotonic()
        procs = self.launch(rdir, "chaos-reference", ["--ops", str(REF_OPS)])
        probs = self.reap(procs, 180)
        if probs:
            raise RuntimeError("reference run: " + "; ".join(probs))
        self.ref = check.reference(self.logs(rdir), REF_OPS)
        say(f"reference run: {REF_OPS} ops on the healthy cluster in "
            f"{time.monotonic() - t0:.1f} s, equal on every rank")

    def verify_trainer(self, i, rdir, job, timeout_ms=TIMEOUT_MS):
        """Node i's trainer of a verify run (see verify_run)."""
        argv = [os.path.join(rdir, f"rank{i}.log"), "--timeout-ms",
                str(timeout_ms), "--ops", str(VERIFY_OPS), "--verify",
                "--pause-file", os.path.join(rdir, f"paused.{i}"),
                "--resume-file", os.path.join(rdir, "resume"),
                "--wait-s", "60"]
        os.makedirs(rdir, exist_ok=True)
        p = self.cl.trainer(i, job, argv, self.env(),
                            os.path.join(rdir, f"rank{i}.out"))
        self.trainers.append(p)
        return p

    def verify_run(self, res, rdir, job, early=None, late=None):
        """(3): a new run of the job from zero; while it pauses, every
        daemon's status. early: {node: its trainer, started already};
        late: {node: a process to wait for (at most 60 s) before node's
        trainer starts}."""
        pause = [os.path.join(rdir, f"paused.{i}") for i in range(K)]
        resume = os.path.join(rdir, "resume")
        procs = [None] * K
        for i, p in (early or {}).items():
            procs[i] = p
        for i in range(K):
            if procs[i] is None and i not in (late or {}):
                procs[i] = self.verify_trainer(i, rdir, job)
        for i, before in (late or {}).items():
            try:
                before.wait(timeout=60)
            except subprocess.TimeoutExpired:
                res["notes"].append(f"node {i}'s trainer before the new run "
                                    f"still ran after 60 s")
            procs[i] = self.verify_trainer(i, rdir, job)
        deadline = time.monotonic() + 60 + VERIFY_OPS * TIMEOUT_MS / 1000
        while time.monotonic() < deadline:
            if all(os.path.exists(p) for p in pause):
                break
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        statuses, opsj = {}, {}
        if all(os.path.exists(p) for p in pause):
            for i in range(K):
                try:
                    statuses[i] = self.cl.ctl(i, "status")
                except Exception as e:  # noqa: BLE001
                    statuses[i] = e
                try:
                    opsj[i] = self.cl.ctl(i, "ops")
                except Exception:  # noqa: BLE001
                    opsj[i] = None
            with open(os.path.join(rdir, "status.json"), "w") as f:
                json.dump({"status": {i: (s if isinstance(s, dict) else str(s))
                                      for i, s in statuses.items()},
                           "ops": opsj}, f, indent=1)
        open(resume, "w").close()
        probs = self.reap(procs, 30)
        fr = check.check_fresh(self.logs(rdir), self.ref, VERIFY_OPS)
        fr["problems"] += probs
        fr["ok"] = fr["ok"] and not probs
        if statuses:
            vr = check.check_versions(statuses, job, ONEBIT_KEYS, opsj)
        else:
            vr = {"ok": False, "problems": [
                "the new run never reached its pause: no status read"]}
        res["checks"]["3 fresh run"] = fr
        res["checks"]["3 versions"] = vr

    # -- fault scenarios ------------------------------------------------------------

    def params(self, name):
        """The fault's node and durations: fixed in --short, drawn
        otherwise."""
        r, short = self.rng, not self.args.seconds
        p = {}
        if name == "loss":
            p["node"] = 1 if short else r.randrange(K)
            p["prob"] = 0.3 if short else r.choice([0.1, 0.2, 0.3, 0.5])
            p["secs"] = 6 if short else r.choice([4, 8, 15])
        elif name == "oneway":
            p["src"], p["dst"] = (2, 0) if short else r.sample(range(K), 2)
            p["where"] = "output" if short else r.choice(["output", "input"])
            p["secs"] = 6 if short else r.choice([3, 6, 15])
        elif name == "partition5":
            p["node"] = 1 if short else r.randrange(K)
            p["secs"] = 5
        elif name == "partition60":
            p["node"] = 0 if short else r.randrange(K)
            p["secs"] = self.args.long_partition
        elif name == "flap":
            p["node"] = 2 if short else r.randrange(K)
            p["secs"] = 10
            p["period"] = 1.0 if short else r.choice([0.5, 1.0, 2.0])
        elif name == "kill":
            p["node"] = 1 if short else r.randrange(K)
            p["down"] = 2.0 if short else r.choice([0.5, 2.0, 5.0])
        elif name == "snapshot-partition":
            p["node"] = 1 if short else r.randrange(K)
            # When the cut falls: "write" as soon as the cut node begins
            # writing its part (every announce of the op is in, the
            # nodes write and have not reported), "before" before the
            # trainers are let go (the op's announces are cut), or a
            # number of ms after they are let go (they start the op
            # within 20 ms of it: they poll for it).
            p["cut"] = "write" if short else r.choice(
                ["write", "write", "before", 0, 10, 20])
        elif name.startswith("snapshot"):
            p["node"] = 1 if short else r.randrange(K)
        elif name == "restart-alone":
            p["node"] = 1 if short else r.randrange(K)
        elif name == "linger":
            p["node"] = 2 if short else r.randrange(K)
            p["linger_ms"] = 1500 if short else r.choice([300, 1500, 3000])
        return p

    def apply_fault(self, name, p, res):
        cl = self.cl
        mid = {}
        if name == "loss":
            for chain, io in (("INPUT", "-i"), ("OUTPUT", "-o")):
                cl.rule(p["node"], chain, io, "ob0", "-m", "statistic",
                        "--mode", "random", "--probability", str(p["prob"]),
                        "-j", "DROP")
            time.sleep(p["secs"] / 2)
            mid = self.peers_all()
            time.sleep(p["secs"] / 2)
        elif name == "oneway":
            if p["where"] == "output":
                cl.rule(p["src"], "OUTPUT", "-o", "ob0", "-d",
                        C.addr(p["dst"]), "-j", "DROP")
            else:
                cl.rule(p["dst"], "INPUT", "-i", "ob0", "-s",
                        C.addr(p["src"]), "-j", "DROP")
            time.sleep(p["secs"] / 2)
            mid = self.peers_all()
            time.sleep(p["secs"] / 2)
        elif name in ("partition5", "partition60"):
            cl.partition(p["node"])
            time.sleep(min(p["secs"] / 2, 5))
            mid = self.peers_all()
            time.sleep(p["secs"] - min(p["secs"] / 2, 5))
        elif name == "flap":
            t_end = time.monotonic() + p["secs"]
            n = 0
            while time.monotonic() < t_end:
                cl.partition(p["node"])
                time.sleep(p["period"])
                if n == 0:
                    mid = self.peers_all()
                cl.heal(p["node"])
                n += 1
                if time.monotonic() < t_end:
                    time.sleep(p["period"])
            p["cycles"] = n
        elif name == "kill":
            res["restarted"] = True
            cl.kill9(p["node"])
            time.sleep(p["down"] / 2)
            mid = self.peers_all()
            time.sleep(p["down"] / 2)
            cl.restart(p["node"])
            try:
                p["links_back_s"] = round(cl.wait_links(30), 2)
            except RuntimeError as e:
                res["notes"].append(f"restarted node: {e}")
        for i in range(K):
            cl.clear_rules(i)
        left = cl.rules_dump()
        if any(left.values()):
            raise RuntimeError(f"iptables rules left behind: {left}")
        res["mid_peers"] = mid

    def fault_scenario(self, idx, name):
        p = self.params(name)
        job = f"chaos-{idx:02d}-{name}"
        sdir = os.path.join(self.work, f"{idx:02d}-{name}")
        fdir = os.path.join(sdir, "fault")
        res = {"name": name, "job": job, "params": p, "checks": {},
               "notes": []}
        say(f"\n== {idx:02d} {name} {json.dumps(p, sort_keys=True)}")
        m0 = self.metrics_all()
        t_start = time.monotonic()
        stop = os.path.join(fdir, "stop")
        procs = self.launch(fdir, job, ["--ops", str(BIG), "--stop-file",
                                        stop, "--pace-ms", str(PACE_MS)])
        if not self.wait_ops(fdir, procs, PRE_OPS, 60):
            res["notes"].append(f"the stream did not reach {PRE_OPS} ops on "
                                f"every rank before the fault "
                                f"({self.op_counts(fdir)})")
        res["fault_t"] = time.time()
        t_fault = time.monotonic()
        self.apply_fault(name, p, res)
        t_clear = time.monotonic()
        res["fault_s"] = round(t_clear - t_fault, 1)
        heal = self.heal_time(t_clear)
        res["heal_s"] = None if heal is None else round(heal, 2)
        time.sleep(max(0.0, POST_S - (time.monotonic() - t_clear)))
        stop_seq = self.max_seq(fdir) + 50
        with open(stop + ".tmp", "w") as f:
            f.write(str(stop_seq))
        os.rename(stop + ".tmp", stop)
        res["stop_seq"] = stop_seq
        # Every rank stops at stop_seq; ranks out of step (each op waiting
        # for its deadline) are cut short after two deadlines.
        grace = time.monotonic() + 2 * TIMEOUT_MS / 1000 + 1
        while time.monotonic() < grace and any(p_.poll() is None
                                               for p_ in procs):
            time.sleep(0.1)
        for p_ in procs:
            if p_.poll() is None:
                # The stop seq is read before each op; a rank still busy
                # here is out of step: cut it short.
                with open(stop, "w") as f:
                    f.write("0")
                break
        probs = self.reap(procs, 3 * TIMEOUT_MS / 1000 + 10)
        logs = self.logs(fdir)
        c1 = check.check_prefix(logs, self.ref, limit=stop_seq)
        c2 = check.check_contract(logs, self.ref, limit=stop_seq,
                                  fault_t=res["fault_t"])
        if probs:
            c2["problems"] += probs
            c2["ok"] = False
        res["checks"]["1 prefix"] = c1
        res["checks"]["2 contract"] = c2
        self.daemons_alive(res)
        if heal is None:
            res["restarted"] = True
            c4 = res["checks"]["4 daemons"]
            c4["problems"] += self.reset_cluster(
                f"no working allreduce within {self.heal_bound():.0f} s of "
                f"the heal")
            c4["ok"] = not c4["problems"]
        self.verify_run(res, os.path.join(sdir, "verify"), job)
        self.daemons_alive(res)
        res["metrics_delta"] = self.metrics_delta(m0, self.metrics_all())
        self.note_resets(res)
        res["secs"] = round(time.monotonic() - t_start, 1)
        return res

    def note_resets(self, res):
        """The daemons log and count every reset of a key's error feedback
        (ef_resets); nodes that count differently now hold different 1-bit
        state for the job: a silent mix (docs/design.md, "The 1-bit
        state's lifecycle and failures", wants the same reset on every
        node). Noted, not a check of its own: (2) and (3) are where it
        shows."""
        d = res.get("metrics_delta", {}).get("ef_resets")
        if d and len(set(d)) > 1 and not res.get("restarted"):
            res["notes"].append(f"WARNING: nodes reset 1-bit error feedback "
                                f"unequally (ef_resets per node {d}): their "
                                f"states of the job now differ")

    def metrics_delta(self, a, b):
        out = {}
        for i in range(K):
            restarted = a.get(i, {}).get("_pid") != b.get(i, {}).get("_pid")
            for k, v in b.get(i, {}).items():
                if not isinstance(v, (int, float)) or k.startswith("_"):
                    continue
                if not any(s in k for s in ("ef_", "snap", "reconnect",
                                            "fail", "timeout", "lost",
                                            "reject", "corrupt", "mismatch",
                                            "error")):
                    continue
                # A restarted daemon counts from 0 again.
                d = v if restarted else v - a.get(i, {}).get(k, 0)
                if d and k != "ef_state_bytes":
                    out.setdefault(k, [0] * K)[i] = d
        return out

    # -- runs that restart ----------------------------------------------------------

    def restart_alone_scenario(self, idx, name):
        """kill -9 of one trainer mid-stream and, at once, a new trainer
        on its node alone (the first of the next run). The other ranks'
        next op fails at once naming the killed rank (the contract, (2),
        with "left the job" as the name); once their trainers restart,
        the new run (3) is the reference from zero."""
        p = self.params(name)
        v = p["node"]
        job = f"chaos-{idx:02d}-{name}"
        sdir = os.path.join(self.work, f"{idx:02d}-{name}")
        fdir, vdir = os.path.join(sdir, "fault"), os.path.join(sdir, "verify")
        res = {"name": name, "job": job, "params": p, "checks": {},
               "notes": []}
        say(f"\n== {idx:02d} {name} {json.dumps(p, sort_keys=True)}")
        m0 = self.metrics_all()
        t_start = time.monotonic()
        stop = os.path.join(fdir, "stop")
        procs = self.launch(fdir, job, ["--ops", str(BIG), "--stop-file",
                                        stop, "--pace-ms", str(PACE_MS)])
        if not self.wait_ops(fdir, procs, PRE_OPS, 60):
            res["notes"].append(f"the stream did not reach {PRE_OPS} ops on "
                                f"every rank before the fault "
                                f"({self.op_counts(fdir)})")
        res["fault_t"] = time.time()
        procs[v].kill()
        procs[v].wait(timeout=10)
        self.trainers.remove(procs[v])
        # The restarted trainer's first op waits for the others' new
        # trainers, up to its deadline: a long one, as torchrun's workers
        # have (60 s by default), since the others restart after it.
        restarted = self.verify_trainer(v, vdir, job,
                                        timeout_ms=5 * TIMEOUT_MS)
        res["fault_s"] = 0.0
        res["heal_s"] = 0.0
        time.sleep(RESTART_POST_S)
        # The others stop at once: the new run's ops that reached their
        # nodes before their new trainers wait there for the daemon's
        # deadline (timeout_ms, 3 s here).
        stop_seq = self.max_seq(fdir) + 2
        with open(stop + ".tmp", "w") as f:
            f.write(str(stop_seq))
        os.rename(stop + ".tmp", stop)
        res["stop_seq"] = stop_seq
        survivors = [q for i, q in enumerate(procs) if i != v]
        probs = self.reap(survivors, 3 * TIMEOUT_MS / 1000 + 10)
        logs = self.logs(fdir)
        # Up to the killed rank's last logged op every rank has every op;
        # the op it was killed in may have completed elsewhere.
        last = max([e["seq"] for e in logs[v] if e.get("ev") == "op"],
                   default=-1)
        c1 = check.check_prefix(logs, self.ref, limit=last + 1)
        others = {r: e for r, e in logs.items() if r != v}
        c2 = check.check_contract(others, self.ref, limit=stop_seq,
                                  fault_t=res["fault_t"])
        c2["problems"] += probs
        # Every survivor's first failure names the killed rank.
        want = f"(node {v} local 0) left the job"
        for r, entries in logs.items():
            if r == v:
                continue
            first = next((e for e in entries if e.get("ev") == "op" and
                          e["status"] != 0), None)
            if first is None:
                c2["problems"].append(f"rank {r} never failed after rank "
                                      f"{v} was killed")
            elif want not in first["msg"]:
                c2["problems"].append(f"rank {r}'s first failure does not "
                                      f"name '{want}': "
                                      f"{check.short(first['msg'])}")
        c2["ok"] = not c2["problems"]
        res["checks"]["1 prefix"] = c1
        res["checks"]["2 contract"] = c2
        self.daemons_alive(res)
        self.verify_run(res, vdir, job, early={v: restarted})
        self.daemons_alive(res)
        res["metrics_delta"] = self.metrics_delta(m0, self.metrics_all())
        res["secs"] = round(time.monotonic() - t_start, 1)
        return res

    def linger_scenario(self, idx, name):
        """Back-to-back runs with a lingering node: node L's trainer stays
        joined linger_ms after the run's last op; the next run starts on
        the other nodes as soon as their trainers left and on node L once
        its own left. The first run is the reference (1, 2), the next run
        the reference from zero (3): its first op waits for no deadline."""
        p = self.params(name)
        late = p["node"]
        job = f"chaos-{idx:02d}-{name}"
        sdir = os.path.join(self.work, f"{idx:02d}-{name}")
        fdir, vdir = os.path.join(sdir, "first"), os.path.join(sdir, "verify")
        res = {"name": name, "job": job, "params": p, "checks": {},
               "notes": [], "fault_s": 0.0, "heal_s": None}
        say(f"\n== {idx:02d} {name} {json.dumps(p, sort_keys=True)}")
        m0 = self.metrics_all()
        t_start = time.monotonic()
        os.makedirs(fdir, exist_ok=True)
        procs = []
        for i in range(K):
            argv = [os.path.join(fdir, f"rank{i}.log"), "--timeout-ms",
                    str(TIMEOUT_MS), "--ops", str(PRE_OPS)]
            if i == late:
                argv += ["--linger-ms", str(p["linger_ms"])]
            q = self.cl.trainer(i, job, argv, self.env(),
                                os.path.join(fdir, f"rank{i}.out"))
            procs.append(q)
            self.trainers.append(q)
        early = [q for i, q in enumerate(procs) if i != late]
        probs = self.reap(early, 60 + PRE_OPS * TIMEOUT_MS / 1000)
        t_next = time.monotonic()
        self.verify_run(res, vdir, job, late={late: procs[late]})
        res["notes"].append(f"the next run took {time.monotonic() - t_next:.1f}"
                            f" s from the other trainers' exit (node "
                            f"{late}'s trainer left {p['linger_ms']} ms "
                            f"after its last op)")
        probs += self.reap([procs[late]], 10)
        logs = self.logs(fdir)
        c1 = check.check_prefix(logs, self.ref, limit=PRE_OPS)
        if c1["first_failure"] is not None or c1["good_ops"] != PRE_OPS:
            c1["problems"].append(f"the first run failed at op "
                                  f"{c1['first_failure']}")
        c1["problems"] += probs
        c1["ok"] = not c1["problems"]
        res["checks"]["1 prefix"] = c1
        self.daemons_alive(res)
        res["metrics_delta"] = self.metrics_delta(m0, self.metrics_all())
        res["secs"] = round(time.monotonic() - t_start, 1)
        return res

    # -- the snapshot scenarios ---------------------------------------------------------

    def sets_of(self, node, job):
        """Every snapshot set directory of job on node (ids are hashes,
        not ordered: the checkpoint names the one it restores)."""
        hexjob = job.encode().hex()
        sets = []
        for d in glob.glob(os.path.join(self.cl.state_dir(node),
                                        f"set-{hexjob}-*")):
            tail = os.path.basename(d)[len(f"set-{hexjob}-"):]
            if os.path.isdir(d) and all(c in "0123456789abcdef" for c in tail):
                sets.append(d)
        return sorted(sets)

    def snap_run(self, rdir, job, extra, seconds):
        procs = self.launch(rdir, job, extra)
        return self.reap(procs, seconds)

    def snapshot_scenario(self, idx, name):
        p = self.params(name)
        node = p["node"]
        job = f"chaos-{idx:02d}-{name}"
        sdir = os.path.join(self.work, f"{idx:02d}-{name}")
        save = os.path.join(sdir, "adam")
        os.makedirs(save, exist_ok=True)
        res = {"name": name, "job": job, "params": p, "checks": {},
               "notes": []}
        say(f"\n== {idx:02d} {name} {json.dumps(p, sort_keys=True)}")
        m0 = self.metrics_all()
        t_start = time.monotonic()
        bound = 60 + 2 * SNAP_OPS * TIMEOUT_MS / 1000
        s1, s2, s3 = SNAP_OPS, 2 * SNAP_OPS, 2 * SNAP_OPS + 6
        # A: ops 0..s1-1, then save (snapshot).
        a = os.path.join(sdir, "a-save")
        probs = self.snap_run(a, job, ["--ops", str(s1), "--save",
                                       "--save-dir", save], bound)
        ca = check.check_restore_ok(self.logs(a), self.ref, 0, s1)
        ca["problems"] += probs
        ca["ok"] = ca["ok"] and not probs
        res["checks"]["snapshot+save"] = ca
        # B: explicit resume from it, ops s1..s2-1 = the reference; save.
        b = os.path.join(sdir, "b-resume")
        probs = self.snap_run(b, job, ["--restore", "--start", str(s1),
                                       "--ops", str(s2), "--save",
                                       "--save-dir", save], bound)
        cb = check.check_restore_ok(self.logs(b), self.ref, s1, s2)
        cb["problems"] += probs
        cb["ok"] = cb["ok"] and not probs
        res["checks"]["resume = reference"] = cb
        if name == "snapshot-restart":
            stops = {}
            for i in range(K):
                stops[i] = self.cl.stop(i)
            bad = {i: rc for i, rc in stops.items() if rc != 0}
            res["notes"].append(f"daemons stopped (SIGTERM) before the damage:"
                                f" exit {stops}")
        # Damage every set of the job on node (the one the checkpoint names
        # among them): one byte in the middle of its largest file.
        damaged = None
        for target in self.sets_of(node, job):
            files = sorted(glob.glob(os.path.join(target, "ef-*.lz4")),
                           key=os.path.getsize, reverse=True)
            if files:
                with open(files[0], "r+b") as f:
                    size = os.fstat(f.fileno()).st_size
                    off = size // 2
                    f.seek(off)
                    byte = f.read(1)
                    f.seek(off)
                    f.write(bytes([byte[0] ^ 0x5a]))
                    f.flush()
                    os.fsync(f.fileno())
                damaged = files[0]
                res.setdefault("damaged_files", []).append(
                    f"{os.path.relpath(files[0], self.work)} byte {off} of "
                    f"{size}")
        if damaged is not None:
            res["damaged"] = "; ".join(res["damaged_files"])
        if damaged is None:
            res["checks"]["damaged restore fails"] = {
                "ok": False, "problems": [
                    f"no snapshot set of job {job} on node {node} "
                    f"({os.listdir(self.cl.state_dir(node))})"]}
        if name == "snapshot-restart":
            for i in range(K):
                self.cl.restart(i)
            self.cl.wait_links(30)
            if bad:
                res["checks"]["4 daemons"] = {"ok": False, "problems": [
                    f"obcommd {i} exited with {rc} on SIGTERM"
                    for i, rc in bad.items()]}
        if damaged is not None:
            c = os.path.join(sdir, "c-damaged")
            probs = self.snap_run(c, job, ["--restore", "--start", str(s2),
                                           "--ops", str(s3), "--save-dir",
                                           save], bound)
            cc = check.check_restore_fails(self.logs(c), self.ref, s2)
            cc["problems"] += probs
            cc["ok"] = cc["ok"] and not probs
            res["checks"]["damaged restore fails"] = cc
        prior = res["checks"].get("4 daemons")
        self.daemons_alive(res)
        if prior and not prior["ok"]:
            res["checks"]["4 daemons"]["problems"] += prior["problems"]
            res["checks"]["4 daemons"]["ok"] = False
        self.verify_run(res, os.path.join(sdir, "verify"), job)
        self.daemons_alive(res)
        res["metrics_delta"] = self.metrics_delta(m0, self.metrics_all())
        res["secs"] = round(time.monotonic() - t_start, 1)
        return res

    def set_dirs(self, node, job, sid):
        """Node's directories of set sid of job, committed or .tmp."""
        base = os.path.join(self.cl.state_dir(node),
                            f"set-{job.encode().hex()}-{sid}")
        return [d for d in (base, base + ".tmp") if os.path.exists(d)]

    def snapshot_partition_scenario(self, idx, name):
        """A partition during a snapshot op: the trainers of a run pause
        before obcomm_save_1bit; the driver reads the id the op will
        have (obd_snapset_id of the run and the op's seq), lets them go
        and cuts node v off both ways. The op fails on every rank; once
        the parts' deletions settle no node holds the set (on disk, .tmp
        or in memory); a new run's restore of that id fails on every rank
        with no 1-bit op succeeding; the run after that is the reference
        from zero (3). A rank whose node saw every report before the cut
        and committed, though the op failed elsewhere, is the leftover of
        docs/design.md ("A leftover set is never used"): reported, allowed only on the
        nodes whose rank succeeded, and the restore must be refused all
        the same."""
        p = self.params(name)
        v = p["node"]
        job = f"chaos-{idx:02d}-{name}"
        sdir = os.path.join(self.work, f"{idx:02d}-{name}")
        adir = os.path.join(sdir, "a-cut")
        bdir = os.path.join(sdir, "b-restore")
        res = {"name": name, "job": job, "params": p, "checks": {},
               "notes": []}
        say(f"\n== {idx:02d} {name} {json.dumps(p, sort_keys=True)}")
        m0 = self.metrics_all()
        t_start = time.monotonic()
        pause = [os.path.join(adir, f"paused.{i}") for i in range(K)]
        go = os.path.join(adir, "go")
        os.makedirs(adir, exist_ok=True)
        procs = []
        for i in range(K):
            argv = [os.path.join(adir, f"rank{i}.log"), "--timeout-ms",
                    str(TIMEOUT_MS), "--ops", str(SNAP_OPS), "--snapshot",
                    "--pause-file", pause[i], "--resume-file", go,
                    "--wait-s", "60"]
            q = self.cl.trainer(i, job, argv, self.env(),
                                os.path.join(adir, f"rank{i}.out"))
            procs.append(q)
            self.trainers.append(q)
        deadline = time.monotonic() + 60 + SNAP_OPS * TIMEOUT_MS / 1000
        while time.monotonic() < deadline and not all(
                os.path.exists(f) for f in pause):
            if any(q.poll() is not None for q in procs):
                break
            time.sleep(0.05)
        cut = {"ok": True, "problems": []}
        res["checks"]["snapshot cut"] = cut
        sid = None
        try:
            j, why = check.job_entry(self.cl.ctl(0, "status"), job)
            if j is None:
                raise RuntimeError(why)
            # "run" is hex (obcommctl prints ids so), "next_seq" the seq
            # the next op, the snapshot, takes.
            sid = "%016x" % check.snapset_id(int(j["run"], 16),
                                             int(j["next_seq"]))
        except Exception as e:  # noqa: BLE001
            cut["problems"].append(f"the snapshot's id: node 0's status: {e}")
        res["set"] = sid
        if not all(os.path.exists(f) for f in pause):
            cut["problems"].append("the run never reached its pause before "
                                   "the snapshot")
        before = {i: self.sets_of(i, job) for i in range(K)}
        if any(before.values()):
            cut["problems"].append(f"sets of the job before its first "
                                   f"snapshot: {before}")
        if p["cut"] == "before":
            res["fault_t"] = time.time()
            self.cl.cut(v)
            t_cut_done = time.time()
        open(go, "w").close()
        t_go = time.time()
        if p["cut"] == "write" and sid is not None:
            # The cut node's part begins as a .tmp directory, renamed
            # when written.
            final = os.path.join(self.cl.state_dir(v),
                                 f"set-{job.encode().hex()}-{sid}")
            until = time.monotonic() + 10
            while time.monotonic() < until and not any(
                    os.path.exists(d) for d in (final + ".tmp", final)):
                time.sleep(0.0005)
            if os.path.exists(final):
                res["notes"].append(f"node {v}'s part was written before "
                                    f"the cut")
            elif not os.path.exists(final + ".tmp"):
                res["notes"].append(f"node {v}'s part was not seen being "
                                    f"written within 10 s")
        elif p["cut"] != "before":
            time.sleep(p["cut"] / 1000)
        if p["cut"] != "before":
            res["fault_t"] = time.time()
            self.cl.cut(v)
            t_cut_done = time.time()
        time.sleep(SNAP_CUT_S / 2)
        res["mid_peers"] = self.peers_all()
        time.sleep(SNAP_CUT_S / 2)
        for i in range(K):
            self.cl.clear_rules(i)
        t_clear = time.monotonic()
        res["fault_s"] = SNAP_CUT_S
        left = self.cl.rules_dump()
        if any(left.values()):
            raise RuntimeError(f"iptables rules left behind: {left}")
        heal = self.heal_time(t_clear)
        res["heal_s"] = None if heal is None else round(heal, 2)
        probs = self.reap(procs, 2 * TIMEOUT_MS / 1000 + 10)
        logs = self.logs(adir)
        c1 = check.check_restore_ok(logs, self.ref, 0, SNAP_OPS)
        res["checks"]["1 prefix"] = c1
        c1["problems"] += probs
        c1["ok"] = not c1["problems"]
        snap = check.check_snapshot_cut(logs, sid, v,
                                        strict=p["cut"] == "before")
        cut["problems"] += snap["problems"]
        res["snap_how"] = snap["how"]
        starts = [e["t0"] for es in logs.values() for e in es
                  if e.get("ev") == "snapshot"]
        now = self.metrics_all()
        saved = [now[i].get("ef_saved", 0) - m0[i].get("ef_saved", 0)
                 for i in range(K)]
        res["parts_saved"] = saved
        if starts:
            rel = 1000 * (res["fault_t"] - min(starts))
            res["notes"].append(
                f"the cut began {abs(rel):.0f} ms "
                f"{'after' if rel >= 0 else 'before'} the first rank's "
                f"snapshot call (its rules were in "
                f"{1000 * (t_cut_done - res['fault_t']):.0f} ms; the go "
                f"{1000 * (t_go - min(starts)):+.0f} ms from that call); "
                f"states saved per node (ef_saved) {saved}")
        succeeded = snap["succeeded"]
        # The parts' deletions run on each daemon's pool after its op is
        # freed: give them up to 5 s.
        kept = {}
        for _ in range(100):
            kept = {i: self.set_dirs(i, job, sid) for i in range(K)} if sid \
                else {}
            if not any(kept.get(i) for i in range(K) if i not in succeeded):
                break
            time.sleep(0.05)
        others = {i: [d for d in self.sets_of(i, job)
                      if not d.endswith(f"-{sid}")] for i in range(K)}
        keep = {"ok": True, "problems": []}
        res["checks"]["no set kept"] = keep
        for i in range(K):
            if kept.get(i) and i not in succeeded:
                keep["problems"].append(
                    f"node {i}, whose rank's snapshot failed, keeps "
                    f"{[os.path.basename(d) for d in kept[i]]}")
            elif kept.get(i):
                res["notes"].append(
                    f"node {i} committed set {sid} (its rank succeeded) "
                    f"while the op failed elsewhere: the leftover of "
                    f"docs/design.md, which no restore may use")
            if others[i]:
                keep["problems"].append(f"node {i} holds other sets of the "
                                        f"job: {others[i]}")
        m1 = self.metrics_all()
        for i in range(K):
            rb = m1.get(i, {}).get("ef_retained_bytes")
            if rb is None:
                keep["problems"].append(f"node {i}: no ef_retained_bytes in "
                                        f"its metrics")
            elif rb != 0:
                keep["problems"].append(f"node {i} holds {rb:.0f} bytes of "
                                        f"sets in memory (ef_retained_bytes)")
        keep["ok"] = not keep["problems"]
        if sid is not None and len(succeeded) < K:
            probs = self.snap_run(bdir, job, ["--restore-id", sid, "--ops",
                                              "6"], 60 + 6 * TIMEOUT_MS / 1000)
            cb = check.check_restore_fails(self.logs(bdir), self.ref, 0)
            cb["problems"] += probs
            cb["ok"] = not cb["problems"]
            res["checks"]["restore refused"] = cb
        elif sid is not None:
            res["notes"].append("the op completed on every rank before the "
                                "cut: no failed set to restore")
        cut["ok"] = not cut["problems"]
        self.daemons_alive(res)
        if heal is None:
            res["restarted"] = True
            c4 = res["checks"]["4 daemons"]
            c4["problems"] += self.reset_cluster(
                f"no working allreduce within {self.heal_bound():.0f} s of "
                f"the heal")
            c4["ok"] = not c4["problems"]
        self.verify_run(res, os.path.join(sdir, "verify"), job)
        self.daemons_alive(res)
        res["metrics_delta"] = self.metrics_delta(m0, self.metrics_all())
        res["secs"] = round(time.monotonic() - t_start, 1)
        return res

    # -- reporting --------------------------------------------------------------------------

    def summary(self, res):
        cs = res["checks"]
        say(f"-- {res['name']} ({res['secs']} s, job {res['job']})")
        c2 = cs.get("2 contract")
        if c2:
            c1 = cs["1 prefix"]
            ff = c2["first_failure"]
            say(f"   ops {c2['ops']} logged, {c2['failures']} failed; fault "
                f"{res.get('fault_s')} s, cluster works again "
                + (f"{res['heal_s']} s after the heal" if res.get("heal_s")
                   is not None else "NEVER (within "
                   f"{self.heal_bound():.0f} s)"))
            if ff is None:
                say(f"   no op failed ({c1['good_ops']} good ops)")
            else:
                say(f"   first failure: op {ff}"
                    + (f", {c2['first_failure_after_s']} s after the fault "
                       "began" if "first_failure_after_s" in c2 else ""))
                for r, m in c2["first_msgs"].items():
                    say(f"     rank {r}: {m}")
                say("   dying op outcomes: "
                    + (f"MIXED ({c2['mixed_detail']})" if c2["mixed"]
                       else "same on every rank"))
                say(f"   later ops: {c2['later_ops']}, succeeded "
                    f"{c2['later_successes']}, failed without naming the "
                    f"first failure {c2['later_unnamed']}, slower than "
                    f"{check.AT_ONCE_S:g} s {c2['later_slow']}, own daemon "
                    f"gone {c2['later_notconn']}")
            if c1.get("beyond_reference"):
                say(f"   {c1['beyond_reference']} good ops past the reference"
                    f" run (checked across ranks only)")
        if res.get("damaged"):
            say(f"   damaged: {res['damaged']}")
        for cname in ("damaged restore fails", "restore refused"):
            for r, h in cs.get(cname, {}).get("how", {}).items():
                say(f"     rank {r}: {h}")
        if res.get("snap_how"):
            say(f"   snapshot op of set {res.get('set')}:")
            for r, h in res["snap_how"].items():
                say(f"     rank {r}: {h}")
        for n in res["notes"]:
            say(f"   note: {n}")
        if res.get("metrics_delta"):
            say("   counters (per node): " + ", ".join(
                f"{k} {v}" for k, v in sorted(res["metrics_delta"].items())))
        for name, c in cs.items():
            say(f"   [{'PASS' if c['ok'] else 'FAIL'}] {name}")
            for pr in c["problems"][:6]:
                say(f"          {pr}")
            if len(c["problems"]) > 6:
                say(f"          ... {len(c['problems']) - 6} more")

    # -- main --------------------------------------------------------------------------------

    def plan(self):
        if self.args.only:
            return self.args.only.split(",")
        if not self.args.seconds:
            return list(ALL)
        return None

    def run(self):
        t0 = time.monotonic()
        say(f"chaos: work dir {self.work}; seed {self.args.seed}")
        self.cl.net_up()
        self.cl.start()
        self.reference()
        plan = self.plan()
        idx = 0
        while True:
            if plan is not None:
                if idx >= len(plan):
                    break
                name = plan[idx]
            else:
                if time.monotonic() - t0 > self.args.seconds:
                    break
                name = self.rng.choice(ALL)
            idx += 1
            if name == "snapshot-partition":
                res = self.snapshot_partition_scenario(idx, name)
            elif name.startswith("snapshot"):
                res = self.snapshot_scenario(idx, name)
            elif name == "restart-alone":
                res = self.restart_alone_scenario(idx, name)
            elif name == "linger":
                res = self.linger_scenario(idx, name)
            else:
                res = self.fault_scenario(idx, name)
            self.results.append(res)
            self.summary(res)
            with open(os.path.join(self.work, "results.json"), "w") as f:
                json.dump(self.results, f, indent=1, default=str)
        # (4) at the end: every daemon exits 0 on SIGTERM.
        final = {}
        for i in range(K):
            final[i] = self.cl.stop(i)
        bad = [f"obcommd {i} exited with {rc} on SIGTERM: "
               f"{check.short(self.cl.tail(i, 600), 300)}"
               for i, rc in final.items() if rc != 0]
        return self.report(final, bad, time.monotonic() - t0)

    def report(self, final, bad, secs):
        say("\n==== chaos summary")
        say(f"{'scenario':<18} {'ops':>6} {'fail':>5} {'1st':>6} {'mixed':>5} "
            f"{'later-ok':>8} {'unnamed':>7} {'heal s':>6}  checks")
        failed = 0
        died = mixed = 0
        by_check = {}
        for r in self.results:
            c2 = r["checks"].get("2 contract", {})
            ff = c2.get("first_failure")
            died += ff is not None
            mixed += bool(c2.get("mixed"))
            marks = []
            for n, c in r["checks"].items():
                by_check.setdefault(n, [0, 0])[0 if c["ok"] else 1] += 1
                marks.append(("+" if c["ok"] else "-") + n.split()[0])
                failed += not c["ok"]
            say(f"{r['name']:<18} {c2.get('ops', '-'):>6} "
                f"{c2.get('failures', '-'):>5} "
                f"{'-' if ff is None else ff:>6} "
                f"{('yes' if c2.get('mixed') else 'no') if c2 else '-':>5} "
                f"{c2.get('later_successes', '-'):>8} "
                f"{c2.get('later_unnamed', '-'):>7} "
                f"{r.get('heal_s', '-') if r.get('heal_s') is not None else ('-' if not c2 else 'never'):>6}  "
                + " ".join(marks))
        say(f"runs that died: {died}; dying op with mixed outcomes: {mixed} "
            f"of {died}")
        for n, (ok, bad_) in sorted(by_check.items()):
            say(f"  check {n}: {ok} passed, {bad_} failed")
        say(f"final SIGTERM: exit statuses {final}")
        for b in bad:
            say(f"  FAIL {b}")
        failed += len(bad)
        say(f"chaos: {len(self.results)} scenarios in {secs:.0f} s; "
            f"{'ALL CHECKS PASSED' if not failed else f'{failed} FAILED CHECKS'}"
            f"; logs in {self.work}")
        return 0 if not failed else 1

    def teardown(self):
        for p in list(self.trainers):
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.cl.kill_all()
        C.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--short", action="store_true")
    g.add_argument("--seconds", type=int)
    g.add_argument("--only")
    g.add_argument("--cleanup", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true",
                    help="keep the logs also when every check passed")
    ap.add_argument("--long-partition", type=int, default=60,
                    help="seconds of the long partition (default 60)")
    args = ap.parse_args()
    if args.cleanup:
        try:
            with C.Lock():  # another run's namespaces stay
                C.cleanup(verbose=True)
        except RuntimeError as e:
            say(f"chaos: not cleaning up: {e}")
        return 0
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if os.geteuid() != 0:
        say("chaos: needs root (network namespaces, iptables); skipped")
        return 77
    for tool in ("ip", C.IPT):
        if shutil.which(tool) is None:
            say(f"chaos: no {tool}; skipped (deploy/bootstrap.sh installs "
                f"iptables)")
            return 77
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        lock = C.Lock()
    except RuntimeError as e:
        say(f"chaos: {e}")
        return 1
    with lock:
        return drive(args)


def drive(args):
    d = Driver(args)
    rc = 1
    try:
        rc = d.run()
    except Interrupted as e:
        say(f"chaos: interrupted ({e}); cleaning up")
        rc = 1
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        say(f"chaos: ERROR {e}; logs in {d.work}")
        for i in range(K):
            say(f"--- obcommd {i} log tail:\n{d.cl.tail(i, 1500)}")
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        d.teardown()
    if not args.keep:
        if rc == 0:
            shutil.rmtree(d.work, ignore_errors=True)
        else:
            # The logs stay; the snapshot sets and optimizer files (tens
            # of MB per scenario) go.
            for p in (glob.glob(os.path.join(d.work, "state*")) +
                      glob.glob(os.path.join(d.work, "*", "adam"))):
                shutil.rmtree(p, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
