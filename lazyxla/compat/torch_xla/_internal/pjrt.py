"""``torch_xla._internal.pjrt``: starting replicas (torch_xla's ``xmp.spawn`` underneath) on lazyxla.

``spawn`` is ``xmp.spawn``; ``run_multiprocess(fn, *args)`` runs ``fn(*args)`` once per replica and returns
``{ordinal: result}``; ``initialize_singleprocess``/``initialize_multiprocess`` set torch_xla's process
variables (``PJRT_LOCAL_PROCESS_RANK``/``_COUNT``). One replica drives one device (one process per device).

Example::

    from torch_xla._internal import pjrt
    results = pjrt.run_multiprocess(lambda: xr.global_ordinal())   # {0: 0, 1: 1} with CPU_NUM_DEVICES=2
"""

from __future__ import annotations

import os
from collections.abc import Callable

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla import runtime
from lazyxla.compat.torch_xla.core import xla_env_vars as xenv
from lazyxla.compat.torch_xla.distributed import xla_multiprocessing as xmp


class _SpawnFn:
    """Picklable ``fn(*args, **kwargs)`` that ignores the replica index ``xmp.spawn`` passes first."""

    def __init__(self, fn: Callable, *args, **kwargs) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, index: int):
        return runtime.global_ordinal(), self.fn(*self.args, **self.kwargs)


def spawn(fn: Callable, nprocs: int | None = None, start_method: str = "spawn", args: tuple = ()):
    """Run ``fn(index, *args)`` in each replica (``xmp.spawn``).

    Example::

        pjrt.spawn(_mp_fn, args=(flags,))
    """
    return xmp.spawn(fn, args=tuple(args), nprocs=nprocs, start_method=start_method)


def run_multiprocess(fn: Callable, *args, start_method: str = "spawn", **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` once per replica (every device of the host); returns ``{ordinal: result}``.

    Example::

        ordinals = pjrt.run_multiprocess(xr.global_ordinal)
    """
    results = xmp.spawn(_SpawnFn(fn, *args, **kwargs), nprocs=None, start_method=start_method)
    pairs = results if isinstance(results, list) else [results]
    merged = dict(pairs)
    if len(merged) != len(pairs):
        raise AssertionError(f"two replicas reported one ordinal: {[o for o, _ in pairs]}")
    return merged


def initialize_singleprocess() -> None:
    """Mark this process as the host's only one (``PJRT_LOCAL_PROCESS_COUNT=1`` unless set).

    Example::

        pjrt.initialize_singleprocess()
    """
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_COUNT, "1")


def initialize_multiprocess(local_rank: int, local_world_size: int) -> None:
    """Record this process's place among the host's (``PJRT_LOCAL_PROCESS_RANK``/``_COUNT``, unless set).

    Example::

        pjrt.initialize_multiprocess(local_rank=0, local_world_size=2)
    """
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_RANK, str(local_rank))
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_COUNT, str(local_world_size))


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
