"""lazyxla: PyTorch on XLA devices through JAX.

Example::

    import torch, lazyxla
    dev = lazyxla.device()
    x = torch.randn(4, 4, device=dev)
    y = (x @ x).sum()
    lazyxla.sync()
    print(y.item())
"""

from __future__ import annotations

import torch

from lazyxla import (  # noqa: F401  (lowering fills the rule table)
    _core,
    debug,
    dynamo,  # noqa: F401  (the torch.compile backend "lazyxla")
    lowering,
    metrics,
    profiler,
    runtime,
    spmd,
)
from lazyxla.collectives import (
    ReduceOp,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    collective_permute,
    reduce_scatter,
)
from lazyxla.collectives import process_group as _process_group
from lazyxla.collectives.launch import SpawnError, spawn
from lazyxla.collectives.training import load, optimizer_step, reduce_gradients, save
from lazyxla.config import config
from lazyxla.data import DeviceLoader
from lazyxla.device import runtime as _runtime
from lazyxla.lazy.graph import SyncReport, sync, wait_device_ops
from lazyxla.regions import CompileRegionError, compile
from lazyxla.stablehlo import Exported, ExportError, export

__version__ = "0.1.0"

_core.install()
_process_group.register()


def device(index: int | None = None) -> torch.device:
    """The torch device for jax's ``index``-th local device (default 0).

    Example::

        dev = lazyxla.device()          # torch.device('lazyxla', 0)
        model.to(dev)
    """
    i = 0 if index is None else int(index)
    _runtime.jax_device(i)
    return torch.device("lazyxla", i)


def devices() -> list[torch.device]:
    """Every lazyxla device of this process, one per jax local device.

    Example::

        for d in lazyxla.devices(): print(d)
    """
    return [torch.device("lazyxla", i) for i in range(len(_runtime.local_devices()))]


def mark_step(wait: bool = False) -> SyncReport:
    """torch_xla's name for :func:`sync`.

    Example::

        lazyxla.mark_step()
    """
    return sync(wait=wait, reason="mark_step()")


def platform() -> str:
    """The jax platform behind the lazyxla device ('cpu', 'gpu' or 'tpu').

    Example::

        print(lazyxla.platform())
    """
    return _runtime.platform()


__all__ = [
    "CompileRegionError",
    "DeviceLoader",
    "ExportError",
    "Exported",
    "ReduceOp",
    "SpawnError",
    "SyncReport",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "collective_permute",
    "compile",
    "config",
    "debug",
    "device",
    "devices",
    "export",
    "load",
    "mark_step",
    "metrics",
    "optimizer_step",
    "platform",
    "profiler",
    "reduce_gradients",
    "reduce_scatter",
    "runtime",
    "save",
    "spmd",
    "spawn",
    "sync",
    "wait_device_ops",
]
