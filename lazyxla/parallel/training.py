"""Data-parallel training helpers: gradient averaging across replicas, and checkpoints.

``optimizer_step`` averages every gradient over the replicas (a few coalesced all-reduces, bucketed
by size, inside the step's program) and then steps the optimizer. ``save``/``load`` write and read
nested state (dicts, lists, tuples of tensors and plain values) with device tensors moved to the CPU,
atomically: a crash mid-save leaves the previous file as it was, and the next save of that file removes
the temporary file the killed writer left.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch

from lazyxla.device import processes
from lazyxla.device.devices import on_device
from lazyxla.lazy.graph import sync
from lazyxla.parallel.collectives import ReduceOp, all_reduce
from lazyxla.util import atomic_write, map_tensors, require_parent_folder

BUCKET_BYTES = 32 * 1024 * 1024  # gradients all-reduced together, per coalesced op


def _buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    by_dtype: dict[torch.dtype, list[list[torch.Tensor]]] = {}
    for t in tensors:
        groups = by_dtype.setdefault(t.dtype, [[]])
        size = sum(x.numel() * x.element_size() for x in groups[-1])
        if groups[-1] and size + t.numel() * t.element_size() > limit:
            groups.append([])
        groups[-1].append(t)
    return [b for groups in by_dtype.values() for b in groups if b]


def reduce_gradients(optimizer: torch.optim.Optimizer, groups=None, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Average the gradients of ``optimizer``'s parameters over the replicas, in place.

    One coalesced all-reduce per bucket of up to ``bucket_bytes`` (per dtype); nothing in a
    single-replica run.

    Example::

        loss.backward()
        lazyxla.reduce_gradients(opt)
        opt.step()
    """
    world = processes.world_size()
    if world == 1:
        return
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    count = len(groups[0]) if groups else world
    for bucket in _buckets(grads, bucket_bytes):
        all_reduce(ReduceOp.SUM, bucket, scale=1.0 / count, groups=groups)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    barrier: bool = False,
    optimizer_args: dict | None = None,
    groups=None,
) -> Any:
    """Average gradients across replicas, then ``optimizer.step(**optimizer_args)``; returns its result.

    ``barrier=True`` also syncs (ends the step), for loops that do not use ``DeviceLoader``.

    Example::

        loss.backward()
        lazyxla.optimizer_step(opt)
        opt.zero_grad()
    """
    reduce_gradients(optimizer, groups=groups)
    result = optimizer.step(**(optimizer_args or {}))
    if barrier:
        sync()
    return result


# --- checkpoints ------------------------------------------------------------------------------------


def _to_cpu(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.detach().cpu() if on_device(t) else t)


def save(obj: Any, path: str | os.PathLike, master_only: bool = True) -> None:
    """Save ``obj`` (e.g. a state dict with lazyxla tensors) to ``path`` with ``torch.save``, atomically.

    Device tensors are moved to the CPU first (one sync). With ``master_only`` (default) only the
    master replica writes; in a multi-replica run every replica waits until the file is written.

    Example::

        lazyxla.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, "ckpt.pt")
    """
    require_parent_folder(path, "lazyxla.save")  # before the sync and the copy to the host
    sync()
    cpu = _to_cpu(obj)
    if not master_only or processes.is_master():
        buffer = io.BytesIO()
        torch.save(cpu, buffer)
        atomic_write(path, buffer.getvalue())
    if processes.world_size() > 1:
        processes.rendezvous("lazyxla.save")


def load(path: str | os.PathLike, device: torch.device | str | None = None, **torch_load_args: Any) -> Any:
    """Load what :func:`save` wrote; tensors go to ``device`` if given (else stay on the CPU).

    ``torch_load_args`` pass on to ``torch.load`` (``weights_only`` is PyTorch's default there).

    Example::

        state = lazyxla.load("ckpt.pt", device=lazyxla.device())
        model.load_state_dict(state["model"])
    """
    obj = torch.load(path, map_location="cpu", **torch_load_args)
    return obj if device is None else map_tensors(obj, lambda t: t.to(torch.device(device)))
