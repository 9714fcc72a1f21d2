"""torch.distributed.new_group of some ranks over obcomm is refused at once
on every rank: the "obcomm" process group serves only the whole world. torch
requires every rank to call new_group with the same ranks, so each rank
refuses alone, before any collective; members and non-members alike, none
is left waiting in torch's barrier. Another backend for the subgroup
(new_group(ranks, backend="gloo")) goes through."""

import functools
import inspect

import torch.distributed as dist


def _uses_obcomm(backend):
    if backend is None:
        try:
            backend = dist.get_backend()
        except (RuntimeError, ValueError):
            return False
    return str(backend).lower() == "obcomm"


def _check(ranks, backend):
    if ranks is None or not dist.is_initialized():
        return
    world = dist.get_world_size()
    ranks = list(ranks)
    if sorted(ranks) == list(range(world)) or not _uses_obcomm(backend):
        return
    shown = ranks if len(ranks) <= 8 else ranks[:8] + ["..."]
    raise ValueError(
        f"obcomm: new_group(ranks={shown}) of {len(ranks)} of the {world} "
        f"ranks: the \"obcomm\" backend serves only groups of the whole "
        f"world (every rank refuses this at once). Use the default group, "
        f"or give the subgroup another backend: "
        f"new_group(ranks, backend=\"gloo\")")


def _wrap(new_group):
    if getattr(new_group, "_obcomm_checked", False):
        return new_group
    sig = inspect.signature(new_group)

    @functools.wraps(new_group)
    def checked(*args, **kwargs):
        a = sig.bind_partial(*args, **kwargs).arguments
        _check(a.get("ranks"), a.get("backend"))
        return new_group(*args, **kwargs)

    checked._obcomm_checked = True
    return checked


def install():
    """Wraps torch.distributed.new_group (and distributed_c10d's, which
    new_subgroups calls) with the check. Idempotent."""
    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d
    c10d.new_group = _wrap(c10d.new_group)
    dist.new_group = _wrap(dist.new_group)
