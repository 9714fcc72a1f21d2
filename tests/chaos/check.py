"""The chaos test's checks, over the trainers' logs (tests/chaos/trainer.py)
and the daemons' status JSON. Pure functions: each returns a dict with
"ok" (bool), "problems" (list of strings, the reasons it is not ok) and
counts for the summary.

(1) prefix     every op before the run's first failure succeeded on every
               rank with identical digests, equal to the reference run's.
(2) contract   once an op failed on any rank, every later op fails on every
               rank, naming the first failure ("cannot continue", or the
               rank that "left the job": decided
               when the op is created, so at once; the time it took is
               reported, not judged). At the dying op ranks may differ only
               in that some succeeded (with the reference digest) and some
               failed: counted as "mixed", the inherent window.
(3) fresh run  a new run of the job after the fault gets the reference
               results from zero, and while it pauses every node's status
               shows the same run and the same versions for every 1-bit key.
(4) daemons    checked by the driver (alive, exit 0 on SIGTERM).
"""

import json
import os

E_NOTCONN = -1006
CANNOT = "cannot continue"
# A run stopped because a rank left names that rank so in every later op.
LEFT = "left the job"
# libobcomm's message on every call after its daemon connection broke.
OWN_GONE = "unusable after an earlier failure"
AT_ONCE_S = 1.0


def read_log(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        out.append({"ev": "garbage", "line": line[:200]})
    except OSError:
        pass
    return out


def ops_of(entries):
    return {e["seq"]: e for e in entries if e.get("ev") == "op"}


def by_seq(logs):
    """logs: {rank: entries} -> {seq: {rank: op entry}}"""
    out = {}
    for r, entries in logs.items():
        for seq, e in ops_of(entries).items():
            out.setdefault(seq, {})[r] = e
    return out


def short(msg, n=160):
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= n else msg[:n - 3] + "..."


def fmt_ranks(rs):
    return ",".join(str(r) for r in sorted(rs))


def reference(logs, ops):
    """The reference run's digests {seq: digest}; raises when the reference
    run itself was not healthy."""
    seqs = by_seq(logs)
    ref = {}
    for seq in range(ops):
        row = seqs.get(seq, {})
        if len(row) != len(logs):
            raise RuntimeError(f"reference run: op {seq} logged by ranks "
                               f"{fmt_ranks(row)} only")
        bad = {r: e for r, e in row.items() if e["status"] != 0}
        if bad:
            r, e = next(iter(bad.items()))
            raise RuntimeError(f"reference run: op {seq} failed on rank {r}: "
                               f"{e['name']}: {short(e['msg'])}")
        ds = {e["digest"] for e in row.values()}
        if len(ds) != 1:
            raise RuntimeError(f"reference run: op {seq} has {len(ds)} "
                               f"different results across ranks")
        ref[seq] = ds.pop()
    return ref


def first_failure(seqs):
    for seq in sorted(seqs):
        if any(e["status"] != 0 for e in seqs[seq].values()):
            return seq
    return None


def check_prefix(logs, ref, start=0, limit=None):
    """(1): ops start..first failure-1. limit: the run's stop seq (ops at
    or past it are not part of the run)."""
    seqs = by_seq(logs)
    if limit is not None:
        seqs = {s: v for s, v in seqs.items() if s < limit}
    f = first_failure(seqs)
    end = f if f is not None else (max(seqs) + 1 if seqs else start)
    problems, beyond = [], 0
    n = len(logs)
    for seq in range(start, end):
        row = seqs.get(seq, {})
        if len(row) != n:
            problems.append(f"op {seq} logged by ranks {fmt_ranks(row)} "
                            f"only, before any failure")
            continue
        ds = {e["digest"] for e in row.values()}
        if len(ds) != 1:
            problems.append(f"op {seq}: ranks got {len(ds)} different "
                            f"results (all succeeded)")
        elif seq in ref:
            if ds.pop() != ref[seq]:
                problems.append(f"op {seq}: result differs from the "
                                f"reference run's (all ranks agree)")
        else:
            beyond += 1
    return {"ok": not problems, "problems": problems[:20],
            "n_problems": len(problems), "good_ops": end - start,
            "first_failure": f, "beyond_reference": beyond}


def check_contract(logs, ref, limit=None, fault_t=None):
    """(2) on a run's logs. fault_t: wall-clock time the fault began (for
    the report only)."""
    seqs = by_seq(logs)
    if limit is not None:
        seqs = {s: v for s, v in seqs.items() if s < limit}
    f = first_failure(seqs)
    res = {"ok": True, "problems": [], "first_failure": f, "mixed": False,
           "later_ops": 0, "later_successes": 0, "later_unnamed": 0,
           "later_slow": 0, "later_notconn": 0, "first_msgs": {},
           "max_later_s": 0.0, "ops": sum(len(v) for v in seqs.values()),
           "failures": sum(1 for v in seqs.values() for e in v.values()
                           if e["status"] != 0)}
    if f is None:
        return res
    probs = res["problems"]
    row = seqs[f]
    res["first_msgs"] = {r: f"{e['name']}: {short(e['msg'])}"
                         for r, e in sorted(row.items()) if e["status"] != 0}
    if fault_t is not None:
        t = min(e["t1"] for e in row.values() if e["status"] != 0)
        res["first_failure_after_s"] = round(t - fault_t, 2)
    ok_ranks = [r for r, e in row.items() if e["status"] == 0]
    if ok_ranks:
        res["mixed"] = True
        res["mixed_detail"] = (f"op {f}: succeeded on ranks "
                               f"{fmt_ranks(ok_ranks)}, failed on "
                               f"{fmt_ranks(r for r in row if r not in ok_ranks)}")
        ds = {row[r]["digest"] for r in ok_ranks}
        if len(ds) != 1:
            probs.append(f"dying op {f}: the ranks that succeeded got "
                         f"different results")
        elif f in ref and ds.pop() != ref[f]:
            probs.append(f"dying op {f}: ranks {fmt_ranks(ok_ranks)} "
                         f"succeeded with a result that differs from the "
                         f"reference")
    own_first = {}
    for r, entries in logs.items():
        for seq, e in sorted(ops_of(entries).items()):
            if e["status"] != 0:
                own_first[r] = seq
                break
    # A rank that saw the dying op succeed fails at the next op with a
    # reason of its own (it may never hear of the dying op's failure: the
    # failing node can be cut off from it); the other ranks of that op may
    # hear that reason first. Both are true first failures, not silence.
    own_next = {e["msg"] for r, e in seqs.get(f + 1, {}).items()
                if e["status"] != 0 and own_first.get(r) == f + 1}
    succ, unnamed, slow = [], [], []
    for seq in sorted(s for s in seqs if s > f):
        for r, e in sorted(seqs[seq].items()):
            res["later_ops"] += 1
            dt = e["t1"] - e["t0"]
            if e["status"] == 0:
                succ.append((seq, r))
                continue
            if e["status"] == E_NOTCONN or OWN_GONE in e["msg"]:
                # This rank's own daemon is gone (killed on purpose): the
                # library fails every later call at once, naming that.
                res["later_notconn"] += 1
                continue
            if CANNOT not in e["msg"].lower() and LEFT not in e["msg"]:
                if seq == f + 1 and (own_first.get(r) == seq or
                                     e["msg"] in own_next):
                    continue  # its own first failure, right after the window
                unnamed.append((seq, r, f"{e['name']}: {short(e['msg'], 120)}"))
                continue
            res["max_later_s"] = max(res["max_later_s"], dt)
            if dt > AT_ONCE_S:
                slow.append((seq, r, dt))
    res["later_successes"] = len(succ)
    res["later_unnamed"] = len(unnamed)
    res["later_slow"] = len(slow)
    if succ:
        first_ok = succ[0]
        seqs_ok = sorted({s for s, _ in succ})
        probs.append(f"{len(succ)} later op(s) SUCCEEDED after the run died "
                     f"at op {f}: ops {seqs_ok[0]}..{seqs_ok[-1]} "
                     f"({len(seqs_ok)} ops; first: op {first_ok[0]} on rank "
                     f"{first_ok[1]})")
    if unnamed:
        s, r, m = unnamed[0]
        kinds = sorted({m.split(":")[0] for _, _, m in unnamed})
        probs.append(f"{len(unnamed)} later failure(s) do not name the first "
                     f"failure ('{CANNOT}' missing; {', '.join(kinds)}); "
                     f"first: op {s} rank {r}: {m}")
    # How long later failures took is reported, never judged: the machine
    # is shared and noisy. "cannot continue" is decided when the op is
    # created, without waiting for anyone, which the message shows.
    res["ok"] = not probs
    return res


def check_fresh(logs, ref, ops, barrier_needed=True):
    """(3), first half: a healthy run from zero equals the reference."""
    seqs = by_seq(logs)
    probs = []
    n = len(logs)
    failed = mism = 0
    for seq in range(ops):
        row = seqs.get(seq, {})
        bad = {r: e for r, e in row.items() if e["status"] != 0}
        if len(row) != n or bad:
            failed += 1
            if failed == 1:
                if bad:
                    r, e = sorted(bad.items())[0]
                    probs.append(f"op {seq} failed on rank {r}: {e['name']}: "
                                 f"{short(e['msg'])}")
                else:
                    probs.append(f"op {seq} logged by ranks "
                                 f"{fmt_ranks(row)} only")
            continue
        ds = {e["digest"] for e in row.values()}
        if len(ds) != 1 or (seq in ref and ds.pop() != ref[seq]):
            mism += 1
            if mism == 1:
                probs.append(f"op {seq} (key/kind {row[0]['kind']} "
                             f"{row[0]['key']}) differs from the reference "
                             f"run from zero" if len(ds) <= 1 else
                             f"op {seq}: ranks disagree")
    if failed > 1:
        probs.append(f"{failed} of {ops} ops failed")
    if mism > 1:
        probs.append(f"{mism} of {ops} ops differ from the reference")
    if mism:
        keys = sorted({seqs[s][0]["key"] for s in range(ops)
                       if s in seqs and 0 in seqs[s] and
                       seqs[s][0]["status"] == 0 and
                       seqs[s][0]["digest"] != ref.get(s)})
        probs.append(f"differing keys: {keys} (0 = fp32)")
    if barrier_needed:
        for r, entries in logs.items():
            bs = [e for e in entries if e.get("ev") == "barrier"]
            if not bs or bs[0]["status"] != 0:
                probs.append(f"rank {r} did not pass the pause barrier")
    return {"ok": not probs, "problems": probs, "failed": failed,
            "mismatched": mism}


def job_entry(st, job):
    jobs = st.get("jobs")
    if not isinstance(jobs, list):
        return None, "no 'jobs' array"
    for j in jobs:
        if isinstance(j, dict) and j.get("name") == job:
            return j, None
    return None, f"job {job!r} not among {[j.get('name') for j in jobs]}"


def check_versions(statuses, job, keys, ops_json=None):
    """(3), second half: statuses {node: obcommctl --json status}. Every
    node's entry for the job must carry "run" and "keys" (key, count,
    origin, applied, last_seq), identical across nodes, with every 1-bit
    key of the stream present. Missing fields fail."""
    probs, views = [], {}
    for n, st in sorted(statuses.items()):
        if isinstance(st, Exception):
            probs.append(f"node {n}: obcommctl status failed: {st}")
            continue
        j, why = job_entry(st, job)
        if j is None:
            hint = ""
            if ops_json and isinstance(ops_json.get(n), dict):
                oj, _ = job_entry(ops_json[n], job)
                if oj is not None:
                    hint = (" ('obcommctl --json ops' lists the job, with "
                            + ("'run'/'keys'" if "run" in oj or "keys" in oj
                               else "no 'run'/'keys' either") + ")")
            probs.append(f"node {n}: 'obcommctl --json status' has no "
                         f"versions for job {job!r}: {why}{hint}; the daemon "
                         f"does not expose the run and 1-bit key versions")
            continue
        missing = [k for k in ("run", "keys") if k not in j]
        if missing:
            probs.append(f"node {n}: job {job!r} in 'obcommctl --json "
                         f"status' lacks {missing}: the daemon does not "
                         f"expose the run and 1-bit key versions")
            continue
        try:
            ks = sorted((int(k["key"]), int(k["count"]), str(k["origin"]),
                         int(k["applied"]), int(k["last_seq"]))
                        for k in j["keys"])
        except (KeyError, TypeError, ValueError) as e:
            probs.append(f"node {n}: malformed 'keys' {j['keys']!r}: {e}")
            continue
        views[n] = (str(j["run"]), ks)
    if views:
        runs = {v[0] for v in views.values()}
        if len(runs) != 1:
            probs.append("nodes differ in 'run': " + ", ".join(
                f"node {n} {v[0]}" for n, v in sorted(views.items())))
        kv = {n: v[1] for n, v in views.items()}
        if len({tuple(v) for v in kv.values()}) != 1:
            probs.append("nodes differ in 1-bit key versions: " + "; ".join(
                f"node {n} {v}" for n, v in sorted(kv.items())))
        for n, v in sorted(kv.items()):
            have = {k[0] for k in v}
            lack = [k for k in keys if k not in have]
            if lack:
                probs.append(f"node {n}: keys {lack} missing from 'keys'")
    # The same complaint from every node is said once.
    if len(probs) == len(statuses) > 1:
        rest = {p.split(":", 1)[1] for p in probs}
        if len(rest) == 1 and all(p.startswith(f"node {n}:")
                                  for p, n in zip(probs, sorted(statuses))):
            probs = [f"every node ({fmt_ranks(statuses)}):" + rest.pop()]
    return {"ok": not probs, "problems": probs,
            "views": {n: {"run": v[0], "keys": v[1]}
                      for n, v in views.items()}}


def check_restore_fails(logs, ref, start):
    """A run that resumes from a damaged snapshot set: the explicit
    restore (obcomm_adam_load, or the first 1-bit op after it) must fail
    on every rank, and no 1-bit op of that run may succeed anywhere."""
    probs, how = [], {}
    for r, entries in sorted(logs.items()):
        rs = [e for e in entries if e.get("ev") == "restore"]
        badload = [e for e in rs if e["status"] != 0]
        ops = ops_of(entries)
        if badload:
            e = badload[0]
            how[r] = f"load key {e['key']}: {e['name']}: {short(e['msg'])}"
            continue
        first = ops.get(start)
        if first is None:
            how[r] = "no load failure and no op logged"
            probs.append(f"rank {r}: restore did not fail and no op ran")
        elif first["status"] != 0:
            how[r] = f"first op: {first['name']}: {short(first['msg'])}"
        else:
            how[r] = "restore SUCCEEDED"
            probs.append(f"rank {r}: the restore from the damaged set "
                         f"succeeded (load and op {start} both ok)")
    ok_1bit = [(s, r) for r, entries in logs.items()
               for s, e in ops_of(entries).items()
               if e["kind"] == "1bit" and e["status"] == 0]
    if ok_1bit:
        seqs = by_seq(logs)
        same = sorted({s for s, r in ok_1bit
                       if seqs[s][r]["digest"] == ref.get(s)})
        diff = sorted({s for s, r in ok_1bit} - set(same))
        probs.append(f"{len(ok_1bit)} 1-bit op(s) succeeded in the run that "
                     f"restores a damaged set (first: op "
                     f"{min(ok_1bit)[0]} on rank {min(ok_1bit)[1]}); "
                     f"results equal to the uninterrupted run's: ops {same}, "
                     f"different: ops {diff}"
                     + (" (a silent mix of restored and fresh state)"
                        if diff else ""))
    return {"ok": not probs, "problems": probs, "how": how}


def check_restore_ok(logs, ref, start, ops):
    """The positive control: an undamaged set restored explicitly gives
    the uninterrupted run's results from `start` on."""
    probs = []
    for r, entries in sorted(logs.items()):
        for e in entries:
            if e.get("ev") in ("restore", "save") and e["status"] != 0:
                probs.append(f"rank {r}: {e['ev']} key {e['key']} failed: "
                             f"{e['name']}: {short(e['msg'])}")
    seqs = by_seq(logs)
    mism = failed = 0
    for seq in range(start, ops):
        row = seqs.get(seq, {})
        if len(row) != len(logs) or any(e["status"] for e in row.values()):
            failed += 1
            continue
        if {e["digest"] for e in row.values()} != {ref.get(seq)}:
            mism += 1
    if failed:
        probs.append(f"{failed} of {ops - start} resumed ops failed")
    if mism:
        probs.append(f"{mism} of {ops - start} resumed ops differ from the "
                     f"uninterrupted reference run")
    return {"ok": not probs, "problems": probs}


def snapset_id(run, seq):
    """daemon/snapset.c obd_snapset_id: the id every node gives the set of
    the snapshot op `seq` of run `run`."""
    m = (1 << 64) - 1
    z = run ^ ((seq + 0x9e3779b97f4a7c15) & m)
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
    z ^= z >> 31
    return z if z != 0 else 1


def check_snapshot_cut(logs, sid, cut, strict):
    """A snapshot op (obcomm_save_1bit, the "snapshot" log line) during
    which node `cut` was cut off: every rank answers; it fails on every
    rank, except that a rank whose node saw every report before the cut
    may succeed with the set's id `sid` (the leftover of docs/design.md;
    the caller checks that a restore of it is refused). With the cut in
    before the op began (strict) success anywhere is a problem."""
    probs, how, succeeded = [], {}, set()
    for r, entries in sorted(logs.items()):
        ev = [e for e in entries if e.get("ev") == "snapshot"]
        if not ev:
            how[r] = "no answer"
            probs.append(f"rank {r}: no snapshot op logged")
            continue
        e = ev[0]
        if e["status"] == 0:
            succeeded.add(r)
            how[r] = f"ok, set {e['id']}"
            if sid is not None and e["id"] != sid:
                probs.append(f"rank {r}: set {e['id']}, not {sid}")
        else:
            how[r] = f"{e['name']}: {short(e['msg'])}"
    if succeeded and strict:
        probs.append(f"ranks {fmt_ranks(sorted(succeeded))} saved set {sid}"
                     f" although node {cut} was cut off before the op began")
    return {"ok": not probs, "problems": probs, "how": how,
            "succeeded": succeeded}


def load_run(dirpath, ranks):
    return {r: read_log(os.path.join(dirpath, f"rank{r}.log"))
            for r in range(ranks)}
