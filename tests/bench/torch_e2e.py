#!/usr/bin/python3
"""torch_e2e: end-to-end training steps per second of one contender, one
process per node, on the emulated cluster of deploy/netns-cluster.sh
(tests/bench/run_torch_e2e.sh runs every contender and writes the report).

  torch_e2e.py run --contender C --model M --rank R --world N
                   --master ADDR:PORT [--steps 60] [--warmup-frac 0.15]
                   [--batch B] [--lr X] [--seed 1] [--threads 1] [--dev ob0]
                   [--job NAME] [--onebit-args 'k=v,...'] [--powersgd-rank 2]
                   [--bucket-cap-mb MB]
                   [--data /usr/share/datasets/fashion-mnist]
  torch_e2e.py report RAWDIR OUTDIR [--meta TEXT]

Contenders (the same model, data, seed and steps for all):
  floor         forward + backward only on every rank at once: no
                communication and no optimizer step (the compute floor)
  ddp-gloo      torch.optim.Adam, DistributedDataParallel over Gloo
  ddp-powersgd  the same with torch's PowerSGD hook (powerSGD_hook,
                compression from the warm-up's end on, error feedback, warm
                start)
  ddp-powersgd-1b  the same in one DDP bucket (--bucket-cap-mb larger
                than the model). torch 1.13's hook issues a bucket's second
                and third allreduce from a future callback, so they can
                reach Gloo before or after the main thread's allreduce of
                the next bucket, in another order on each rank: the likely
                cause of Gloo's abort "op.preamble.length <= op.nbytes"
                with several buckets. One bucket leaves nothing to
                interleave
  ddp-obcomm    torch.optim.Adam, DDP over the obcomm torch.distributed
                backend (fp32 ring of the daemons)
  onebit        obcomm.torch.OneBitAdam (no DDP: it averages itself), with
                freeze_step = the warm-up steps and bias_correction=True
                (as torch's Adam); --onebit-args passes more keyword
                arguments to its constructor, or overrides these
                ("overlap=True, bucket_cap_mb=25"; Python literals)
  zeroone       obcomm.torch.ZeroOneAdam (0/1 Adam), var_freeze_step = the
                warm-up steps, DeepSpeed's defaults otherwise
  lamb          obcomm.torch.OneBitLamb (1-bit LAMB), freeze_step = the
                warm-up steps, DeepSpeed's defaults otherwise

Models:
  mlp           784-4096-4096-10 ReLU MLP (20.0 M parameters) on
                Fashion-MNIST, cross-entropy; rank r of N takes every N-th
                sample of a seeded permutation of the training set
  transformer   a causal transformer language model: 2 pre-norm layers,
                d_model 512, 8 heads, feed-forward 2048, no dropout,
                vocabulary 64, context 8, learned positions, output
                tied to the embedding (6.3 M parameters), batches of 4
                sequences (32 tokens) per node, trained on a
                synthetic Markov chain: every token has 4 fixed random
                successors with probabilities 0.55/0.25/0.15/0.05 (the
                best achievable loss is the chain's entropy, 1.11 nats);
                each rank samples its own sequences from its own seed

The warm-up, warmup_frac x steps rounded half up, is OneBitAdam's
freeze_step and PowerSGD's start_powerSGD_iter. The loop starts on every
rank after a barrier on a TCP store of rank 0 (MASTER), which also serves
Gloo's and obcomm's rendezvous; nothing else crosses the network outside
the contender's own communication. A step's time is the wall time of
zero_grad, forward, backward and the optimizer step (for floor: zero_grad,
forward and backward; the optimizer step's share is kept apart), one
thread of torch (--threads).

`run` prints one JSON line on stdout: every step's time and loss, the tx
bytes of DEV (/proc/net/dev of the node's namespace: the trainer and its
daemon) at the loop's start, at the warm-up's end and at its end, and
"status" ("ok", "diverged" with the step, or "error" with the exception).
`report` merges the lines of RAWDIR/*.jsonl (one file per contender, model
and node count) into OUTDIR/e2e.jsonl and OUTDIR/e2e.md. Needs Debian's
torch: run with the project's .venv/bin/python.
"""

import argparse
import ast
import datetime
import gzip
import json
import math
import os
import statistics
import sys
import time
import traceback

# tx_bytes of a device in this network namespace (-1 without it), as the
# allreduce benchmark reads it.
from gloo_allreduce import dev_tx_bytes

CONTENDERS = ("floor", "ddp-gloo", "ddp-powersgd", "ddp-powersgd-1b",
              "ddp-obcomm", "onebit", "zeroone", "lamb")
# The obcomm optimizers: no DDP, each averages itself.
OBCOMM_OPTS = ("onebit", "zeroone", "lamb")
MODELS = ("mlp", "transformer")
DEFAULT_LR = {"mlp": 1e-4, "transformer": 1e-3}
DEFAULT_BATCH = {"mlp": 8, "transformer": 4}
FINAL_WINDOW = 20  # the final loss: mean of the last 20 steps
# OneBitAdam's arguments before --onebit-args: bias correction as torch's
# Adam of the DDP contenders has it. OneBitAdam's default (DeepSpeed's) is
# off, made for warm-ups of thousands of steps; after a warm-up of 6 steps
# the frozen variance would be 1 - 0.999^6 = 0.6 % of its corrected value,
# every later step 13x too large.
ONEBIT_BASE = {"bias_correction": True}

# The transformer and its task.
LM_VOCAB, LM_DMODEL, LM_LAYERS, LM_HEADS, LM_FF, LM_CONTEXT = \
    64, 512, 2, 8, 2048, 8
CHAIN_PROBS = (0.55, 0.25, 0.15, 0.05)


def parse_kwargs(text):
    """'a=1, b=True' -> {"a": 1, "b": True} (values are Python literals)."""
    out = {}
    for item in text.replace(",", " ").split():
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise ValueError(f"--onebit-args: {item!r} is not key=value")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


# -- models and data ----------------------------------------------------------


def make_model(name):
    import torch
    import torch.nn as nn

    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 4096), nn.ReLU(),
                             nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 10))

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(LM_VOCAB, LM_DMODEL)
            # Small, as GPT-2's: the output is tied to it, and N(0, 1)
            # rows would start the logits at a scale of sqrt(d_model).
            nn.init.normal_(self.emb.weight, std=0.02)
            self.pos = nn.Parameter(torch.randn(LM_CONTEXT, LM_DMODEL) * 0.02)
            layer = nn.TransformerEncoderLayer(
                LM_DMODEL, LM_HEADS, LM_FF, dropout=0.0, batch_first=True,
                norm_first=True)
            self.enc = nn.TransformerEncoder(layer, LM_LAYERS)
            self.norm = nn.LayerNorm(LM_DMODEL)
            # A plain attribute, not a buffer: DDP would broadcast a buffer
            # before every forward.
            self.causal = torch.triu(
                torch.full((LM_CONTEXT, LM_CONTEXT), float("-inf")), 1)

        def forward(self, x):
            h = self.emb(x) + self.pos[:x.shape[1]]
            h = self.enc(h, mask=self.causal[:x.shape[1], :x.shape[1]])
            return self.norm(h) @ self.emb.weight.t()

    return TinyLM()


def load_fmnist(data):
    import numpy as np
    import torch

    def idx(path):
        with gzip.open(path, "rb") as f:
            raw = f.read()
        ndim = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
                for i in range(ndim)]
        return np.frombuffer(raw, dtype=np.uint8,
                             offset=4 + 4 * ndim).reshape(dims)

    x = idx(os.path.join(data, "train-images-idx3-ubyte.gz"))
    y = idx(os.path.join(data, "train-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).reshape(len(x), -1)
    # The training set's mean and std, as client/python/examples/cnn_fmnist.py.
    return (x - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))


def make_batches(a, rank, world):
    """[(input, target)] for every step of this rank, made before the loop
    so that no step pays for data."""
    import torch

    if a.model == "mlp":
        x, y = load_fmnist(a.data)
        perm = torch.randperm(len(y), generator=torch.Generator()
                              .manual_seed(a.seed))
        shard = perm[rank::world]
        out, pos = [], 0
        for _ in range(a.steps):
            if pos + a.batch > len(shard):
                pos = 0
            i = shard[pos:pos + a.batch]
            pos += a.batch
            out.append((x[i], y[i]))
        return out
    # The chain is the same on every rank (seed 1234); the samples are the
    # rank's own.
    g = torch.Generator().manual_seed(1234)
    succ = torch.stack([torch.randperm(LM_VOCAB, generator=g)[:len(CHAIN_PROBS)]
                        for _ in range(LM_VOCAB)])
    probs = torch.tensor(CHAIN_PROBS)
    g = torch.Generator().manual_seed(a.seed * 1000003 + rank + 1)
    n = a.steps * a.batch
    seq = torch.empty(n, LM_CONTEXT + 1, dtype=torch.int64)
    seq[:, 0] = torch.randint(0, LM_VOCAB, (n,), generator=g)
    for t in range(LM_CONTEXT):
        pick = torch.multinomial(probs.expand(n, -1), 1, generator=g)[:, 0]
        seq[:, t + 1] = succ[seq[:, t], pick]
    return [(seq[s * a.batch:(s + 1) * a.batch, :-1],
             seq[s * a.batch:(s + 1) * a.batch, 1:].reshape(-1))
            for s in range(a.steps)]


def chain_entropy():
    return -sum(p * math.log(p) for p in CHAIN_PROBS)


# -- one run --------------------------------------------------------------------


def store_barrier(store, name, world, rank, everyone=True, timeout_s=600):
    """Rank 0 waits until every rank has arrived at barrier NAME; so does
    every rank if EVERYONE. Rank 0 serves the store: the last barrier of a
    run must be everyone=False, or a rank still polling would find the
    store gone when rank 0 leaves."""
    store.add(name, 1)
    if rank != 0 and not everyone:
        return
    deadline = time.monotonic() + timeout_s
    while store.add(name, 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: not every rank arrived in "
                               f"{timeout_s} s")
        time.sleep(0.005)


def run(a):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", a.dev)
    os.environ["OBCOMM_JOB"] = a.job
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    rank, world = a.rank, a.world
    lr = a.lr if a.lr is not None else DEFAULT_LR[a.model]
    warmup = math.floor(a.warmup_frac * a.steps + 0.5)  # 0.15 x 30 = 5
    onebit_kwargs = dict(ONEBIT_BASE, **parse_kwargs(a.onebit_args))
    host, _, port = a.master.partition(":")
    timeout = datetime.timedelta(seconds=a.timeout)
    store = dist.TCPStore(host, int(port or 29500), world, rank == 0,
                          timeout)

    result = {"contender": a.contender, "model": a.model, "nodes": world,
              "rank": rank, "steps": a.steps, "warmup_steps": warmup,
              "batch": a.batch, "lr": lr, "seed": a.seed,
              "threads": a.threads, "torch": torch.__version__,
              "status": "ok"}
    if a.contender == "onebit":
        result["onebit_args"] = onebit_kwargs
    if a.contender.startswith("ddp-powersgd"):
        result["powersgd_rank"] = a.powersgd_rank
    step_ms, opt_ms, losses = [], [], []
    tx = {}
    opt = None
    try:
        batches = make_batches(a, rank, world)
        torch.manual_seed(a.seed)  # the same initial model on every rank
        model = make_model(a.model)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        net = model
        if a.contender in ("ddp-obcomm",) + OBCOMM_OPTS:
            import obcomm.torch  # also registers the backend "obcomm"
        if a.contender == "ddp-powersgd-1b" and a.bucket_cap_mb is None:
            a.bucket_cap_mb = math.ceil(result["parameters"] * 4 / 2**20) + 1
        if a.contender in ("ddp-gloo", "ddp-powersgd", "ddp-powersgd-1b"):
            dist.init_process_group("gloo", store=store, rank=rank,
                                    world_size=world, timeout=timeout)
        elif a.contender == "ddp-obcomm":
            dist.init_process_group("obcomm", store=store, rank=rank,
                                    world_size=world)
        if a.contender.startswith("ddp-"):
            kw = {}
            if a.bucket_cap_mb is not None:
                # DDP caps its first bucket at this module constant (1 MiB)
                # whatever bucket_cap_mb says.
                dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.bucket_cap_mb * 2**20)
                kw["bucket_cap_mb"] = a.bucket_cap_mb
                result["bucket_cap_mb"] = a.bucket_cap_mb
            net = torch.nn.parallel.DistributedDataParallel(model, **kw)
            if a.contender.startswith("ddp-powersgd"):
                from torch.distributed.algorithms.ddp_comm_hooks import \
                    powerSGD_hook as psgd
                state = psgd.PowerSGDState(
                    process_group=None,
                    matrix_approximation_rank=a.powersgd_rank,
                    start_powerSGD_iter=max(warmup, 2),
                    use_error_feedback=True, warm_start=True,
                    random_seed=a.seed)
                net.register_comm_hook(state, psgd.powerSGD_hook)
            opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-8)
        elif a.contender == "onebit":
            opt = obcomm.torch.OneBitAdam(model.parameters(), lr=lr,
                                          freeze_step=warmup, **onebit_kwargs)
        elif a.contender == "zeroone":
            opt = obcomm.torch.ZeroOneAdam(model.parameters(), lr=lr,
                                           var_freeze_step=warmup)
        elif a.contender == "lamb":
            opt = obcomm.torch.OneBitLamb(model.parameters(), lr=lr,
                                          freeze_step=warmup)
        store_barrier(store, "start", world, rank)
        tx["start"] = dev_tx_bytes(a.dev)
        for step, (x, y) in enumerate(batches):
            if step == warmup:
                tx["warmup_end"] = dev_tx_bytes(a.dev)
            t0 = time.perf_counter()
            if opt is not None:
                opt.zero_grad()
            else:
                model.zero_grad(set_to_none=False)
            out = net(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
            loss.backward()
            t1 = time.perf_counter()
            if opt is not None:
                try:
                    opt.step()
                except Exception as e:
                    # obcomm: a non-finite momentum (E_NONFINITE), the same
                    # on every rank.
                    if getattr(e, "code", None) == -1008:
                        result["status"] = "diverged"
                        result["diverged_at_step"] = step
                        break
                    raise
            t2 = time.perf_counter()
            step_ms.append((t2 - t0) * 1e3)
            opt_ms.append((t2 - t1) * 1e3)
            losses.append(loss.item())
        tx["end"] = dev_tx_bytes(a.dev)
        # Rank 0 keeps the store until every rank is out of the loop.
        store_barrier(store, "end", world, rank, everyone=False)
    except Exception as e:  # reported, not hidden: the report shows it
        traceback.print_exc()
        result["status"] = "error"
        result["error"] = f"{type(e).__name__}: {e}"
        result["failed_at_step"] = len(step_ms)
    result["step_ms"] = [round(t, 3) for t in step_ms]
    result["opt_ms"] = [round(t, 3) for t in opt_ms]
    result["loss"] = losses
    result["tx_bytes"] = tx
    print(json.dumps(result, separators=(",", ":")), flush=True)
    if a.contender in OBCOMM_OPTS and opt is not None:
        opt.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if result["status"] == "ok" else 1


# -- the report -----------------------------------------------------------------


def window_stats(ms, lo, hi):
    w = ms[lo:hi]
    if not w:
        return None, None
    return len(w) / (sum(w) / 1e3), statistics.median(w)


def summarize(lines, extra):
    """One contender, model and node count from its ranks' JSON lines."""
    first = lines[0]
    s = {k: first.get(k) for k in ("contender", "model", "nodes", "steps",
                                   "warmup_steps", "batch", "lr",
                                   "parameters", "threads", "onebit_args",
                                   "powersgd_rank", "bucket_cap_mb")
         if first.get(k) is not None}
    s.update(extra)
    bad = [ln for ln in lines if ln["status"] != "ok"]
    s["status"] = "ok" if not bad and len(lines) == s["nodes"] else (
        bad[0]["status"] if bad else "missing ranks")
    if bad:
        s["errors"] = sorted({
            f"rank {ln['rank']}: " + (
                f"{short_error(ln['error'])} (at step {ln['failed_at_step']})"
                if "error" in ln else
                f"diverged at step {ln.get('diverged_at_step')}")
            for ln in bad})
    w = s["warmup_steps"]
    done = min(len(ln["step_ms"]) for ln in lines)
    s["steps_done"] = done
    if done == s["steps"]:
        # The slowest rank sets a synchronous job's pace; for floor it is
        # the slowest of the ranks computing side by side.
        whole = [window_stats(ln["step_ms"], 0, done) for ln in lines]
        comp = [window_stats(ln["step_ms"], w, done) for ln in lines]
        s["steps_per_s_whole"] = round(min(r for r, _ in whole), 4)
        s["median_ms_whole"] = round(max(m for _, m in whole), 2)
        s["steps_per_s_compress"] = round(min(r for r, _ in comp), 4)
        s["median_ms_compress"] = round(max(m for _, m in comp), 2)
        # Of which the optimizer step (OneBitAdam: with its communication;
        # DDP: the allreduces are inside backward, before it).
        s["median_opt_ms_compress"] = round(max(
            statistics.median(ln["opt_ms"][w:done]) for ln in lines), 2)
    if done == s["steps"] and done >= FINAL_WINDOW:
        avg = [statistics.fmean(ln["loss"][i] for ln in lines)
               for i in range(done - FINAL_WINDOW, done)]
        s["final_loss"] = round(statistics.fmean(avg), 4)
        # Standard error of that mean over the 20 steps: the step-to-step
        # noise, not the run-to-run noise (which needs --repeats).
        s["final_loss_sem"] = round(statistics.stdev(avg) /
                                    math.sqrt(len(avg)), 4)
    tx = [ln["tx_bytes"] for ln in lines]
    if all("start" in t and "end" in t and t["start"] >= 0 for t in tx):
        s["tx_bytes_per_node"] = round(statistics.fmean(
            t["end"] - t["start"] for t in tx))
        if done == s["steps"] and all("warmup_end" in t for t in tx):
            s["tx_bytes_per_step_compress"] = round(statistics.fmean(
                (t["end"] - t["warmup_end"]) / (done - w) for t in tx))
    return s


def short_error(text):
    """The first line of an error, without torch's wrapping of errors
    raised in future callbacks."""
    line = text.strip().split("\n")[0]
    wrap = "Got the following error when running the callback: "
    return line.rsplit(wrap, 1)[-1]


def stderr_reason(path):
    """Why a process died, from the end of its stderr: a C++ abort's
    what() line, else the last Python exception line, else the last
    line."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no stderr"
    for pick in (lambda ln: "what():" in ln,
                 lambda ln: ln.split(":")[0].endswith(("Error", "Exception"))):
        hits = [ln for ln in lines if pick(ln)]
        if hits:
            return short_error(hits[-1])[:240]
    return lines[-1][:240] if lines else "empty stderr"


def fmt(v, f="%.2f"):
    return "n/a" if v is None else f % v


def report(a):
    rows = []
    for name in sorted(os.listdir(a.rawdir)):
        if not name.endswith(".jsonl"):
            continue
        lines, extra = [], {}
        with open(os.path.join(a.rawdir, name)) as f:
            for text in f:
                text = text.strip()
                if not text.startswith("{"):
                    continue
                d = json.loads(text)
                if "run_info" in d:  # the driver's line: load, exit codes
                    extra = d["run_info"]
                else:
                    lines.append(d)
        if lines:
            row = summarize(lines, extra)
        elif extra:
            row = dict(extra, status="no output")
        else:
            continue
        # A rank that exited non-zero without a line of its own (killed,
        # aborted in C++): its stderr says why.
        have = {ln["rank"] for ln in lines}
        for i, code in enumerate(extra.get("exit_codes", [])):
            if code != 0 and i not in have:
                why = stderr_reason(os.path.join(
                    a.rawdir, f"{name[:-len('.jsonl')]}.r{i}.err"))
                sig = f", signal {code - 128}" if code > 128 else ""
                # First: it is the cause, the others' errors follow from it.
                row.setdefault("errors", []).insert(
                    0, f"rank {i} (exit {code}{sig}): {why}")
                if row["status"] == "ok":
                    row["status"] = "error"
        rows.append(row)
    order = {c: i for i, c in enumerate(CONTENDERS)}
    rows.sort(key=lambda r: (MODELS.index(r["model"]), r["nodes"],
                             order.get(r["contender"], 99), r.get("repeat", 0)))
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "e2e.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")

    md = ["# OneBitAdam end to end on the emulated cluster", ""]
    if a.meta:
        md += [a.meta, ""]
    md += ["Steps/s over the compression stage (the steps after the warm-up) "
           "and over the whole run, from the slowest rank; median step time "
           "of the slowest rank, in brackets the median of its optimizer "
           "step alone (OneBitAdam's includes its communication; DDP's "
           "allreduces end inside backward); final loss = mean of the last "
           f"{FINAL_WINDOW} steps (all ranks), ± its standard error over "
           "those steps; tx = bytes sent by the node's ob0 during the loop "
           "(trainer and daemon), mean over nodes. Load = load average "
           "(1 min) before -> after the run, and the share of the "
           "machine's CPU time that was busy or stolen by the host "
           "during it.", "",
           "| model | nodes | contender | steps/s compress | steps/s whole "
           "| median ms compress (opt step) | median ms whole | final loss | tx MB/node "
           "| tx MB/step compress | load | status |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        load = (f"{r['load_before'].split()[0]} -> {r['load_after'].split()[0]}"
                if "load_before" in r and "load_after" in r else "")
        if "cpu_stolen_pct" in r:
            load += (f" ({r['cpu_busy_pct']} % busy, "
                     f"{r['cpu_stolen_pct']} % stolen)")
        status = r["status"]
        if r.get("errors"):
            status += ": " + "; ".join(e[:200] for e in r["errors"])[:600]\
                .replace("|", "/")
        if r.get("exit_codes") and any(c != 0 for c in r["exit_codes"]):
            status += f" (exit codes {r['exit_codes']})"
        fl = r.get("final_loss")
        md.append("| %s | %d | %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["nodes"], r["contender"],
            f" #{r['repeat']}" if r.get("repeat", 1) > 1 else "",
            fmt(r.get("steps_per_s_compress"), "%.3f"),
            fmt(r.get("steps_per_s_whole"), "%.3f"),
            fmt(r.get("median_ms_compress"), "%.0f") + (
                f" ({r['median_opt_ms_compress']:.0f})"
                if r.get("median_opt_ms_compress") else ""),
            fmt(r.get("median_ms_whole"), "%.0f"),
            "n/a" if fl is None else f"{fl:.3f} ± {r['final_loss_sem']:.3f}",
            fmt(r.get("tx_bytes_per_node") and r["tx_bytes_per_node"] / 1e6,
                "%.1f"),
            fmt(r.get("tx_bytes_per_step_compress") and
                r["tx_bytes_per_step_compress"] / 1e6, "%.2f"),
            load, status))

    md += ["", "Ratios within each model and node count (first repeat), "
           "and the issue's targets (reported, not asserted):", "",
           "| model | nodes | onebit / ddp-gloo whole (>= 2.5) "
           "| onebit / ddp-gloo compress | onebit compress / floor (>= 0.85) "
           "| floor / ddp-gloo whole (the most any optimizer could gain) "
           "| final loss onebit vs ddp-gloo |",
           "|---|---:|---:|---:|---:|---:|---|"]
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["nodes"]), {}).setdefault(
            r["contender"], r)
    for (model, nodes), g in sorted(groups.items(),
                                    key=lambda kv: (MODELS.index(kv[0][0]),
                                                    kv[0][1])):
        o, d, fl = g.get("onebit", {}), g.get("ddp-gloo", {}), g.get("floor", {})

        def ratio(x, y, target=None):
            if x is None or y is None:
                return "n/a"
            v = x / y
            if target is None:
                return f"{v:.3f}"
            return f"{v:.3f} ({'met' if v >= target else 'missed'})"

        lo, ld = o.get("final_loss"), d.get("final_loss")
        if lo is None or ld is None:
            loss = "n/a"
        else:
            # Within noise: |difference| <= 2 x the combined standard error.
            noise = 2 * math.hypot(o["final_loss_sem"], d["final_loss_sem"])
            loss = (f"{lo:.3f} vs {ld:.3f}: {lo - ld:+.3f} "
                    f"({'within' if abs(lo - ld) <= noise else 'outside'} "
                    f"2 x combined SE {noise:.3f})")
        md.append("| %s | %d | %s | %s | %s | %s | %s |" % (
            model, nodes,
            ratio(o.get("steps_per_s_whole"), d.get("steps_per_s_whole"), 2.5),
            ratio(o.get("steps_per_s_compress"),
                  d.get("steps_per_s_compress")),
            ratio(o.get("steps_per_s_compress"),
                  fl.get("steps_per_s_compress"), 0.85),
            ratio(fl.get("steps_per_s_whole"), d.get("steps_per_s_whole")),
            loss))
    if any(r["model"] == "transformer" for r in rows):
        md += ["", f"The transformer's task has entropy {chain_entropy():.3f} "
               "nats per token: no model can get a loss below it."]
    with open(os.path.join(a.outdir, "e2e.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one node's trainer")
    r.add_argument("--contender", choices=CONTENDERS, required=True)
    r.add_argument("--model", choices=MODELS, required=True)
    r.add_argument("--rank", type=int, required=True)
    r.add_argument("--world", type=int, required=True)
    r.add_argument("--master", required=True, help="ADDR:PORT of rank 0's "
                   "TCP store")
    r.add_argument("--steps", type=int, default=60)
    r.add_argument("--warmup-frac", type=float, default=0.15)
    r.add_argument("--batch", type=int, help="per node; default: mlp 8 "
                   "images, transformer 4 sequences")
    r.add_argument("--lr", type=float, help="default: mlp 1e-4, "
                   "transformer 1e-3")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--dev", default="ob0")
    r.add_argument("--job", default="torch-e2e", help="obcomm job name")
    r.add_argument("--onebit-args", default="",
                   help="more OneBitAdam keyword arguments, 'k=v,k=v'")
    r.add_argument("--powersgd-rank", type=int, default=2)
    r.add_argument("--bucket-cap-mb", type=float,
                   help="DDP's bucket_cap_mb, and its first bucket's cap "
                   "(default: DDP's, 25 and 1 MiB); larger than the model "
                   "makes one bucket")
    r.add_argument("--timeout", type=int, default=300,
                   help="Gloo's and the store's timeout, seconds")
    r.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p = sub.add_parser("report", help="merge raw lines into a table")
    p.add_argument("rawdir")
    p.add_argument("outdir")
    p.add_argument("--meta", default="")
    a = ap.parse_args()
    if a.cmd == "run":
        if a.steps < 1 or not 0 <= a.warmup_frac < 1:
            ap.error("--steps must be >= 1 and --warmup-frac in [0, 1)")
        if a.batch is None:
            a.batch = DEFAULT_BATCH[a.model]
        return run(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
