"""``torch_xla.distributed.xla_multiprocessing`` (``xmp``) on lazyxla: ``spawn`` one replica per process.

``xmp.spawn(fn, args)`` runs ``fn(index, *args)`` in each replica through ``lazyxla.spawn`` (fail fast:
a rank that raises or dies stops the others, and ``lazyxla.SpawnError`` names it).

How many processes ``nprocs=None`` (torch_xla's default, "every device of the host") starts: lazyxla
drives one device per process, so it reads torch_xla's device-count variables: ``CPU_NUM_DEVICES``,
``GPU_NUM_DEVICES`` or ``TPU_NUM_DEVICES`` (the one ``PJRT_DEVICE`` names, else the first one set);
without them it starts one replica. Each replica of a ``CPU_NUM_DEVICES`` run gets one CPU device.
Unlike torch_xla (which only accepts 1 or None), any positive ``nprocs`` is accepted. ``nprocs=1`` (or a
count of 1) calls ``fn(0, *args)`` in this process, as torch_xla does.

Example::

    import torch_xla.distributed.xla_multiprocessing as xmp

    def _mp_fn(index, flags):
        device = xm.xla_device()
        ...

    if __name__ == "__main__":
        xmp.spawn(_mp_fn, args=(flags,))        # CPU_NUM_DEVICES=2 python -m lazyxla.run train.py
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import lazyxla
from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.distributed import xla_backend  # noqa: F401  (see below)
from lazyxla.config import foreign_env

__all__ = ["MpModelWrapper", "MpSerialExecutor", "spawn"]

_COUNT_VARIABLES = {
    "CPU": "CPU_NUM_DEVICES",
    "CUDA": "GPU_NUM_DEVICES",
    "GPU": "GPU_NUM_DEVICES",
    "TPU": "TPU_NUM_DEVICES",
}


def default_nprocs() -> tuple[int, bool]:
    """How many replicas ``spawn(nprocs=None)`` starts, and whether the count came from ``CPU_NUM_DEVICES``.

    Example::

        n, on_cpu = default_nprocs()
    """
    device = foreign_env("PJRT_DEVICE").strip().upper().split("_")[0]
    names = [_COUNT_VARIABLES[device]] if device in _COUNT_VARIABLES else []
    names += [v for v in ("CPU_NUM_DEVICES", "GPU_NUM_DEVICES", "TPU_NUM_DEVICES") if v not in names]
    for name in names:
        value = foreign_env(name).strip()
        if value.isdigit() and int(value) > 0:
            return int(value), name == "CPU_NUM_DEVICES"
    return 1, False


def spawn(
    fn: Callable,
    args: tuple = (),
    nprocs: int | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> Any:
    """Run ``fn(index, *args)`` once per replica; returns the replicas' return values, in index order (one
    value, not a list, when it ran in this process). ``daemon`` is ignored (replicas never outlive the call).

    ``join=False`` returns ``None`` once every replica has finished, as torch_xla's PJRT runtime does (its
    ``spawn`` ignores ``join``, blocks, and returns ``None``): a caller that would join a process context
    itself, as Lightning's XLA launcher does (``if process_context is not None: ... join()``), finds the
    replicas done. A failed replica raises ``lazyxla.SpawnError`` either way.

    Example::

        if __name__ == "__main__":
            xmp.spawn(_mp_fn, args=(flags,), nprocs=None)
    """
    one_cpu_device = False
    if nprocs is None:
        nprocs, one_cpu_device = default_nprocs()
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"xmp.spawn: nprocs must be None or a positive int, got {nprocs!r}")
    if nprocs == 1:
        result = fn(0, *args)
    else:
        result = lazyxla.spawn(
            fn,
            args=tuple(args),
            nprocs=nprocs,
            start_method=replica_start_method(start_method),
            cpu_devices=1 if one_cpu_device else None,
        )
    # join=False: no process context to hand back (torch_xla's PJRT spawn returns None, having joined)
    return result if join else None


def replica_start_method(asked: str) -> str:
    """How replicas start: ``fork`` (Lightning's XLA launcher asks for it) becomes ``spawn``. This process runs
    JAX's threads (lazyxla imports and starts JAX); a forked child inherits their locks but not the threads and
    deadlocks (JAX warns so), where torch_xla forks before its runtime starts. ``fn`` and ``args`` must then
    pickle, as Lightning's launcher requires of them anyway.

    Example::

        replica_start_method("fork")   # -> "spawn"
        replica_start_method("spawn")  # -> "spawn"
    """
    return "spawn" if asked == "fork" else asked


class MpModelWrapper:
    """Holds a CPU model once and moves it to each replica's device on request.

    Example::

        WRAPPED = xmp.MpModelWrapper(Net())
        def _mp_fn(index):
            model = WRAPPED.to(xm.xla_device())
    """

    def __init__(self, model) -> None:
        self._model = model
        self._lock = threading.Lock()

    def to(self, device):
        with self._lock:
            self._model.to(device)
        return self._model


class MpSerialExecutor:
    """Runs functions one at a time within a process (``run(fn)``).

    Example::

        SERIAL_EXEC = xmp.MpSerialExecutor()
        dataset = SERIAL_EXEC.run(lambda: load_dataset(path))
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def run(self, fn: Callable):
        with self._lock:
            return fn()


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
