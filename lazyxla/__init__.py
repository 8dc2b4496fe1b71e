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

import importlib

import torch

from lazyxla import compat as _compat
from lazyxla import (  # noqa: F401  (the public submodules, and lowering fills the rule table)
    debug,
    dynamo,  # the torch.compile backend "lazyxla" (registered when torch._dynamo loads)
    lowering,
    metrics,
    profiler,
    runtime,
    spmd,
)
from lazyxla.config import config
from lazyxla.device import devices as _devices
from lazyxla.frontend import generation as _generation
from lazyxla.frontend import kernels as _kernels
from lazyxla.frontend import trainer as _trainer
from lazyxla.frontend.export import Exported, ExportError, export
from lazyxla.frontend.jax_interop import call_jax, from_jax, jax_function, to_jax
from lazyxla.frontend.scan import StackedLayers, scan, scan_layers
from lazyxla.lazy import eager as _eager  # noqa: F401  (installs the eager-mode op handler when config.eager is set)
from lazyxla.lazy.barrier import optimization_barrier_
from lazyxla.lazy.graph import SyncReport, sync, wait_device_ops
from lazyxla.lazy.regions import CompileRegionError, compile
from lazyxla.parallel import checkpoint as _checkpoint  # noqa: F401  (DCP of global DTensors, with SPMD mode)
from lazyxla.parallel import dtensor as _dtensor  # noqa: F401  (installs itself when SPMD mode is turned on)
from lazyxla.parallel import process_group as _process_group
from lazyxla.parallel.buckets import Buckets
from lazyxla.parallel.collectives import (
    ReduceOp,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    collective_permute,
    reduce_scatter,
)
from lazyxla.parallel.data import DeviceLoader
from lazyxla.parallel.launch import SpawnError, spawn
from lazyxla.parallel.training import load, optimizer_step, reduce_gradients, save

__version__ = "0.1.0"

_kernels.install(_compat.device_name())  # "lazyxla", or "xla" for torch_xla's code (python -m lazyxla.run)
_process_group.register()
_generation.install()  # generate() on a lazyxla model replays its decode step (now, or when transformers loads)
_trainer.install()  # with config.capture: Trainer.training_step on a lazyxla model replays (when transformers loads)
# torch.compile'd functions call the collectives without a graph break (lazyxla's files are skipped by Dynamo)
dynamo.allow_in_graph(all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute, broadcast)


def device(index: int | None = None) -> torch.device:
    """The torch device for jax's ``index``-th local device (default 0).

    Example::

        dev = lazyxla.device()          # torch.device('lazyxla', 0) ('xla:0' under python -m lazyxla.run)
        model.to(dev)
    """
    i = 0 if index is None else int(index)
    _devices.jax_device(i)
    return _devices.torch_device(i)


def devices() -> list[torch.device]:
    """Every lazyxla device of this process, one per jax local device.

    Example::

        for d in lazyxla.devices(): print(d)
    """
    return [_devices.torch_device(i) for i in range(len(_devices.local_devices()))]


def mark_step(wait: bool = False) -> SyncReport:
    """torch_xla's name for :func:`sync`.

    Example::

        lazyxla.mark_step()
    """
    return sync(wait=wait, reason="mark_step()")


def eager_mode(enable: bool = True) -> None:
    """Turn eager mode on (or off): each op is computed as soon as it is recorded, for debugging; a failing op
    raises at its own line. ``lazyxla.compile`` regions and ``torch.compile``'d functions still run as one
    program. Same as ``lazyxla.config.eager = enable`` (``LAZYXLA_EAGER=1``; for a block:
    ``with lazyxla.config.override(eager=True):``).

    Example::

        lazyxla.eager_mode(True)
        y = x @ w                              # computed now
        with lazyxla.compile():                # one program, as in lazy mode
            loss = model(x).sum(); loss.backward()
    """
    config.eager = bool(enable)


def is_eager_mode() -> bool:
    """Whether eager mode is on (off inside ``lazyxla.compile`` regions).

    Example::

        if lazyxla.is_eager_mode(): print("each op runs at once")
    """
    return config.eager


def platform() -> str:
    """The jax platform behind the lazyxla device ('cpu', 'gpu' or 'tpu').

    Example::

        print(lazyxla.platform())
    """
    return _devices.platform()


_MOVED = ("autocast", "collectives", "data", "regions", "stablehlo")  # deprecated aliases of moved modules


def __getattr__(name: str):
    """``lazyxla.autocast`` & co. after a plain ``import lazyxla``, as before they moved: loaded on first use
    (a public-face lazy load: the alias modules warn once that they are deprecated)."""
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Buckets",
    "CompileRegionError",
    "DeviceLoader",
    "ExportError",
    "Exported",
    "ReduceOp",
    "SpawnError",
    "StackedLayers",
    "SyncReport",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "call_jax",
    "collective_permute",
    "compile",
    "config",
    "debug",
    "device",
    "devices",
    "eager_mode",
    "export",
    "from_jax",
    "is_eager_mode",
    "jax_function",
    "load",
    "mark_step",
    "metrics",
    "optimization_barrier_",
    "optimizer_step",
    "platform",
    "profiler",
    "reduce_gradients",
    "reduce_scatter",
    "runtime",
    "save",
    "scan",
    "scan_layers",
    "spmd",
    "spawn",
    "sync",
    "to_jax",
    "wait_device_ops",
]
