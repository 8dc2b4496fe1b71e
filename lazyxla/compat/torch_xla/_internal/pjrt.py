"""``torch_xla._internal.pjrt``: starting replicas (torch_xla's ``xmp.spawn`` underneath) on lazyxla.

``spawn`` is ``xmp.spawn`` (``nprocs`` 1 or None, as torch_xla's); ``run_multiprocess(fn, *args)`` runs
``fn(*args)`` once per replica, always in new processes (as torch_xla's process pool), and returns
``{ordinal: result}``; ``initialize_singleprocess``/``initialize_multiprocess`` set torch_xla's process
variables (``PJRT_LOCAL_PROCESS_RANK``/``_COUNT``). One replica drives one device (one process per device):
where torch_xla's CPU runtime runs a thread per device in one process, lazyxla runs a process per device, each
seeing its device as ``xla:0``. ``spawn_threads`` runs ``fn`` in a thread of this process when it has one
device; with more it raises (lazyxla's replicas are processes: use ``spawn``).

Example::

    from torch_xla._internal import pjrt
    results = pjrt.run_multiprocess(lambda: xr.global_ordinal())   # {0: 0, 1: 1} with CPU_NUM_DEVICES=2
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import lazyxla
from lazyxla.compat._common import missing_attribute, unsupported
from lazyxla.compat.torch_xla import runtime
from lazyxla.compat.torch_xla.core import xla_env_vars as xenv
from lazyxla.compat.torch_xla.core import xla_model as xm
from lazyxla.compat.torch_xla.distributed import xla_multiprocessing as xmp


class _OrdinalFn:
    """Picklable ``fn(*args, **kwargs)`` that reports ``(ordinal, result)`` and ignores the replica index
    ``lazyxla.spawn`` passes first; the process's place on the host is set first, as torch_xla's
    ``initialize_multiprocess`` does in each of its pool's processes."""

    def __init__(self, fn: Callable, local_world_size: int, *args, **kwargs) -> None:
        self.fn, self.local_world_size, self.args, self.kwargs = fn, local_world_size, args, kwargs

    def __call__(self, index: int):
        initialize_multiprocess(index, self.local_world_size)
        return runtime.global_ordinal(), self.fn(*self.args, **self.kwargs)


class _SpawnFn:
    """Picklable wrapper of ``fn`` that passes the replica's global ordinal before ``args`` (torch_xla's)."""

    def __init__(self, fn: Callable, *args, **kwargs) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, *_index) -> None:
        self.fn(runtime.global_ordinal(), *self.args, **self.kwargs)


def spawn(fn: Callable, nprocs: int | None = None, start_method: str = "spawn", args: tuple = ()) -> None:
    """Run ``fn(ordinal, *args)`` in each replica: ``nprocs=1`` in this process, None on every device of the
    host (``xmp.spawn``'s count); other counts raise ``ValueError``, as torch_xla's. Returns None.

    Example::

        pjrt.spawn(_mp_fn, args=(flags,))
    """
    spawn_fn = _SpawnFn(fn, *args)
    if nprocs == 1:
        initialize_singleprocess()
        spawn_fn()
        return None
    if nprocs is not None:
        raise ValueError(
            f"Unsupported nprocs ({nprocs}). Please use nprocs=1 or None (default). If None, spawn will use all "
            "available devices. Use the environment variable X_NUM_DEVICES (where X is CPU, TPU, NEURONCORE, etc) "
            "to limit the number of devices used."
        )
    run_multiprocess(spawn_fn, start_method=start_method)
    return None


def run_multiprocess(fn: Callable, *args, start_method: str = "spawn", **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` once per replica (every device of the host, one new process each, also
    when there is one); returns ``{ordinal: result}``. ``fn`` and its arguments must pickle. A replica's
    exception is raised here (chained to the ``lazyxla.SpawnError`` that names the replica).

    Example::

        ordinals = pjrt.run_multiprocess(xr.global_ordinal)      # {0: 0, 1: 1} with CPU_NUM_DEVICES=2
    """
    nprocs, one_cpu_device = xmp.default_nprocs()
    try:
        results = lazyxla.spawn(
            _OrdinalFn(fn, nprocs, *args, **kwargs),
            nprocs=nprocs,
            start_method=xmp.replica_start_method(start_method),
            cpu_devices=1 if one_cpu_device else None,
        )
    except lazyxla.SpawnError as e:
        if e.exception is None:
            raise
        raise e.exception from e  # the replica's own exception, as torch_xla's process pool re-raises it
    merged = dict(results)
    if len(merged) != len(results):
        raise AssertionError(f"two replicas reported one ordinal: {[o for o, _ in results]}")
    return merged


def spawn_threads(fn: Callable, args: tuple = ()) -> None:
    """Run ``fn(ordinal, *args)`` in a thread per device of this process, as torch_xla: on lazyxla, where a
    process drives one device as a replica, that is one thread; a process with several devices raises
    (run the replicas as processes: :func:`spawn`).

    Example::

        pjrt.spawn_threads(_mp_fn, args=(flags,))
    """
    devices = xm.get_xla_supported_devices()
    if len(devices) != 1:
        unsupported(
            f"torch_xla._internal.pjrt.spawn_threads over {len(devices)} devices of one process (lazyxla's "
            "replicas are processes)",
            "torch_xla._internal.pjrt.spawn(fn, args=...) or xmp.spawn, one process per device",
        )
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_RANK, "0")
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_COUNT, "1")
    errors: list[BaseException] = []

    def _thread() -> None:
        try:
            _SpawnFn(fn, *args)()
        except BaseException as e:  # re-raised in the caller's thread, as concurrent.futures does
            errors.append(e)

    thread = threading.Thread(target=_thread, name="spawn_threads-0")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


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
