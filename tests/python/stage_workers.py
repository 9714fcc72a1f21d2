"""Trainers of test_stage.py: an optimizer's stage after each step, the
lines it logged on logger "obcomm", and the daemon's status of its keys."""

import json
import logging
import os
import subprocess

import torch

import cluster
import obcomm
import obcomm.torch
from workers import serve


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(),
                               torch.nn.Linear(4, 2))


def stages(args):
    """Trains args["opt"] ("adam", "lamb", "zoadam") with args["kw"] for
    args["steps"] steps; then state_dict() args["saves"] times, the
    daemon's status, and close()."""
    rank = int(os.environ["RANK"])
    lines = _Lines()
    log = logging.getLogger("obcomm")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    comm = obcomm.Communicator(timeout_ms=20000)
    model = _model()
    make = {"adam": obcomm.torch.OneBitAdam, "lamb": obcomm.torch.OneBitLamb,
            "zoadam": obcomm.torch.ZeroOneAdam}[args["opt"]]
    opt = make(model.parameters(), comm=comm, **args["kw"])
    out = {"stages": [opt.stage]}
    g = torch.Generator().manual_seed(rank)
    for _ in range(args["steps"]):
        opt.zero_grad()
        model(torch.randn(16, 8, generator=g)).square().sum().backward()
        opt.step()
        out["stages"].append(opt.stage)
    for _ in range(args.get("saves", 0)):
        opt.state_dict()
    comm.barrier()
    st = json.loads(subprocess.run(
        [cluster.OBCOMMCTL, "-s", os.environ["OBCOMM_SOCKET"], "--json",
         "status"], capture_output=True, check=True, timeout=10).stdout)
    out["keys"] = [k for j in st["jobs"] if j["name"] == comm.job
                   for k in j["keys"]]
    text = subprocess.run(
        [cluster.OBCOMMCTL, "-s", os.environ["OBCOMM_SOCKET"], "status"],
        capture_output=True, check=True, timeout=10).stdout.decode()
    out["text"] = [ln.strip() for ln in text.splitlines()
                   if ln.strip().startswith("key ")]
    comm.barrier()
    opt.close()
    comm.close()
    out["lines"] = lines.lines
    return out


if __name__ == "__main__":
    serve(globals())
