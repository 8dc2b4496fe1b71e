"""``torch_xla`` on lazyxla: ``device``, ``devices``, ``sync``, ``compile``, ``launch``, ``manual_seed``.

This package mirrors torch_xla's public surface (``torch_xla.core.xla_model``, ``torch_xla.runtime``,
``torch_xla.distributed.*``, ``torch_xla.debug.metrics``, ``torch_xla.amp``, ...) with each function
mapped onto lazyxla. ``lazyxla.compat.install()`` (or ``python -m lazyxla.run script.py``) makes
``import torch_xla`` resolve here when the real torch_xla is not installed. Under ``python -m lazyxla.run``
devices are ``torch.device('xla', i)``, as torch_xla's; where the layer is installed after ``import lazyxla`` they
keep lazyxla's name, ``torch.device('lazyxla', i)`` (see ``docs/migrating-from-torch_xla.md``).

Example::

    import torch, torch_xla
    dev = torch_xla.device()
    model = torch.nn.Linear(4, 2).to(dev)
    loss = model(torch.randn(8, 4, device=dev)).sum()
    loss.backward()
    torch_xla.sync()
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

import lazyxla
from lazyxla import compat as _compat
from lazyxla.compat._common import missing_attribute, platform_name, unsupported
from lazyxla.config import config, foreign_env
from lazyxla.observe import metrics

__version__ = _compat.distribution_version()
"""The torch_xla API level this layer follows (PJRT era), tagged with lazyxla's version."""

__lazyxla_compat__ = True


def device(index: int | None = None) -> torch.device:
    """The lazyxla device ``index`` (default: this replica's device, ``xla:0``); in SPMD mode the
    device that stands for every device.

    Example::

        dev = torch_xla.device()
    """
    return lazyxla.device(index)


def devices() -> list[torch.device]:
    """Every lazyxla device of this process.

    Example::

        print(torch_xla.devices())
    """
    return lazyxla.devices()


def real_devices() -> list[str]:
    """The hardware names of this process's devices, e.g. ``['CPU:0']``.

    Example::

        print(torch_xla.real_devices())
    """
    hw = platform_name()
    return [f"{hw}:{i}" for i in range(len(lazyxla.devices()))]


def device_count() -> int:
    """Devices this process can address.

    Example::

        print(torch_xla.device_count())
    """
    return len(lazyxla.devices())


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Run everything recorded so far (one compiled program per step), then the step closures;
    ``wait=True`` blocks until the device has finished. Same as ``xm.mark_step()``.

    Example::

        loss.backward(); opt.step(); torch_xla.sync()
    """
    xm.mark_step(wait=wait)


def _count_mark_step() -> None:
    metrics.inc("mark_steps")  # torch_xla's MarkStep counter (torch_xla.debug.metrics)


def _sync_after_error() -> None:
    """torch_xla runs what a failed region recorded; an error from that run is left to the next host read
    (the graph stays pending, see lazyxla's failure model) so that the region's exception is the one raised."""
    try:
        lazyxla.sync()
        xm._run_step_closures()
    except Exception:  # noqa: BLE001 - the region's own exception is already propagating
        pass


class _Region:
    """A ``lazyxla.compile`` region with torch_xla's step markers: entering it marks a step (the pending work
    runs), leaving it marks another, also when the block raised (then a failure of that last run does not hide
    the block's own exception); each runs the step closures and counts in ``MarkStep``."""

    def __init__(self, region: lazyxla.compile) -> None:
        self._region = region

    def __enter__(self) -> _Region:
        self._region.__enter__()  # syncs what is pending first
        _count_mark_step()
        xm._run_step_closures()
        return self

    def __exit__(self, kind, value, tb):
        try:
            return self._region.__exit__(kind, value, tb)  # syncs the region's work when the block succeeded
        finally:
            _count_mark_step()
            if kind is None:
                xm._run_step_closures()
            else:
                _sync_after_error()

    def __call__(self, fn: Callable) -> Callable:
        """``@torch_xla.compile()``: the region as a decorator; a captured step (``lazyxla.compile(fn,
        capture=True)``) when ``lazyxla.config.capture`` (``LAZYXLA_CAPTURE=1``) is on."""
        region = self._region
        if region.name is None:
            region.name = getattr(fn, "__qualname__", None) or str(fn)
        if config.capture:
            options = {"full_graph": region.full_graph, "max_different_graphs": region.max_graphs, "name": region.name}
            captured = lazyxla.compile(fn, capture=True, **options)

            @functools.wraps(fn)
            def run_captured(*args, **kwargs):
                with _step_markers():  # (a captured call syncs what is pending, and its own work, itself)
                    return captured(*args, **kwargs)

            run_captured.captured = captured  # its capture_status says whether calls replay
            return run_captured

        @functools.wraps(fn)
        def run(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return run


@contextlib.contextmanager
def _step_markers():
    """torch_xla's step markers of a region around a captured call: a step marked on entry and on exit (counted in
    ``MarkStep``, the step closures run; on an error, those of the work that ran)."""
    _count_mark_step()
    xm._run_step_closures()
    ok = False
    try:
        yield
        ok = True
    finally:
        _count_mark_step()
        if ok:
            xm._run_step_closures()
        else:
            _sync_after_error()


def compile(
    f: Callable | None = None,
    full_graph: bool | None = False,
    name: str | None = None,
    max_different_graphs: int | None = None,
):
    """Run ``f`` (or a ``with`` block) as one program: pending work is synced before, the region after
    (``lazyxla.compile``). ``full_graph=True``: anything inside that forces an execution raises at its
    line; ``max_different_graphs=N``: at most N distinct graphs over all calls.

    Example::

        @torch_xla.compile(full_graph=True)
        def step(x, y):
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
            return loss

        with torch_xla.compile():
            y = model(x)
    """
    if name is None and f is not None:
        name = getattr(f, "__name__", None) or str(f)
    region = _Region(lazyxla.compile(full_graph=bool(full_graph), max_different_graphs=max_different_graphs, name=name))
    return region if f is None else region(f)


def step():
    """A region that is one step (``torch_xla.compile()`` as a context manager).

    Example::

        with torch_xla.step():
            loss = loss_fn(model(x), y); loss.backward(); opt.step()
    """
    return compile()


def manual_seed(seed: int, device=None) -> None:
    """Seed the device's random number generator (``xm.set_rng_state``).

    Example::

        torch_xla.manual_seed(42)
    """
    xm.set_rng_state(seed, device)


def launch(fn: Callable, args: tuple = (), start_method: str = "spawn", debug_single_process: bool = False):
    """Run ``fn(index, *args)`` once per replica: under torchrun in this process (``index`` is the local
    rank), otherwise through ``xmp.spawn`` (one process per device; see its note on ``nprocs=None``).
    ``debug_single_process=True`` runs one replica in this process. Not available in SPMD mode.

    Example::

        if __name__ == "__main__":
            torch_xla.launch(_mp_fn, args=(flags,))
    """
    if lazyxla.spmd.is_enabled():
        unsupported("torch_xla.launch in SPMD mode", "a plain call: SPMD runs one process per host")
    if foreign_env("TORCHELASTIC_RUN_ID"):
        return fn(lazyxla.runtime.local_ordinal(), *args)
    return xmp.spawn(fn, args=args, nprocs=1 if debug_single_process else None, start_method=start_method)


from lazyxla.compat.torch_xla import _XLAC, experimental, runtime  # noqa: E402, F401  (_XLAC: torch_xla imports it too)
from lazyxla.compat.torch_xla.core import xla_model as xm  # noqa: E402
from lazyxla.compat.torch_xla.distributed import xla_multiprocessing as xmp  # noqa: E402
from lazyxla.compat.torch_xla.stablehlo import save_as_stablehlo, save_torch_model_as_stablehlo  # noqa: E402

# torch.compile'd functions call xm's collectives without a graph break (lazyxla's files are skipped by Dynamo)
lazyxla.dynamo.allow_in_graph(
    xm.all_reduce,
    xm.all_gather,
    xm.all_gather_bucketized,
    xm.reduce_scatter,
    xm.reduce_scatter_bucketized,
    xm.all_to_all,
    xm.collective_permute,
)

if foreign_env("XLA_USE_EAGER_DEBUG_MODE") == "1":  # torch_xla's switch for eager mode at import
    experimental.eager_mode(True)

__all__ = [
    "compile",
    "device",
    "device_count",
    "devices",
    "experimental",
    "launch",
    "manual_seed",
    "real_devices",
    "runtime",
    "save_as_stablehlo",
    "save_torch_model_as_stablehlo",
    "step",
    "sync",
]


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
