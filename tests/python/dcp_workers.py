"""Trainer processes of test_dcp.py: OneBitAdam, ZeroOneAdam and
OneBitLamb driven by an lr_scheduler, their state saved and loaded with
torch.distributed.checkpoint (DCP) over the backend "obcomm" together
with the model's. `dcp_workers.py FUNC ARGS.pickle OUT.pickle` runs
FUNC(args) with torchrun's environment (see backend_workers.py)."""

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_loader import \
    _load_state_dict_from_keys

import obcomm.torch
from workers import Net, digest, grads_of, serve

torch.set_num_threads(1)


def make(kind, model):
    ps = model.parameters()
    if kind == "onebit":
        return obcomm.torch.OneBitAdam(ps, lr=1e-3, freeze_step=4)
    if kind == "zeroone":
        return obcomm.torch.ZeroOneAdam(ps, lr=1e-3, var_freeze_step=4,
                                        var_update_scaler=2,
                                        local_step_scaler=3,
                                        local_step_clipper=2)
    return obcomm.torch.OneBitLamb(ps, lr=1e-2, freeze_step=4)


def train(model, opt, sched, rank, first, last):
    digests, lrs = [], []
    for step in range(first, last):
        opt.zero_grad()
        grads_of(model, rank, step).backward()
        opt.step()
        sched.step()
        digests.append(digest(model))
        lrs.append(opt.param_groups[0]["lr"])
    return digests, lrs


def for_dcp(model, opt, sched):
    """The state to save: the model's, the optimizer's and the
    scheduler's. DCP writes one copy of every value that is not a
    DTensor per key (it takes the ranks' values for replicas); the 1-bit
    snapshot's part, when the daemons keep no state_dir, is this node's
    alone, so it goes under a key of its node."""
    sd = {"model": model.state_dict(), "optim": opt.state_dict(),
          "sched": sched.state_dict()}
    info = sd["optim"]["obcomm"]
    if "part" in info:
        node = info.pop("node")
        sd[f"obcomm_part_node{node}"] = {"part": info.pop("part"),
                                         "node": node}
    return sd


def load(path, node):
    """The checkpoint as it was stored: the model's, the optimizer's (with
    this node's part back in place) and the scheduler's state dicts.
    dcp.load fills the structure its caller gives (and writes a
    non-tensor value under an integer key, as the optimizers' per-
    parameter state has, beside it under the key as a string), and the
    optimizers' state dicts change structure with the stage (ZeroOneAdam's
    sync_param once the variance is frozen), so the stored structure is
    read as it is."""
    part = f"obcomm_part_node{node}"
    sd = _load_state_dict_from_keys({"model", "optim", "sched", part},
                                    checkpoint_id=path)
    if part in sd:
        sd["optim"]["obcomm"].update(sd.pop(part))
    # DCP stores keys as strings; torch's optimizer state is keyed by the
    # parameters' indices.
    sd["optim"]["state"] = {int(k): v for k, v in sd["optim"]["state"].items()}
    return sd


def resume(args):
    """Trains `save_at` steps, saves with dcp.save, trains to `until`;
    then a new model and optimizer (other initial values) load the
    checkpoint with dcp.load and train the same steps again. Returns both
    runs' digests and learning rates after the save."""
    dist.init_process_group("obcomm")
    rank = dist.get_rank()
    kind, save_at, until = args["kind"], args["save_at"], args["until"]
    torch.manual_seed(rank)
    model = Net()
    opt = make(kind, model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    out = {"rank": rank}
    train(model, opt, sched, rank, 0, save_at)
    dcp.save(for_dcp(model, opt, sched), checkpoint_id=args["dir"])
    out["first"], out["first_lrs"] = train(model, opt, sched, rank, save_at,
                                           until)
    opt.close()

    torch.manual_seed(100 + rank)
    model = Net()
    opt = make(kind, model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    sd = load(args["dir"], opt.comm.rank // opt.comm.local_size)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    sched.load_state_dict(sd["sched"])
    out["second"], out["second_lrs"] = train(model, opt, sched, rank,
                                             save_at, until)
    opt.close()
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    serve(globals())
